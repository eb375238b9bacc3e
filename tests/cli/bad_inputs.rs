//! The table of bad inputs in `docs/cli.md` ("Bad inputs"), run row by row (t160): each row's
//! case is set up here, `redlock run` (`redlock ls` for the `ls-*` rows) is run, and its exit
//! code and one line must be the row's.
//! A row this file does not know, or a case here the table lacks, fails the test: the table
//! cannot drift from what `redlock` does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
    let dir = scratch();
    let fifo = file(&dir, "fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let (_cmd_dir, marker, script) = marker_cmd();

    for row in &rows {
        let Some(run) = Invocation::set_up(&row.case, &nodes, &dir, &fifo).await else {
            continue;
        };
        let out = output(run.command(&script)).await;
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

/// How `redlock` is run for one case of the table.
struct Invocation {
    env: Vec<(&'static str, String)>,
    flags: Vec<String>,
    key: String,
    /// Fake nodes kept alive for the run.
    keep: Vec<FakeNode>,
    /// `redlock ls` with these flags instead of `redlock run`.
    ls: Option<[&'static str; 2]>,
}

impl Invocation {
    /// The case's set-up, on top of a run of `KEY` on `nodes` (a hash at `KEY` on each);
    /// `None` when the case does not apply to this build (the TLS cases without `tls`).
    async fn set_up(case: &str, nodes: &str, dir: &tempfile::TempDir, fifo: &Path) -> Option<Self> {
        let mut run = Invocation {
            env: vec![("REDLOCK_NODES", nodes.to_owned())],
            flags: Vec::new(),
            key: KEY.to_owned(),
            keep: Vec::new(),
            ls: None,
        };
        let tls_ca = |path: PathBuf| vec!["--tls-ca".to_owned(), path.display().to_string()];
        match case {
            "garbage-node" | "http-node" | "ssh-node" => {
                let name = match case {
                    "garbage-node" => "garbage",
                    "http-node" => "an HTTP server",
                    _ => "an SSH server",
                };
                let nodes = three_fakes(name).await;
                run.set_nodes(
                    nodes
                        .iter()
                        .map(FakeNode::url)
                        .collect::<Vec<_>>()
                        .join(","),
                );
                run.keep.extend(nodes);
            }
            "error-node" => {
                let node = FakeNode::start_with(b"-ERR no such thing\r\n".to_vec(), true).await;
                run.set_nodes(node.url());
                run.keep.push(node);
            }
            "node-down" => run.set_nodes("redis://127.0.0.1:1,redis://127.0.0.1:2".into()),
            "unknown-host" => run.set_nodes("redis://no-such-host.invalid:6379".into()),
            "port-range" => run.set_nodes("redis://127.0.0.1:99999".into()),
            "port-text" => run.set_nodes("redis://127.0.0.1:abc".into()),
            "scheme" => run.set_nodes("http://127.0.0.1:6379".into()),
            "no-scheme" => run.set_nodes("127.0.0.1:6379".into()),
            "node-twice" => {
                run.set_nodes("redis://127.0.0.1:1,redis://127.0.0.1:1".into());
            }
            "no-nodes" => run.env.clear(),
            "ttl-short" => run.flags.extend(["--ttl".into(), "3ms".into()]),
            "ttl-long" => run.flags.extend(["--ttl".into(), "50days".into()]),
            "bad-duration" => run.flags.extend(["--wait".into(), "soon".into()]),
            "permits-huge" => run.flags.extend(["-n".into(), "4294967295".into()]),
            "permits-zero" => run.flags.extend(["-n".into(), "0".into()]),
            "empty-key" => run.key = String::new(),
            "compat-prefix" => {
                run.flags
                    .extend(["--compat".into(), "--key-prefix".into(), "x".into()]);
            }
            "compat-wrong-type" => run.flags.push("--compat".into()),
            "env-node-timeout" => run.env.push(("REDLOCK_NODE_TIMEOUT", "fast".into())),
            "env-compat" => run.env.push(("REDLOCK_COMPAT", "maybe".into())),
            "env-restart-guard" => run.env.push(("REDLOCK_RESTART_GUARD", "sometimes".into())),
            "tls-ca-missing" | "tls-ca-endless" | "tls-ca-fifo" => {
                if cfg!(not(feature = "tls")) {
                    return None;
                }
                run.set_nodes("rediss://127.0.0.1:1".into());
                run.flags.extend(tls_ca(match case {
                    "tls-ca-missing" => file(dir, "missing.pem"),
                    "tls-ca-endless" => PathBuf::from("/dev/zero"),
                    _ => fifo.to_path_buf(),
                }));
            }
            "ls-older-than" => run.ls = Some(["--older-than", "yesterday"]),
            "ls-older-than-long" => run.ls = Some(["--older-than", "20years"]),
            other => panic!("no set-up for the table's case {other:?}"),
        }
        Some(run)
    }

    /// Replaces `REDLOCK_NODES` with `urls`.
    fn set_nodes(&mut self, urls: String) {
        self.env.retain(|(k, _)| *k != "REDLOCK_NODES");
        self.env.push(("REDLOCK_NODES", urls));
    }

    /// `redlock run` (or `ls`) as set up, with the restart guard off; `script` is CMD.
    fn command(&self, script: &str) -> tokio::process::Command {
        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        match self.ls {
            Some(ls) => cmd.arg("ls").args(ls),
            None => {
                cmd.arg("run")
                    .args(&self.flags)
                    .args([self.key.as_str(), "--", "sh", "-c", script])
            }
        };
        cmd
    }
}

/// Three fake nodes answering as the `not_redis` reply `name` does.
async fn three_fakes(name: &str) -> Vec<FakeNode> {
    let replies = not_redis();
    let reply = replies.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let mut fakes = Vec::new();
    for _ in 0..3 {
        fakes.push(FakeNode::start(reply.clone()).await);
    }
    fakes
}
