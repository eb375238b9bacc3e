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

/// The fencing tokens `redlock demo` prints rise by about one per holder (issue 27: a fresh
/// clone printed `1 < 3467 < 3481 < ...`, its two waiters spinning through thousands of refused
/// rounds, each of which raised the counters).
///
/// Bound: a refused round raises a node's counter only in the pipelined form, which a client
/// uses until it has waited for the key once; each worker's first wait costs at most two such
/// rounds (its `try_acquire` and `acquire_timeout`'s first round). From then on a round raises
/// a counter only where it sets the key: once per acquisition, plus once per split vote (two
/// waiters woken by one release that each set the key on some nodes; each split is undone and
/// re-tried after a random pause, so a second split at one handover already needs two losing
/// draws in a row). So the last token is at most the first + 2 per worker + 4 per acquisition,
/// three split votes at every handover; the demo printed 11 above the first in runs on this
/// machine, and thousands before.
#[tokio::test]
async fn t87_demo_tokens_rise_by_about_one_per_holder() {
    let mut cmd = bare();
    cmd.arg("demo");
    let out = finish_within(cmd.spawn().unwrap(), Instant::now(), DEMO_LIMIT).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("fencing tokens"))
        .unwrap_or_else(|| panic!("a token summary in:\n{}", out.stdout));
    let tokens: Vec<u64> = line
        .split("fencing tokens ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .map(|list| {
            list.split(" < ")
                .filter_map(|t| t.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(tokens.len() >= 3, "{line}");
    let (first, last) = (tokens[0], tokens[tokens.len() - 1]);
    // The demo's default: three workers.
    let bound = first + 2 * 3 + 4 * tokens.len() as u64;
    assert!(
        last <= bound,
        "tokens rose from {first} to {last} over {} acquisitions (at most {bound}): {line}",
        tokens.len()
    );
}
