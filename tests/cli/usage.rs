//! Usage errors: exit 64, one line, nothing run; every duration bounded (t20).

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t20_usage_errors_exit_64_with_one_line_and_run_nothing() {
    let cluster = cluster(5);
    let (_dir, marker, script) = marker_cmd();
    let nodes = cluster.urls().join(",");

    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "bad flag",
            vec!["--nodes", &nodes, "run", "--bogus"],
            "--bogus",
        ),
        (
            "bad duration",
            vec!["--nodes", &nodes, "run", "--ttl", "5parsecs"],
            "5parsecs",
        ),
        (
            "bad wait",
            vec!["--nodes", &nodes, "run", "--wait", "soon"],
            "soon",
        ),
        (
            "bad node URL",
            vec!["--nodes", "http://127.0.0.1:1", "run"],
            "invalid node URL",
        ),
        (
            "same node twice",
            vec!["--nodes", "redis://127.0.0.1:1,redis://127.0.0.1:1", "run"],
            "listed twice",
        ),
        ("no nodes", vec!["run"], "no nodes given"),
        (
            "empty node list",
            vec!["--nodes", ",", "run"],
            "no nodes given",
        ),
        (
            "ttl within the drift",
            vec!["--nodes", &nodes, "run", "--ttl", "1ms"],
            "ttl",
        ),
    ];
    for (what, args, needle) in cases {
        let mut cmd = bare();
        cmd.args(&args).args([KEY, "--", "sh", "-c", &script]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "{what}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains(needle), "{what}: {line:?} names {needle:?}");
        assert!(!marker.exists(), "{what}: CMD must not run");
    }

    for (what, args) in [
        ("no subcommand", vec![]),
        ("no CMD", vec!["--nodes", nodes.as_str(), "run", KEY]),
        ("no KEY", vec!["--nodes", nodes.as_str(), "run"]),
        (
            "empty KEY",
            vec!["--nodes", nodes.as_str(), "run", "", "--", "true"],
        ),
        ("unknown subcommand", vec!["lock", KEY]),
    ] {
        let mut cmd = bare();
        cmd.args(&args);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "{what}: {out:?}");
        out.one_line_error();
    }

    let mut help = bare();
    help.arg("--help");
    let help = output(help).await;
    assert_eq!(help.code(), 0);
    assert!(help.stdout.contains("Exit codes"), "{help:?}");
}

#[tokio::test]
async fn t21_every_duration_is_bounded_and_huge_ones_exit_64_not_a_panic() {
    let cluster = cluster(5);
    let (_dir, marker, script) = marker_cmd();
    let nodes = cluster.urls().join(",");
    for (what, flags, vars, needle) in out_of_range_durations() {
        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off")
            .envs(vars)
            .args(["--nodes", &nodes, "run"])
            .args(&flags)
            .args([KEY, "--", "sh", "-c", &script]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "{what}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains(needle), "{what}: {line:?} names {needle:?}");
        assert!(!marker.exists(), "{what}: CMD must not run");
    }

    // The largest values accepted still work.
    let mut cmd = redlock(&cluster);
    cmd.args(["--node-timeout", "1h", "run", "--ttl", "4294967295ms"])
        .args(["--wait", "365days", "--kill-after", "1day"])
        .args([KEY, "--", "sh", "-c", "exit 4"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 4, "{out:?}");
}

/// What, flags, variables, what the line names.
type Case = (
    &'static str,
    Vec<&'static str>,
    Vec<(&'static str, &'static str)>,
    &'static str,
);

/// Every duration flag (and variable) out of its range, huge or overflowing.
fn out_of_range_durations() -> Vec<Case> {
    let huge = "300000000000y";
    vec![
        ("huge --ttl", vec!["--ttl", huge], vec![], "--ttl"),
        (
            "--ttl over 49 days",
            vec!["--ttl", "50days"],
            vec![],
            "--ttl",
        ),
        ("huge --wait", vec!["--wait", huge], vec![], "--wait"),
        (
            "huge --kill-after",
            vec!["--kill-after", huge],
            vec![],
            "--kill-after",
        ),
        (
            "--kill-after over a day",
            vec!["--kill-after", "25h"],
            vec![],
            "--kill-after",
        ),
        (
            "huge --max-ttl",
            vec!["--max-ttl", huge],
            vec![],
            "--max-ttl",
        ),
        (
            "huge REDLOCK_MAX_TTL",
            vec![],
            vec![("REDLOCK_MAX_TTL", huge)],
            "--max-ttl",
        ),
        (
            "huge --node-timeout",
            vec!["--node-timeout", huge],
            vec![],
            "--node-timeout",
        ),
        (
            "huge REDLOCK_NODE_TIMEOUT",
            vec![],
            vec![("REDLOCK_NODE_TIMEOUT", huge)],
            "--node-timeout",
        ),
        (
            "--node-timeout over an hour",
            vec!["--node-timeout", "61m"],
            vec![],
            "--node-timeout",
        ),
        (
            "zero --node-timeout",
            vec!["--node-timeout", "0s"],
            vec![],
            "node timeout",
        ),
        (
            "overflowing number",
            vec!["--ttl", "99999999999999999999999y"],
            vec![],
            "--ttl",
        ),
    ]
}
