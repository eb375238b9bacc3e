//! `redlock run` when another owner holds the lock: 75, `--wait` (t40).

use std::time::Duration;

use tokio::time::Instant;

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t40_held_by_another_owner_exits_75_without_running_cmd() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let held = held_elsewhere(&cluster).await;
    let (_dir, marker, script) = marker_cmd();

    let out = output(run_sh(redlock(&cluster), &[], &script)).await;
    assert_eq!(out.code(), 75, "{out:?}");
    assert!(
        out.one_line_error().contains("held by another owner"),
        "{out:?}"
    );

    let out = output(run_sh(redlock(&cluster), &["--wait", "700ms"], &script)).await;
    assert_eq!(out.code(), 75, "{out:?}");
    // It stops when the next round would start after --wait (pauses are up to 150 ms).
    assert!(
        out.took >= Duration::from_millis(550),
        "kept trying for --wait: {out:?}"
    );
    assert!(!marker.exists(), "CMD must not run");

    assert!(!held.is_lost());
    assert!(holders(&urls, KEY) >= 3);
    held.release()
        .await
        .expect("the other owner's lock was left alone");
}

#[tokio::test]
async fn t41_wait_takes_the_lock_once_the_holder_releases() {
    let cluster = cluster(5);
    let held = held_elsewhere(&cluster).await;
    let mut cmd = run_sh(
        redlock(&cluster),
        &["--wait", "20s"],
        r#"echo "$REDLOCK_TOKEN""#,
    );
    // Coupled to the library's debug line for a retried round (src/redlock.rs,
    // `acquire_with`): the event that says redlock is waiting, not just started.
    cmd.env("REDLOCK_LOG", "quorumlock=debug");
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    stderr_until(&mut child, RETRYING).await;
    let first = held.token().get();
    held.release().await.unwrap();
    let out = finish(child, started).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let token: u64 = out.stdout.trim().parse().expect("a token");
    assert!(token > first, "{token} after the first holder's {first}");
}

#[tokio::test]
async fn t42_a_failed_attempt_leaves_none_of_its_keys_behind() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    for url in &urls[..3] {
        set_foreign(url, KEY, "someone-else", Duration::from_secs(30));
    }
    let out = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(out.code(), 75, "{out:?}");
    // The free nodes said yes to some attempt; those keys are gone when redlock exits.
    for url in &urls[3..] {
        assert_eq!(value_on(url, KEY), None, "{url}");
    }
    for url in &urls[..3] {
        assert_eq!(value_on(url, KEY).as_deref(), Some("someone-else"));
    }
}

#[tokio::test]
async fn t43_wait_0_and_small_waits_make_at_least_acquires_rounds() {
    let cluster = cluster(5);
    let held = held_elsewhere(&cluster).await;
    let rounds = 1 + quorumlock::RedlockBuilder::DEFAULT_RETRY_COUNT as usize;
    for wait in ["0s", "1ms", "100ms"] {
        let mut cmd = run_sh(redlock(&cluster), &["--wait", wait], "exit 0");
        // Coupled to the library's debug line for a retried round (src/redlock.rs,
        // `acquire_with`): one per round after the first.
        cmd.env("REDLOCK_LOG", "quorumlock=debug");
        let out = output(cmd).await;
        assert_eq!(out.code(), 75, "--wait {wait}: {out:?}");
        let retries = out.stderr.matches(RETRYING).count();
        assert!(
            retries + 1 >= rounds,
            "--wait {wait}: {} rounds, acquire makes {rounds}: {out:?}",
            retries + 1
        );
        if wait == "0s" {
            assert_eq!(retries + 1, rounds, "--wait 0 is acquire: {out:?}");
        }
        // The last line that is not a log event (a background task, such as the waiter's
        // subscription, may still log at debug while the runtime shuts down).
        let last = out
            .stderr
            .lines()
            .rfind(|l| !l.starts_with(|c: char| c.is_ascii_digit()))
            .unwrap_or_default();
        assert!(
            last.starts_with("redlock: ") && last.contains("held by another owner"),
            "{out:?}"
        );
    }
    held.release().await.unwrap();
}

#[tokio::test]
async fn t44_conflict_exit_code_replaces_75_as_flock_e_does() {
    let cluster = cluster(5);
    let held = held_elsewhere(&cluster).await;
    let (_dir, marker, script) = marker_cmd();
    for (flags, code) in [
        (vec!["-E", "3"], 3),
        (vec!["--conflict-exit-code", "0"], 0),
        (vec!["-E", "200", "--wait", "300ms"], 200),
    ] {
        let out = output(run_sh(redlock(&cluster), &flags, &script)).await;
        assert_eq!(out.code(), code, "{flags:?}: {out:?}");
        assert!(
            out.one_line_error().contains("held by another owner"),
            "{flags:?}: {out:?}"
        );
        assert!(!marker.exists(), "{flags:?}: CMD must not run");
    }
    // Only the conflict: other failures keep their codes.
    let mut cmd = bare();
    cmd.args([
        "--nodes",
        "redis://127.0.0.1:1",
        "run",
        "-E",
        "3",
        "--node-timeout",
        "100ms",
    ])
    .args([KEY, "--", "true"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 69, "{out:?}");
    for bad in ["256", "-1", "x"] {
        let mut cmd = redlock(&cluster);
        cmd.args(["run", "-E", bad, KEY, "--", "true"]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "-E {bad}: {out:?}");
    }
    held.release().await.unwrap();
}
