//! `redlock run` with nodes killed and hung, before and while CMD runs (t30).

use std::time::Duration;

use tokio::time::Instant;

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t30_three_of_five_killed_exits_69_naming_each_failed_node() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    for i in [0, 2, 4] {
        cluster.kill(i).unwrap();
    }
    let dir = scratch();
    let marker = file(&dir, "ran");
    let out = output(run_sh(
        redlock(&cluster),
        &[],
        &format!("touch {}", path_str(&marker)),
    ))
    .await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    assert!(line.contains("too few nodes reachable"), "{line}");
    for i in [0, 2, 4] {
        assert!(
            line.contains(&format!("{}: connection refused", urls[i])),
            "names node {i} and why: {line}"
        );
    }
    assert!(!marker.exists(), "CMD must not run");
    assert_eq!(holders(&[urls[1].clone(), urls[3].clone()], KEY), 0);
}

#[tokio::test]
async fn t31_two_of_five_killed_still_runs_cmd() {
    let mut cluster = cluster(5);
    cluster.kill(1).unwrap();
    cluster.kill(3).unwrap();
    let out = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(out.code(), 0, "{out:?}");
}

#[tokio::test]
async fn t32_two_of_five_hung_still_runs_cmd_and_exits_promptly() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    cluster.pause(0).unwrap();
    cluster.pause(3).unwrap();
    let out = output(run_sh(redlock(&cluster), &[], "exit 5")).await;
    assert_eq!(out.code(), 5, "{out:?}");
    // Hung before the run, the nodes are never reached: the exit waits for neither (t36), let
    // alone for the ttl (30 s).
    assert!(out.took < Duration::from_secs(10), "took {:?}", out.took);
    let live = [urls[1].clone(), urls[2].clone(), urls[4].clone()];
    assert_eq!(holders(&live, KEY), 0, "released on the live nodes");
    cluster.resume(0).unwrap();
    cluster.resume(3).unwrap();
}

#[tokio::test]
async fn t33_three_of_five_hung_exits_69_naming_the_timeouts() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    for i in 0..3 {
        cluster.pause(i).unwrap();
    }
    let out = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    for url in &urls[..3] {
        assert!(
            line.contains(&format!("{url}: timed out")),
            "names {url} and why: {line}"
        );
    }
    for i in 0..3 {
        cluster.resume(i).unwrap();
    }
}

#[tokio::test]
async fn t34_two_of_five_killed_or_hung_while_cmd_runs_cmd_finishes_under_the_lock() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, go) = (file(&dir, "pid"), file(&dir, "go"));
    // CMD outlives two ttls after the nodes fail: the lock must be extended on the other three.
    let script = format!(
        "echo $$ > {}; {}; sleep 3.5; exit 6",
        path_str(&pidfile),
        wait_for_file(&go)
    );
    let child = run_sh(redlock(&cluster), &["--ttl", "1500ms"], &script)
        .spawn()
        .unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    cluster.kill(0).unwrap();
    cluster.pause(1).unwrap();
    std::fs::write(&go, "").unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 6, "CMD's own code: {out:?}");
    assert_eq!(out.stderr, "", "{out:?}");
    assert!(out.took >= Duration::from_millis(3500), "{:?}", out.took);
    assert_eq!(holders(&urls[2..], KEY), 0, "released on the live nodes");
    cluster.resume(1).unwrap();
}

#[tokio::test]
async fn t35_three_of_five_hung_while_cmd_runs_exits_79_once_validity_runs_out() {
    let mut cluster = cluster(5);
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!("echo $$ > {}; exec sleep 60", path_str(&pidfile));
    let ttl = Duration::from_secs(3);
    let child = run_sh(redlock(&cluster), &["--ttl", "3s"], &script)
        .spawn()
        .unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    let paused = Instant::now();
    for i in 0..3 {
        cluster.pause(i).unwrap();
    }
    let out = finish(child, paused).await;
    let line = out.lost_line();
    assert!(
        line.contains("was lost") && line.contains("SIGTERM"),
        "{line}"
    );
    assert!(!is_alive(cmd_pid), "CMD was terminated");
    // Not before the validity left at the pause (at least ttl*2/3, less a round and the
    // drift), and not long after the whole ttl (generous: a loaded machine).
    assert!(
        out.took >= Duration::from_secs(1),
        "lost too early: {:?}",
        out.took
    );
    assert!(
        out.took < ttl + Duration::from_secs(6),
        "lost too late: {:?}",
        out.took
    );
    for i in 0..3 {
        cluster.resume(i).unwrap();
    }
}

/// One node SIGSTOPped before `redlock run` starts: its connection is never made, so the
/// acquisition's call there is never sent, and the exit must not wait for that node (it waited
/// for the connect to give up, 1 s, then for the node again: every run in a loop paid it). The
/// node timeout is 5 s, so that waiting for the node is unmistakable.
#[tokio::test]
async fn t36_one_node_hung_before_the_run_does_not_delay_its_exit() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    cluster.pause(2).unwrap();
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_NODE_TIMEOUT", "5s")
        .args(["run", KEY, "--", "true"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    // Well under the connect timeout (1 s) that it waited for, on a loaded machine.
    assert!(
        out.took < Duration::from_millis(700),
        "exited {:?} after exec",
        out.took
    );
    let live = [&urls[..2], &urls[3..]].concat();
    assert_eq!(holders(&live, KEY), 0, "released on the live nodes");
    cluster.resume(2).unwrap();
    assert_eq!(value_on(&urls[2], KEY), None, "never set on the hung node");
}
