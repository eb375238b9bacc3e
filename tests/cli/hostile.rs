//! Nodes that are not Redis, values that would drive a terminal, arguments out of range: every
//! one ends in one clear line and a documented exit code (t150..).

use crate::fake_node::{FakeNode, not_redis};
use crate::harness::*;

/// No line of a message for people spans lines, carries a control character or Rust debug text.
pub fn assert_plain(what: &str, text: &str) {
    assert!(
        !text.chars().any(|c| c.is_control()),
        "{what}: a control character in {text:?}"
    );
    for debug in [
        "Some(",
        "None",
        "int(",
        "{ ",
        "- Parse",
        "- Io",
        "- InvalidClientConfig",
        "- AuthenticationFailed",
        "- Client",
        "ResponseError",
        "Incompatible type",
        "Okay",
    ] {
        assert!(
            !text.contains(debug),
            "{what}: debug text {debug:?} in {text:?}"
        );
    }
}

#[tokio::test]
async fn t150_a_node_that_is_not_redis_is_a_bad_reply_on_one_line() {
    for (what, reply) in not_redis() {
        let fakes = [
            FakeNode::start(reply.clone()).await,
            FakeNode::start(reply.clone()).await,
            FakeNode::start(reply.clone()).await,
        ];
        let nodes = fakes
            .iter()
            .map(FakeNode::url)
            .collect::<Vec<_>>()
            .join(",");

        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off")
            .args(["--nodes", &nodes, "run", KEY, "--", "true"]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 69, "{what}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains("not a Redis server"), "{what}: {line}");
        assert_plain(what, line);

        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off")
            .args(["--nodes", &nodes, "status", KEY]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 69, "{what}: {out:?}");
        // The summary and one line per node.
        assert_eq!(out.stdout.lines().count(), 4, "{what}: {}", out.stdout);
        for line in out.stdout.lines().skip(1) {
            assert!(line.contains("not a Redis server"), "{what}: {line}");
        }
        assert_plain(what, out.one_line_error());

        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off")
            .args(["--nodes", &nodes, "status", "--json", KEY]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 69, "{what}: {out:?}");
        let doc: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
        for node in doc["nodes"].as_array().expect("nodes") {
            assert_eq!(node["error_kind"], "bad_reply", "{what}: {node}");
            assert_plain(what, node["error"].as_str().expect("error"));
        }
    }
}

#[tokio::test]
async fn t151_messages_say_what_is_wrong_in_words() {
    let cases: Vec<(&str, &str, i32, &str)> = vec![
        (
            "port out of range",
            "redis://127.0.0.1:99999",
            64,
            "port 99999 is out of range",
        ),
        (
            "port not a number",
            "redis://127.0.0.1:abc",
            64,
            "port \"abc\" is not a number",
        ),
        (
            "wrong scheme",
            "http://127.0.0.1:1",
            64,
            "scheme \"http\" is not one of",
        ),
        ("no scheme", "127.0.0.1:6379", 64, "it has no scheme"),
        (
            "unknown host",
            "redis://no-such-host.invalid:6379",
            69,
            "DNS",
        ),
    ];
    for (what, url, code, needle) in cases {
        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off")
            .args(["--nodes", url, "run", KEY, "--", "true"]);
        let out = output(cmd).await;
        assert_eq!(out.code(), code, "{what}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains(needle), "{what}: {line}");
        assert_plain(what, line);
    }

    // A file name full of escapes is echoed with them visible.
    #[cfg(feature = "tls")]
    {
        let mut cmd = bare();
        cmd.args([
            "--nodes",
            "rediss://127.0.0.1:1",
            "--tls-ca",
            "/nonexistent/\x1b[2J\x07\r\n",
        ])
        .args(["run", KEY, "--", "true"]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "{out:?}");
        let line = out.one_line_error();
        assert_plain("a file name with escapes", line);
        assert!(line.contains(r"/nonexistent/\e[2J\x07\r\n"), "{line}");
    }

    // A node that answers every command with an error reply full of escapes and newlines.
    let fake = FakeNode::start_with(b"-ERR bad\x1b[2J\x07 thing\r\n".to_vec(), true).await;
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "off")
        .args(["--nodes", &fake.url(), "status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 69, "{out:?}");
    assert_plain("an error reply", out.one_line_error());
    assert_plain("an error reply", &out.stdout.replace('\n', " "));
    assert!(out.stderr.contains("ERR bad [2J thing"), "{out:?}");
}

#[tokio::test]
async fn t152_status_escapes_what_the_nodes_hold() {
    let cluster = crate::support::cluster(3);
    let urls = cluster.urls();
    let value = "evil\x1b[2J\rforged line\x07\nx\u{202e}@own\x1b]0;title\x07er";
    for url in &urls {
        crate::support::set_foreign(url, KEY, value, std::time::Duration::from_secs(30));
    }
    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let shown = r"evil\e[2J\rforged line\x07\nx\u{202e}@own\e]0;title\x07er";
    assert_eq!(out.stdout.lines().count(), 4, "{}", out.stdout);
    for line in out.stdout.lines() {
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains(shown), "{line:?} shows {shown}");
    }
}

#[tokio::test]
async fn t153_a_ttl_too_short_to_work_is_a_usage_error() {
    let cluster = crate::support::cluster(3);
    let (_dir, marker, script) = marker_cmd();
    for ttl in ["3ms", "12ms"] {
        let out = output(run_sh(redlock(&cluster), &["--ttl", ttl], &script)).await;
        assert_eq!(out.code(), 64, "--ttl {ttl}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains("at least 13ms"), "--ttl {ttl}: {line}");
        assert!(!marker.exists(), "--ttl {ttl}: CMD must not run");
    }
    // 13 ms is accepted (whether a round leaves validity that short is the round's outcome).
    let out = output(run_sh(redlock(&cluster), &["--ttl", "13ms"], &script)).await;
    assert_ne!(out.code(), 64, "{out:?}");
}

#[tokio::test]
async fn t154_the_permit_count_is_bounded() {
    let cluster = crate::support::cluster(3);
    let (_dir, marker, script) = marker_cmd();
    for n in ["4294967295", "10000000", "1001"] {
        let out = output(run_sh(redlock(&cluster), &["-n", n, "-w", "1"], &script)).await;
        assert_eq!(out.code(), 64, "-n {n}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains("1..=1000"), "-n {n}: {line}");
        assert!(!marker.exists(), "-n {n}: CMD must not run");
    }
    let out = output(run_sh(
        redlock(&cluster),
        &["-n", "1000", "-w", "1"],
        &script,
    ))
    .await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(marker.exists());

    // With every node down, the largest semaphore gives up when the wait is over.
    let down = "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3";
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "off").args([
        "--nodes", down, "run", "-n", "1000", "-w", "1", KEY, "--", "true",
    ]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 69, "{out:?}");
    assert_plain("nodes down", out.one_line_error());
}

#[tokio::test]
async fn t155_compat_on_a_key_of_another_type_says_so() {
    let cluster = crate::support::cluster(3);
    for url in cluster.urls() {
        let _: () = redis::cmd("HSET")
            .arg(KEY)
            .arg("field")
            .arg("value")
            .query(&mut crate::support::conn(&url))
            .unwrap();
    }
    let (_dir, marker, script) = marker_cmd();
    let mut cmd = redlock(&cluster);
    cmd.arg("--compat");
    let out = output(run_sh(cmd, &[], &script)).await;
    assert_eq!(out.code(), 65, "{out:?}");
    let line = out.one_line_error();
    assert!(line.contains("holds a Redis hash"), "{line}");
    assert!(!marker.exists(), "CMD must not run");

    let locks = crate::support::builder(&cluster)
        .compat(true)
        .build()
        .unwrap();
    let err = locks
        .try_acquire(KEY, std::time::Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, quorumlock::Error::WrongType { kind, nodes: 3, .. } if kind == "hash"),
        "{err}"
    );
    assert!(!err.is_retryable());
}

/// A `--tls-*` file that never ends or never opens: read only for rediss:// nodes, at most
/// 1 MiB, a FIFO without a writer is an empty file; each a usage error on one line.
#[cfg(feature = "tls")]
#[tokio::test]
async fn t156_tls_files_are_bounded_and_read_only_when_needed() {
    let dir = scratch();
    let fifo = file(&dir, "fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let limit = std::time::Duration::from_secs(10);
    let cases: Vec<(&str, &str, &std::path::Path, i32, &str)> = vec![
        (
            "a FIFO, no rediss:// node",
            "redis://127.0.0.1:1",
            &fifo,
            69,
            "too few nodes",
        ),
        (
            "a FIFO without a writer",
            "rediss://127.0.0.1:1",
            &fifo,
            64,
            "is empty",
        ),
        (
            "an endless file",
            "rediss://127.0.0.1:1",
            std::path::Path::new("/dev/zero"),
            64,
            "larger than 1 MiB",
        ),
    ];
    for (what, nodes, path, code, needle) in cases {
        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off")
            .args(["--nodes", nodes, "--tls-ca"])
            .arg(path)
            .args(["run", KEY, "--", "true"]);
        let child = cmd.spawn().unwrap();
        let out = finish_within(child, tokio::time::Instant::now(), limit).await;
        assert_eq!(out.code(), code, "{what}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains(needle), "{what}: {line}");
        assert_plain(what, line);
    }
}
