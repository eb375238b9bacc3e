//! The testkit's reaper does what the reused clusters of `tests/support/pool.rs` rely on: the
//! servers of a cluster kept where no destructor runs die with the process, even when the
//! process is SIGKILLed, and their directories are removed.
//!
//! The process is this very test binary, re-run with `--exact t00_reaper_child` and
//! `QUORUMLOCK_REAPER_CHILD` set: it starts a one-server cluster, arms its reaper, leaks both,
//! prints the server's pid, port and directory, and waits to be killed.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use quorumlock::testkit::LocalCluster;

use crate::support::{WAIT, wait_until};

const ENV: &str = "QUORUMLOCK_REAPER_CHILD";
const ENTRY: &str = "t00_reaper_child";

/// The child's body (see the module's text); a no-op unless [`ENV`] is set.
pub fn child_main() {
    if std::env::var_os(ENV).is_none() {
        return;
    }
    let cluster = LocalCluster::start(1).unwrap_or_else(|e| panic!("{e}"));
    let reaper = cluster.reap_at_exit().unwrap_or_else(|e| panic!("{e}"));
    let server = cluster.get(0).expect("one server");
    println!(
        "SERVER {} {} {}",
        server.pid().expect("running"),
        server.port(),
        server.dir().display()
    );
    // Neither destructor will run: only the reaper can stop the server now.
    std::mem::forget(reaper);
    std::mem::forget(cluster);
    // Killed by the test long before this ends; bounded so that nothing outlives a failed test.
    std::thread::sleep(WAIT * 3);
}

/// Whether process `pid` is still a live `redis-server` (a zombie left to a parent that does
/// not reap it is not live).
fn live_redis(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let (name, rest) = stat
        .split_once(") ")
        .map(|(head, rest)| (head.rsplit('(').next().unwrap_or(""), rest))
        .unwrap_or(("", ""));
    name == "redis-server" && !rest.starts_with('Z')
}

#[tokio::test]
async fn sigkilled_process_leaves_no_server_and_no_directory() {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([ENTRY, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("piped");
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("SERVER "))
    });
    let line = tokio::time::timeout(WAIT, line)
        .await
        .expect("the child reports its server within the wait")
        .expect("reader")
        .expect("a SERVER line");
    let mut fields = line.split(' ').skip(1);
    let pid: u32 = fields.next().and_then(|p| p.parse().ok()).expect("pid");
    let port: u16 = fields.next().and_then(|p| p.parse().ok()).expect("port");
    let dir = PathBuf::from(fields.collect::<Vec<_>>().join(" "));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    assert!(live_redis(pid), "the child's server runs");
    assert!(dir.is_dir(), "its directory exists: {}", dir.display());

    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");

    wait_until(WAIT, "the server is gone and its directory removed", || {
        let gone = !live_redis(pid)
            && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
            && !dir.exists();
        async move { gone }
    })
    .await;
}
