//! `redlock run --once-per PERIOD KEY -- CMD`: CMD runs on exactly one of many concurrent
//! invocations per period, the others exit 0 quietly (or `-E`); a lost or unstarted run
//! leaves the period open (t45).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::harness::*;
use crate::support::*;

/// The period of these tests: long, so that no run straddles a period boundary (24 days: the
/// longest period, whose tick changes every 24 days since the Unix epoch).
const PERIOD: &str = "24days";
const PERIOD_MS: u128 = 24 * 86_400 * 1000;

/// `run --once-per PERIOD [flags] KEY -- sh -c SCRIPT`.
fn once(cmd: tokio::process::Command, flags: &[&str], script: &str) -> tokio::process::Command {
    let mut all = vec!["--once-per", PERIOD];
    all.extend_from_slice(flags);
    run_sh(cmd, &all, script)
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn t45_concurrent_invocations_run_cmd_exactly_once_per_period() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let log = file(&dir, "log");
    // Each run appends one line and stays a while, so that the others overlap it.
    let script = format!(
        "echo \"$REDLOCK_KEY $REDLOCK_TOKEN $REDLOCK_TICK\" >> {}; sleep 0.5; exit 5",
        path_str(&log)
    );
    const N: usize = 6;
    let before = SystemTime::now();
    // Six processes connecting at once on a box loaded by the whole suite: a generous node
    // timeout, so that every one of them reaches the nodes (a 69 is not what is tested here).
    let children: Vec<_> = (0..N)
        .map(|_| {
            let mut cmd = redlock(&cluster);
            cmd.env("REDLOCK_NODE_TIMEOUT", "2s");
            once(cmd, &[], &script).spawn().unwrap()
        })
        .collect();
    let mut outs = Vec::new();
    for child in children {
        outs.push(finish(child, Instant::now()).await);
    }
    let ran: Vec<_> = outs.iter().filter(|o| o.code() == 5).collect();
    assert_eq!(ran.len(), 1, "exactly one ran CMD (its own code): {outs:?}");
    for out in outs.iter().filter(|o| o.code() != 5) {
        assert_eq!(out.code(), 0, "the others skip with 0: {out:?}");
        assert_eq!(out.stderr, "", "quietly: {out:?}");
        assert_eq!(out.stdout, "", "{out:?}");
    }
    let logged = lines(&log);
    assert_eq!(logged.len(), 1, "CMD ran once: {logged:?}");
    let fields: Vec<&str> = logged[0].split_whitespace().collect();
    let [key, token, tick] = fields.as_slice() else {
        panic!("three values: {logged:?}");
    };
    assert_eq!(*key, KEY);
    let _: u64 = token.parse().expect("REDLOCK_TOKEN is a decimal u64");
    let since = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let expected = since(before) / PERIOD_MS;
    assert_eq!(tick.parse::<u128>().unwrap(), expected, "the period's tick");
    assert_eq!(holders(&urls, KEY), 0, "the lock was released");

    // A host whose cron fires later in the same period skips too (the period is marked done).
    let late = output(once(redlock(&cluster), &[], &script)).await;
    assert_eq!(late.code(), 0, "{late:?}");
    assert_eq!(late.stderr, "", "{late:?}");
    // -E chooses the code of a skip.
    let late = output(once(redlock(&cluster), &["-E", "3"], &script)).await;
    assert_eq!(late.code(), 3, "{late:?}");
    assert_eq!(lines(&log).len(), 1, "still once: {:?}", lines(&log));
}

#[tokio::test]
async fn t46_a_run_whose_lock_is_lost_is_stopped_and_leaves_the_period_open() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, log) = (file(&dir, "pid"), file(&dir, "log"));
    let script = format!(
        "echo $$ > {}; echo ran >> {}; exec sleep 60",
        path_str(&pidfile),
        path_str(&log)
    );
    // A SIGKILL would come 30 s after the SIGTERM: the bound below tells the two apart.
    // Another owner overwrites the key everywhere: the next extension finds it is not ours.
    let (out, cmd_pid, _guard) = lost_while_running(
        once(
            redlock(&cluster),
            &["--ttl", "3s", "--kill-after", "30s"],
            &script,
        ),
        &pidfile,
        &urls,
    )
    .await;
    let line = out.lost_line();
    assert!(
        line.contains("was lost: a quorum no longer holds our value")
            && line.contains("CMD's process group was sent SIGTERM and CMD exited (143)"),
        "{line}"
    );
    assert!(is_gone(cmd_pid), "CMD was stopped");
    // The next extension (every ttl/3) finds the key taken; SIGTERM ends CMD at once.
    assert!(out.took < Duration::from_secs(15), "{:?}", out.took);

    // While the other owner holds the key, a run skips (it is "running").
    let busy = output(once(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(busy.code(), 0, "{busy:?}");
    // Once it is gone, the period was not marked done: CMD runs again.
    for url in &urls {
        del_lock(url, KEY);
    }
    let again = output(once(redlock(&cluster), &[], "echo again; exit 4")).await;
    assert_eq!(again.code(), 4, "{again:?}");
    assert_eq!(again.stdout, "again\n");
}

#[tokio::test]
async fn t47_unreachable_nodes_or_an_unrunnable_cmd_are_not_quiet_and_mark_nothing() {
    let mut cluster = cluster(5);
    let dir = scratch();
    let log = file(&dir, "log");
    let script = format!("echo ran >> {}", path_str(&log));

    // CMD not found: 127, and the period stays open.
    let mut cmd = redlock(&cluster);
    cmd.args([
        "run",
        "--once-per",
        PERIOD,
        KEY,
        "--",
        "/nonexistent/quorumlock-cmd",
    ]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 127, "{out:?}");
    assert!(out.one_line_error().contains("cannot run"), "{out:?}");
    assert_eq!(holders(&cluster.urls(), KEY), 0, "released");
    let out = output(once(redlock(&cluster), &[], &script)).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(lines(&log), ["ran"], "the period was still open");

    // Too few nodes: 69 with its line, even with -E 0 (the lock service is down, not busy).
    let key2 = "other-job";
    for i in [0, 2, 4] {
        cluster.kill(i).unwrap();
    }
    let mut cmd = redlock(&cluster);
    cmd.args([
        "run",
        "--once-per",
        PERIOD,
        "-E",
        "0",
        key2,
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 69, "{out:?}");
    assert!(
        out.one_line_error().contains("too few nodes reachable"),
        "{out:?}"
    );
    assert_eq!(lines(&log), ["ran"], "CMD did not run");

    // --once-per does not wait.
    let mut cmd = redlock(&cluster);
    cmd.args(["run", "--once-per", "1h", "--wait", "1s", KEY, "--", "true"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 64, "{out:?}");
    assert!(out.one_line_error().contains("--wait"), "{out:?}");
}

#[tokio::test]
async fn t48_a_period_under_a_second_is_a_usage_error() {
    let cluster = cluster(3);
    let (_dir, marker, script) = marker_cmd();
    for period in ["0s", "0", "999ms", "0.5"] {
        let mut cmd = redlock(&cluster);
        cmd.args(["run", "--once-per", period, KEY, "--", "sh", "-c", &script]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "--once-per {period}: {out:?}");
        let line = out.one_line_error();
        assert!(
            line.contains("--once-per") && line.contains("at least 1s"),
            "--once-per {period}: {line:?}"
        );
        assert!(!marker.exists(), "--once-per {period}: CMD must not run");
    }
    // A second is accepted.
    let mut cmd = redlock(&cluster);
    cmd.args(["run", "--once-per", "1s", KEY, "--", "sh", "-c", &script]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(marker.exists(), "CMD ran");
}
