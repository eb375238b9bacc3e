//! `redlock demo` (t85).

use nix::sys::signal::{Signal, kill};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

use crate::harness::*;

/// The redis-server ports a demo printed.
fn ports_in(stdout: &str) -> Vec<u16> {
    stdout
        .lines()
        .filter_map(|l| l.split("redis://127.0.0.1:").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

fn assert_closed(ports: &[u16]) {
    assert!(ports.len() >= 5, "{ports:?}");
    for &port in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "redis-server on {port} was stopped"
        );
    }
}

#[tokio::test]
async fn t85_demo_tells_the_story_to_the_end_and_cleans_up() {
    let mut cmd = bare();
    cmd.arg("demo");
    let out = finish_within(cmd.spawn().unwrap(), Instant::now(), DEMO_LIMIT).await;
    assert_eq!(out.code(), 0, "{out:?}");
    for needle in [
        "acquired  token 1,",
        "waiting",
        "killed node 3",
        "unreachable: connection refused",
        "freezing the holder",
        "after the freeze",
        "refused   stale fencing token",
        "two holders at once: never",
        "Cleaned up",
    ] {
        assert!(
            out.stdout.contains(needle),
            "{needle:?} in:\n{}",
            out.stdout
        );
    }
    assert!(
        out.took < DEMO_CONTRACT,
        "the demo finishes in under a minute: took {:?}:\n{}",
        out.took,
        out.stdout
    );
    assert_closed(&ports_in(&out.stdout));
}

#[tokio::test]
async fn t86_demo_interrupted_stops_its_servers() {
    let mut cmd = bare();
    cmd.arg("demo");
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let seen = read_until(&mut lines, "acquired").await;
    kill(pid_of(&child), Signal::SIGINT).unwrap();
    read_until(&mut lines, "Cleaned up").await;
    let out = finish_within(child, Instant::now(), DEMO_LIMIT).await;
    assert_eq!(out.code(), 128 + 2, "{out:?}");
    assert_closed(&ports_in(&seen));
}
