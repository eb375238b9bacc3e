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
