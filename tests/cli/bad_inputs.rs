//! The table of bad inputs in `docs/cli.md` ("Bad inputs"), run row by row (t160): each row's
//! case is set up here, `redlock run` (`redlock ls` for the `ls-*` rows) is run, and its exit
//! code and one line must be the row's.
//! A row this file does not know, or a case here the table lacks, fails the test: the table
//! cannot drift from what `redlock` does.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::fake_node::{FakeNode, not_redis};
use crate::harness::*;
use crate::hostile::assert_plain;

/// One row: the case, the exit code, the text the line contains.
struct Row {
    case: String,
    code: i32,
    contains: String,
}

/// The rows between the table's markers.
fn rows() -> Vec<Row> {
    let doc = include_str!("../../docs/cli.md");
    let start = doc
        .find("<!-- bad-inputs:start -->")
        .expect("the table's start marker");
    let end = doc
        .find("<!-- bad-inputs:end -->")
        .expect("the table's end marker");
    let unquote = |cell: &str| {
        let cell = cell.trim();
        cell.strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .unwrap_or_else(|| panic!("{cell:?} is not in backquotes"))
            .to_owned()
    };
    doc[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 4, "four cells: {l}");
            Row {
                case: unquote(cells[0]),
                code: cells[2].trim().parse().expect("an exit code"),
                contains: unquote(cells[3]),
            }
        })
        .collect()
}

/// Every case this test sets up, as the table names them.
const CASES: &[&str] = &[
    "garbage-node",
    "http-node",
    "ssh-node",
    "error-node",
    "node-down",
    "unknown-host",
    "port-range",
    "port-text",
    "scheme",
    "no-scheme",
    "node-twice",
    "no-nodes",
    "ttl-short",
    "ttl-long",
    "bad-duration",
    "permits-huge",
    "permits-zero",
    "empty-key",
    "compat-prefix",
    "compat-wrong-type",
    "env-node-timeout",
    "env-compat",
    "env-restart-guard",
    "tls-ca-missing",
    "tls-ca-endless",
    "tls-ca-fifo",
    "ls-older-than",
    "ls-older-than-long",
];

#[tokio::test]
#[expect(clippy::too_many_lines, reason = "not yet split by phase")]
async fn t160_the_table_of_bad_inputs_is_what_redlock_does() {
    let rows = rows();
    let documented: BTreeSet<&str> = rows.iter().map(|r| r.case.as_str()).collect();
    let known: BTreeSet<&str> = CASES.iter().copied().collect();
    assert_eq!(documented, known, "the table's cases and this test's");
    assert_eq!(documented.len(), rows.len(), "each case once");

    let cluster = crate::support::cluster(3);
    let nodes = cluster.urls().join(",");
    for url in cluster.urls() {
        let _: () = redis::cmd("HSET")
            .arg(KEY)
            .arg("field")
            .arg("value")
            .query(&mut crate::support::conn(&url))
            .unwrap();
    }
    let replies = not_redis();
    let fakes = |name: &str| {
        let reply = replies.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        async move {
            let mut fakes = Vec::new();
            for _ in 0..3 {
                fakes.push(FakeNode::start(reply.clone()).await);
            }
            fakes
        }
    };
    let dir = scratch();
    let fifo = file(&dir, "fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let (_cmd_dir, marker, script) = marker_cmd();

    for row in &rows {
        let mut env: Vec<(&str, String)> = vec![("REDLOCK_NODES", nodes.clone())];
        let mut flags: Vec<String> = Vec::new();
        let mut key = KEY.to_owned();
        let mut keep = Vec::new();
        // `redlock ls` with these flags instead of `redlock run`.
        let mut ls: Option<[&str; 2]> = None;
        let set_nodes = |env: &mut Vec<(&str, String)>, urls: String| {
            env.retain(|(k, _)| *k != "REDLOCK_NODES");
            env.push(("REDLOCK_NODES", urls));
        };
        let tls_ca = |path: PathBuf| vec!["--tls-ca".to_owned(), path.display().to_string()];
        match row.case.as_str() {
            "garbage-node" | "http-node" | "ssh-node" => {
                let name = match row.case.as_str() {
                    "garbage-node" => "garbage",
                    "http-node" => "an HTTP server",
                    _ => "an SSH server",
                };
                let nodes = fakes(name).await;
                set_nodes(
                    &mut env,
                    nodes
                        .iter()
                        .map(FakeNode::url)
                        .collect::<Vec<_>>()
                        .join(","),
                );
                keep.extend(nodes);
            }
            "error-node" => {
                let node = FakeNode::start_with(b"-ERR no such thing\r\n".to_vec(), true).await;
                set_nodes(&mut env, node.url());
                keep.push(node);
            }
            "node-down" => set_nodes(&mut env, "redis://127.0.0.1:1,redis://127.0.0.1:2".into()),
            "unknown-host" => set_nodes(&mut env, "redis://no-such-host.invalid:6379".into()),
            "port-range" => set_nodes(&mut env, "redis://127.0.0.1:99999".into()),
            "port-text" => set_nodes(&mut env, "redis://127.0.0.1:abc".into()),
            "scheme" => set_nodes(&mut env, "http://127.0.0.1:6379".into()),
            "no-scheme" => set_nodes(&mut env, "127.0.0.1:6379".into()),
            "node-twice" => {
                set_nodes(&mut env, "redis://127.0.0.1:1,redis://127.0.0.1:1".into());
            }
            "no-nodes" => env.clear(),
            "ttl-short" => flags.extend(["--ttl".into(), "3ms".into()]),
            "ttl-long" => flags.extend(["--ttl".into(), "50days".into()]),
            "bad-duration" => flags.extend(["--wait".into(), "soon".into()]),
            "permits-huge" => flags.extend(["-n".into(), "4294967295".into()]),
            "permits-zero" => flags.extend(["-n".into(), "0".into()]),
            "empty-key" => key = String::new(),
            "compat-prefix" => {
                flags.extend(["--compat".into(), "--key-prefix".into(), "x".into()]);
            }
            "compat-wrong-type" => flags.push("--compat".into()),
            "env-node-timeout" => env.push(("REDLOCK_NODE_TIMEOUT", "fast".into())),
            "env-compat" => env.push(("REDLOCK_COMPAT", "maybe".into())),
            "env-restart-guard" => env.push(("REDLOCK_RESTART_GUARD", "sometimes".into())),
            "tls-ca-missing" | "tls-ca-endless" | "tls-ca-fifo" => {
                if cfg!(not(feature = "tls")) {
                    continue;
                }
                set_nodes(&mut env, "rediss://127.0.0.1:1".into());
                flags.extend(tls_ca(match row.case.as_str() {
                    "tls-ca-missing" => file(&dir, "missing.pem"),
                    "tls-ca-endless" => PathBuf::from("/dev/zero"),
                    _ => fifo.clone(),
                }));
            }
            "ls-older-than" => ls = Some(["--older-than", "yesterday"]),
            "ls-older-than-long" => ls = Some(["--older-than", "20years"]),
            other => panic!("no set-up for the table's case {other:?}"),
        }
        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off");
        for (k, v) in &env {
            cmd.env(k, v);
        }
        match ls {
            Some(ls) => cmd.arg("ls").args(ls),
            None => cmd
                .arg("run")
                .args(&flags)
                .args([key.as_str(), "--", "sh", "-c", &script]),
        };
        let out = output(cmd).await;
        let case = &row.case;
        assert_eq!(out.code(), row.code, "{case}: {out:?}");
        let line = out.one_line_error();
        assert!(
            line.contains(&row.contains),
            "{case}: {line:?} should contain {:?} (docs/cli.md, Bad inputs)",
            row.contains
        );
        assert_plain(case, line);
        assert!(!marker.exists(), "{case}: CMD must not run");
    }
}
