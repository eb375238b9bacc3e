//! Managed services through the CLI (issue 15, item 5): an ACL refusal that rules out a quorum
//! exits 77 naming the command; `status` shows what a node would not let us check (t140..).

use quorumlock::testkit::{LocalCluster, ServerOptions};

use crate::harness::*;

/// Nodes whose only usable user is `app`, with these extra rules and configuration lines.
fn restricted(rules: &str, extra: &[&str]) -> LocalCluster {
    restricted_with(rules, extra, ServerOptions::new())
}

/// As [`restricted`], on top of `options`.
fn restricted_with(rules: &str, extra: &[&str], options: ServerOptions) -> LocalCluster {
    let mut options = options
        .config_line("user default off")
        .config_line(&format!("user app on >app-pw ~* &* +@all {rules}"))
        .user("app", "app-pw");
    for line in extra {
        options = options.config_line(line);
    }
    LocalCluster::start_with(3, &options).unwrap_or_else(|e| panic!("{e}"))
}

/// `INCR` (called by the acquire script) refused on every node: one line naming it, exit 77,
/// and CMD never runs.
#[tokio::test]
async fn t140_a_refused_command_exits_77_naming_it() {
    let cluster = restricted("-incr", &[]);
    let dir = scratch();
    let ran = file(&dir, "ran");
    let cmd = run_sh(redlock(&cluster), &[], &format!("touch {}", path_str(&ran)));
    let out = output(cmd).await;
    assert_eq!(out.code(), 77, "{out:?}");
    let line = out.one_line_error();
    assert!(line.contains("INCR"), "names the command: {line}");
    assert!(
        line.contains("docs/acl.md"),
        "says where the list is: {line}"
    );
    assert!(!ran.exists(), "CMD must not run without the lock");
}

/// `CONFIG` renamed away and `EVALSHA` refused, on nodes with AOF: `status` still answers (a
/// new process's first call of a script goes as `EVAL`, so it never meets the refusal) and
/// says, per node, what could not be checked (`appendfsync`: only `CONFIG GET` has it), in the
/// table and in `--json`.
#[tokio::test]
async fn t141_status_names_what_a_managed_node_hides() {
    let cluster = restricted_with(
        "-evalsha",
        &["rename-command CONFIG \"\""],
        ServerOptions::new().aof_always(),
    );

    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let unchecked = out
        .stdout
        .lines()
        .filter(|l| l.contains("unchecked: ") && l.contains("appendfsync"))
        .count();
    assert_eq!(unchecked, 3, "one unchecked line per node: {}", out.stdout);

    let mut cmd = redlock(&cluster);
    cmd.args(["status", "--json", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let doc: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    for node in doc["nodes"].as_array().expect("nodes") {
        assert_eq!(node["reachable"], true, "{node}");
        let names: Vec<&str> = node["unchecked"]
            .as_array()
            .expect("unchecked")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(names, ["appendfsync"], "{node}");
    }
}
