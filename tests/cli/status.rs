//! `redlock status` (t70).

use std::time::Duration;

use quorumlock::testkit::LocalCluster;

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t70_status_shows_each_node_and_exits_0_with_a_quorum() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();

    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let free = output(cmd).await;
    assert_eq!(free.code(), 0, "{free:?}");
    assert!(free.stdout.contains("free"), "{free:?}");

    // What another owner leaves on the nodes: its value on 3 of them, a fencing counter on all.
    let value = "0123456789abcdef0123456789abcdef";
    for url in &urls[..3] {
        set_foreign(url, KEY, value, Duration::from_secs(30));
    }
    for url in &urls {
        set_fence(url, KEY, 7);
    }
    cluster.kill(4).unwrap();

    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.stderr, "");
    assert!(
        out.stdout.contains(&format!(
            "held by {value} on 3 of 5 nodes (quorum 3, 4 answered); highest fencing counter 7"
        )),
        "{}",
        out.stdout
    );
    let line_of = |url: &str| {
        out.stdout
            .lines()
            .find(|l| l.contains(url))
            .unwrap_or_else(|| panic!("a line for {url}: {}", out.stdout))
            .to_owned()
    };
    for url in &urls[..3] {
        let line = line_of(url);
        assert!(line.contains(&format!("held by {value}  ttl")), "{line}");
        assert!(line.ends_with("fence 7"), "{line}");
    }
    let line = line_of(&urls[3]);
    assert!(line.contains("free") && line.ends_with("fence 7"), "{line}");
    assert!(
        out.stdout
            .contains(&format!("{}  unreachable: connection refused", urls[4])),
        "{}",
        out.stdout
    );

    cluster.kill(0).unwrap();
    cluster.kill(1).unwrap();
    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    for i in [0, 1, 4] {
        assert!(line.contains(urls[i].as_str()), "{line}");
    }
}

/// A node whose memory policy can evict lock keys gets an `eviction:` line under its own.
#[tokio::test]
async fn t71_status_names_nodes_that_can_evict_lock_keys() {
    init_tracing();
    let cluster = LocalCluster::start_with(
        3,
        &quorumlock::testkit::ServerOptions::new().maxmemory(64 << 20, "allkeys-lru"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let lines = out
        .stdout
        .lines()
        .filter(|l| {
            l.contains("eviction: maxmemory-policy allkeys-lru")
                && l.contains("lock keys and fencing counters can be evicted")
        })
        .count();
    assert_eq!(lines, 3, "{}", out.stdout);
}
