//! `redlock run` when the lock is lost while CMD runs: 79, CMD and its group terminated (t50).

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::getpgid;
use tokio::time::Instant;

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t50_paused_past_its_ttl_exits_79_after_terminating_cmd() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!("echo $$ > {}; exec sleep 60", path_str(&pidfile));
    // A SIGKILL would come 30 s after the SIGTERM: the bound below tells the two apart.
    let child = run_sh(
        redlock(&cluster),
        &["--ttl", "2s", "--kill-after", "30s"],
        &script,
    )
    .spawn()
    .unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    let redlock_pid = pid_of(&child);

    stop_past_its_ttl(redlock_pid, &urls).await;
    let other = client(&cluster);
    let taken = other
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .expect("another client takes the expired lock");
    let held_before = holders(&urls, KEY);
    let resumed = Instant::now();
    kill(redlock_pid, Signal::SIGCONT).unwrap();
    let out = finish(child, resumed).await;

    let line = out.lost_line();
    assert!(
        line.contains("was lost") && line.contains("SIGTERM"),
        "{line}"
    );
    assert!(!is_alive(cmd_pid), "CMD was terminated");
    assert!(
        out.took < Duration::from_secs(15),
        "SIGTERM was enough, no --kill-after wait: {:?}",
        out.took
    );
    // The new owner's lock was not touched by the old holder's cleanup: its value is still on
    // every node that had it, and it extends and releases as the owner.
    let held_after = holders(&urls, KEY);
    assert!(
        held_after >= held_before.max(3),
        "{held_before} nodes held the new owner's value, {held_after} after redlock exited"
    );
    taken
        .extend(Duration::from_secs(30))
        .await
        .expect("still ours");
    taken.release().await.expect("still ours");
}

#[tokio::test]
async fn t52_cmd_that_finished_while_redlock_was_stopped_past_its_ttl_still_exits_79() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, go, done) = (file(&dir, "pid"), file(&dir, "go"), file(&dir, "done"));
    // CMD finishes only once told to, after redlock has been stopped past its ttl.
    let script = format!(
        "echo $$ > {}; {}; echo done > {}",
        path_str(&pidfile),
        wait_for_file(&go),
        path_str(&done)
    );
    let child = run_sh(redlock(&cluster), &["--ttl", "2s"], &script)
        .spawn()
        .unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    let redlock_pid = pid_of(&child);
    stop_past_its_ttl(redlock_pid, &urls).await;
    std::fs::write(&go, "").unwrap();
    line_in(&done).await;
    kill(redlock_pid, Signal::SIGCONT).unwrap();
    let out = finish(child, Instant::now()).await;
    // CMD's 0 would claim it ran to its end under the lock; it did not.
    assert_eq!(out.code(), 79, "{out:?}");
    assert!(
        out.one_line_error().contains("CMD had already exited (0)"),
        "{out:?}"
    );
}

#[tokio::test]
async fn t51_cmd_ignoring_sigterm_is_killed_after_kill_after() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; for i in {STEPS}; do sleep 0.05; done",
        path_str(&pidfile)
    );
    // Another owner overwrites the key everywhere: the next extension finds it is not ours.
    let (out, cmd_pid, _guard) = lost_while_running(
        run_sh(
            redlock(&cluster),
            &["--ttl", "3s", "--kill-after", "1500ms"],
            &script,
        ),
        &pidfile,
        &urls,
    )
    .await;
    let line = out.lost_line();
    assert!(
        line.contains("was lost") && line.contains("killed after 1s 500ms"),
        "{line}"
    );
    assert!(out.took >= Duration::from_millis(1500), "{:?}", out.took);
    assert!(!is_alive(cmd_pid), "CMD was killed");
    for url in &urls {
        assert_eq!(value_on(url, KEY).as_deref(), Some("usurper"), "left alone");
    }
}

#[tokio::test]
async fn t53_cmd_outliving_the_ttl_keeps_the_lock_and_exits_with_its_code() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, token, mid) = (file(&dir, "pid"), file(&dir, "token"), file(&dir, "mid"));
    // Runs past two ttls; once past the first, another client tries to take the lock.
    let script = format!(
        "echo $$ > {}; echo $REDLOCK_TOKEN > {}; sleep 2; echo > {}; sleep 2; exit 6",
        path_str(&pidfile),
        path_str(&token),
        path_str(&mid)
    );
    let child = run_sh(redlock(&cluster), &["--ttl", "1500ms"], &script)
        .spawn()
        .unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    let ours: u64 = line_in(&token).await.parse().unwrap();
    let other = client(&cluster);
    // Past the first ttl: only extensions can have kept the lock.
    line_in(&mid).await;
    let err = other
        .try_acquire(KEY, Duration::from_secs(10))
        .await
        .expect_err("still held by redlock");
    assert!(err.is_held(), "{err}");
    let out = finish(child, Instant::now()).await;
    assert_eq!(
        out.code(),
        6,
        "CMD's own code: keep-alive held the lock: {out:?}"
    );
    assert_eq!(out.stderr, "", "{out:?}");
    assert_eq!(holders(&urls, KEY), 0, "released");
    let next = other
        .try_acquire(KEY, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(next.token().get() > ours);
    next.release().await.unwrap();
}

#[tokio::test]
async fn t56_on_loss_cmds_whole_process_group_is_terminated() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let forking = Forking::new("sleep 300 >/dev/null 2>&1");
    // A SIGKILL would come 30 s after the SIGTERM: the bound below tells the two apart.
    let child = run_sh(
        redlock(&cluster),
        &["--ttl", "3s", "--kill-after", "30s"],
        &forking.script,
    )
    .spawn()
    .unwrap();
    let (cmd_pid, grandchild, _guards) = forking.guarded_pids().await;
    assert_eq!(
        getpgid(Some(cmd_pid)),
        Ok(cmd_pid),
        "CMD leads its own group"
    );
    assert_eq!(getpgid(Some(grandchild)), Ok(cmd_pid), "in CMD's group");

    let taken = usurp(&urls);
    let out = finish(child, taken).await;
    let line = out.lost_line();
    assert!(
        line.contains("was lost: a quorum no longer holds our value")
            && line.contains("CMD's process group was sent SIGTERM"),
        "{line}"
    );
    // redlock waited for the whole group (and reaped what was left to it).
    assert!(is_gone(cmd_pid), "CMD is gone");
    assert!(is_gone(grandchild), "the grandchild is gone too");
    assert!(
        out.took < Duration::from_secs(15),
        "SIGTERM was enough: {:?}",
        out.took
    );
}

#[tokio::test]
async fn t57_on_loss_a_grandchild_ignoring_sigterm_is_killed_after_kill_after() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    // CMD itself exits on SIGTERM; its child ignores it (an ignored signal stays ignored
    // across exec).
    let forking = Forking::new("(trap '' TERM; exec sleep 300 >/dev/null 2>&1)");
    let child = run_sh(
        redlock(&cluster),
        &["--ttl", "3s", "--kill-after", "1500ms"],
        &forking.script,
    )
    .spawn()
    .unwrap();
    let (cmd_pid, grandchild, _guards) = forking.guarded_pids().await;

    let taken = usurp(&urls);
    let out = finish(child, taken).await;
    let line = out.lost_line();
    assert!(
        line.contains("CMD exited (143)")
            && line.contains("the rest of the group ignored SIGTERM and was killed after 1s 500ms"),
        "{line}"
    );
    assert!(out.took >= Duration::from_millis(1500), "{:?}", out.took);
    assert!(is_gone(cmd_pid), "CMD is gone");
    assert!(is_gone(grandchild), "the grandchild was killed and reaped");
}

#[tokio::test]
async fn t58_foreground_keeps_cmd_in_redlocks_group_and_signals_cmd_alone() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    // The grandchild, which outlives redlock here, must not hold its output pipes open.
    let forking = Forking::new("sleep 300 >/dev/null 2>&1");
    let mut cmd = run_sh(
        redlock(&cluster),
        &["--ttl", "3s", "--foreground"],
        &forking.script,
    );
    // redlock leads a group of its own here, so that CMD's group is not this test's.
    cmd.process_group(0);
    let child = cmd.spawn().unwrap();
    let redlock_pid = pid_of(&child);
    let _guard = KillGroup(redlock_pid);
    let (cmd_pid, grandchild) = forking.pids().await;
    let _grandchild_guard = KillProcess(grandchild);
    assert_eq!(
        getpgid(Some(cmd_pid)),
        Ok(redlock_pid),
        "CMD in redlock's group"
    );

    let taken = usurp(&urls);
    let out = finish(child, taken).await;
    let line = out.lost_line();
    assert!(
        line.contains("CMD was sent SIGTERM and exited (143)"),
        "{line}"
    );
    assert!(!is_running(cmd_pid), "CMD was terminated");
    // The documented cost of --foreground: what CMD started is not signalled.
    assert!(is_running(grandchild), "only CMD itself was signalled");
}
