//! `redlock run`: CMD runs under the lock, with its code, environment and stdio (t10).

use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t10_exits_with_cmds_code_and_leaves_no_key_behind() {
    let cluster = cluster(5);
    let urls = cluster.urls();

    let ok = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(ok.code(), 0, "{ok:?}");
    assert_eq!(ok.stderr, "", "silent on success");
    assert_eq!(
        holders(&urls, KEY),
        0,
        "released on every node before exiting"
    );

    let seven = output(run_sh(redlock(&cluster), &[], "exit 7")).await;
    assert_eq!(seven.code(), 7, "{seven:?}");
    assert_eq!(seven.stderr, "");
    assert_eq!(holders(&urls, KEY), 0);
}

#[tokio::test]
async fn t11_cmd_gets_key_token_and_validity_in_its_environment() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let script = r#"echo "$REDLOCK_KEY $REDLOCK_TOKEN $REDLOCK_VALIDITY_MS""#;
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let out = output(run_sh(redlock(&cluster), &["--ttl", "10s"], script)).await;
        assert_eq!(out.code(), 0, "{out:?}");
        let fields: Vec<&str> = out.stdout.split_whitespace().collect();
        let [key, token, validity] = fields.as_slice() else {
            panic!("three values: {out:?}");
        };
        assert_eq!(*key, KEY);
        let token: u64 = token.parse().expect("REDLOCK_TOKEN is a decimal u64");
        let validity: u64 = validity.parse().expect("REDLOCK_VALIDITY_MS is decimal");
        assert!(
            validity > 9_000 && validity <= 10_000,
            "validity left at start: {validity} ms"
        );
        // The token is the key's fencing counter, which stands at or above it on a quorum.
        let fences: Vec<u64> = urls.iter().map(|u| fence_on(u, KEY)).collect();
        assert!(
            fences.iter().filter(|&&f| f >= token).count() >= 3,
            "token {token}, counters {fences:?}"
        );
        tokens.push(token);
    }
    assert!(tokens[1] > tokens[0], "tokens rise: {tokens:?}");
}

#[tokio::test]
async fn t12_nodes_come_from_redlock_nodes_when_no_flag_is_given() {
    let cluster = cluster(5);
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "off")
        .env("REDLOCK_NODES", cluster.urls().join(","));
    let out = output(run_sh(cmd, &[], "exit 3")).await;
    assert_eq!(out.code(), 3, "{out:?}");

    // The flag wins over the variable.
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_NODES", "redis://127.0.0.1:1");
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 0, "{out:?}");
}

#[tokio::test]
async fn t13_cmd_runs_without_a_shell_and_inherits_stdio() {
    let cluster = cluster(5);

    // No shell: `$REDLOCK_KEY` and `*` reach CMD as written.
    let mut cmd = redlock(&cluster);
    cmd.args(["run", KEY, "--", "printf", "%s|%s", "$REDLOCK_KEY", "*"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.stdout, "$REDLOCK_KEY|*");

    // stdin, stdout and stderr are CMD's own.
    let mut cmd = run_sh(redlock(&cluster), &[], "cat; echo to-stderr >&2");
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"hello from stdin\n").await.unwrap();
    drop(stdin);
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.stdout, "hello from stdin\n");
    assert_eq!(out.stderr, "to-stderr\n");
}

#[tokio::test]
async fn t14_cmd_killed_by_a_signal_gives_128_plus_the_signal() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let killed = output(run_sh(redlock(&cluster), &[], "kill -KILL $$")).await;
    assert_eq!(killed.code(), 128 + 9, "{killed:?}");
    let termed = output(run_sh(redlock(&cluster), &[], "kill -TERM $$")).await;
    assert_eq!(termed.code(), 128 + 15, "{termed:?}");
    assert_eq!(holders(&urls, KEY), 0);
}

#[tokio::test]
async fn t15_cmd_that_cannot_be_run_exits_127_or_126_and_releases() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let mut cmd = redlock(&cluster);
    cmd.args(["run", KEY, "--", "/nonexistent/quorumlock-cmd"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 127, "not found: {out:?}");
    assert!(out.one_line_error().contains("cannot run"), "{out:?}");
    assert_eq!(holders(&urls, KEY), 0);

    // Found, but not executable: a file without the execute bit, and a directory.
    let dir = scratch();
    let script = file(&dir, "not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    for path in [path_str(&script), path_str(dir.path())] {
        let mut cmd = redlock(&cluster);
        cmd.args(["run", KEY, "--", path]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 126, "cannot execute {path}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains("cannot run") && line.contains(path), "{line}");
        assert_eq!(holders(&urls, KEY), 0);
    }
}

/// A fresh `redlock run KEY -- CMD` (a cron job) on 5 Redis 7 nodes takes its lock with at most
/// 4 commands per node, connection setup included: what each node ran from exec to CMD's start,
/// read from `INFO commandstats`, with the nodes' script cache empty (the first run after a
/// restart) and filled (every later run). What the release costs is printed too.
#[tokio::test]
async fn t16_a_fresh_run_takes_its_lock_with_at_most_4_commands_per_node() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    for cache in ["empty", "filled"] {
        let dir = scratch();
        let (held, go) = (file(&dir, "held"), file(&dir, "go"));
        let script = format!("touch {}; {}", path_str(&held), wait_for_file(&go));
        let before = readings(&urls);
        // A node timeout no loaded machine reaches: one round, no retry.
        let mut cmd = redlock(&cluster);
        cmd.env("REDLOCK_NODE_TIMEOUT", "5s");
        let child = run_sh(cmd, &[], &script).spawn().unwrap();
        wait_until(WAIT, "CMD runs", || async { held.exists() }).await;
        let taking = readings(&urls);
        std::fs::write(&go, "").unwrap();
        let out = finish(child, Instant::now()).await;
        assert_eq!(out.code(), 0, "{out:?}");
        let after = readings(&urls);
        assert_fresh_take(
            &urls,
            [&before, &taking, &after],
            &format!("script cache {cache}"),
        );
    }
}
