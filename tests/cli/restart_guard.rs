//! The restart guard from the command line (t80).

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t80_strict_guard_is_the_default_and_holds_out_fresh_nodes() {
    // Young nodes (their uptime is what is judged): never a reused cluster.
    let cluster = fresh_cluster(5);
    let mut cmd = bare();
    cmd.arg("--nodes").arg(cluster.urls().join(","));
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    // The round stops once a quorum is impossible (the third failure), but on a loaded machine
    // the other nodes' answers may already be in: at least three nodes are named.
    let named = line.matches("held out of quorums").count();
    assert!((3..=5).contains(&named), "{named} nodes named: {line}");
    // And what to do about it: wait, or trust nodes that cannot have held a lock.
    assert!(
        line.contains("wait it out (-w/--wait)") && line.contains("--restart-guard off"),
        "{line}"
    );
}

#[tokio::test]
async fn t81_strict_guard_admits_nodes_up_longer_than_the_max_ttl() {
    let cluster = cluster(5);
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "strict")
        .env("REDLOCK_NODES", cluster.urls().join(","));
    // Nodes count once they have been up for the max ttl (1 s here); --wait outlasts that.
    let out = output(run_sh(cmd, &["--ttl", "1s", "--wait", "10s"], "exit 0")).await;
    assert_eq!(out.code(), 0, "{out:?}");
}

#[tokio::test]
async fn t82_max_ttl_sets_how_long_fresh_nodes_are_held_out() {
    // Young nodes (their uptime is what is judged): never a reused cluster.
    let cluster = fresh_cluster(5);
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_RESTART_GUARD", "strict")
        .env("REDLOCK_MAX_TTL", "2m");
    let out = output(run_sh(cmd, &["--ttl", "1s"], "exit 0")).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    // Held out for about two minutes (the max ttl), not one second (the run's ttl).
    let (_, rest) = line
        .split_once("held out of quorums for ")
        .unwrap_or_else(|| panic!("{line}"));
    let secs: f64 = rest
        .split_once('s')
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("seconds: {line}"));
    assert!((100.0..=120.0).contains(&secs), "{secs} s: {line}");
}
