//! `redlock run` and signals: forwarded to CMD's group, or ending a wait (t60).

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use tokio::time::Instant;

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t60_sigterm_is_forwarded_and_the_lock_released_after_cmd_exits() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, got, go) = (file(&dir, "pid"), file(&dir, "got"), file(&dir, "go"));
    let script = format!(
        "trap 'echo TERM > {got}; {wait_go}; exit 3' TERM; \
         echo $$ > {pid}; for i in {STEPS}; do sleep 0.05; done",
        got = path_str(&got),
        wait_go = wait_for_file(&go),
        pid = path_str(&pidfile),
    );
    let child = run_sh(redlock(&cluster), &[], &script).spawn().unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    kill(pid_of(&child), Signal::SIGTERM).unwrap();

    assert_eq!(line_in(&got).await, "TERM", "CMD saw the signal");
    assert!(
        holders(&urls, KEY) >= 3,
        "the lock is held while CMD shuts down"
    );
    std::fs::write(&go, "").unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 3, "redlock exits with CMD's code: {out:?}");
    assert_eq!(holders(&urls, KEY), 0, "released after CMD exited");
}

#[tokio::test]
async fn t61_sigint_is_forwarded_too_and_the_lock_released() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!("echo $$ > {}; exec sleep 60", path_str(&pidfile));
    let child = run_sh(redlock(&cluster), &[], &script).spawn().unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    assert!(holders(&urls, KEY) >= 3, "held while CMD runs");
    kill(pid_of(&child), Signal::SIGINT).unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 128 + 2, "CMD died of SIGINT: {out:?}");
    assert!(!is_alive(cmd_pid));
    assert_eq!(holders(&urls, KEY), 0, "released after CMD exited");
}

#[tokio::test]
async fn t62_sigterm_while_waiting_gives_up_and_leaves_no_keys() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    for url in &urls[..3] {
        set_foreign(url, KEY, "someone-else", Duration::from_secs(30));
    }
    let dir = scratch();
    let marker = file(&dir, "ran");
    let mut cmd = run_sh(
        redlock(&cluster),
        &["--wait", "30s"],
        &format!("touch {}", path_str(&marker)),
    );
    // Coupled to the library's debug line for a retried round (src/redlock.rs,
    // `acquire_with`): the signal must arrive while redlock is waiting.
    cmd.env("REDLOCK_LOG", "quorumlock=debug");
    let mut child = cmd.spawn().unwrap();
    stderr_until(&mut child, RETRYING).await;
    let signalled = Instant::now();
    kill(pid_of(&child), Signal::SIGTERM).unwrap();
    let out = finish(child, signalled).await;
    assert_eq!(out.code(), 128 + 15, "{out:?}");
    assert!(
        out.took < Duration::from_secs(15),
        "gave up at once (not at the end of its 30 s wait): {out:?}"
    );
    assert!(!marker.exists(), "CMD never ran");
    for url in &urls[3..] {
        assert_eq!(value_on(url, KEY), None, "{url}");
    }
}

#[tokio::test]
async fn t63_forwarded_signals_reach_cmds_whole_process_group() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let forking = Forking::new("sleep 300 >/dev/null 2>&1");
    let child = run_sh(redlock(&cluster), &[], &forking.script)
        .spawn()
        .unwrap();
    let (_, grandchild, _guards) = forking.guarded_pids().await;
    kill(pid_of(&child), Signal::SIGTERM).unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 128 + 15, "CMD died of SIGTERM: {out:?}");
    assert_eq!(holders(&urls, KEY), 0, "released after CMD exited");
    // It may linger as a zombie under an init that does not reap orphans.
    wait_until(WAIT, "the grandchild got SIGTERM too", || async {
        !is_running(grandchild)
    })
    .await;
}
