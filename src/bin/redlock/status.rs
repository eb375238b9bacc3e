//! `redlock status [--json] KEY`: every node's view of one key, as a table (or one JSON
//! object) on stdout.

use std::fmt::Write as _;

use quorumlock::{EvictionRisk, HolderView, LockStatus, Redlock};
use serde_json::{Value, json};

use crate::fail;

/// The version of the JSON document `--json` prints (its `schema` field). Raised only when a
/// field is removed or changes meaning; fields may be added within a version.
const JSON_SCHEMA: u32 = 1;

/// Prints the table (or the JSON document); exits 0 when a quorum answered, otherwise 69
/// naming the nodes that did not (the table or document is printed either way).
pub(crate) async fn status(locks: Redlock, key: &str, json: bool) -> u8 {
    let status = match locks.status(key).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if json {
        out!("{}", to_json(&status));
    } else {
        out!("{}", render(&status).trim_end());
    }
    match status.require_quorum() {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// The status of one key as a few readable lines: a summary, then one line per node, and under a
/// node whose memory policy can evict keys (or could not be read) an `eviction:` line (and, on a
/// managed service, `unchecked:` and `scripts:` lines: docs/cli.md). As printed
/// for a key held on 4 of 5 nodes, one node down and one with `maxmemory-policy volatile-lru`:
///
/// ```text
/// key "nightly": held by 53bf2490b8500e41cb3cfb366b473e3a on 4 of 5 nodes (quorum 3, 4 answered); highest fencing counter 1
///   redis://127.0.0.1:7001  held by 53bf2490b8500e41cb3cfb366b473e3a  ttl  28.494s  fence 1
///   redis://127.0.0.1:7002  unreachable: connection refused
///   redis://127.0.0.1:7003  held by 53bf2490b8500e41cb3cfb366b473e3a  ttl  28.494s  fence 1
///                             eviction: maxmemory-policy volatile-lru with maxmemory set: lock keys can be evicted before they expire
///   redis://127.0.0.1:7004  held by 53bf2490b8500e41cb3cfb366b473e3a  ttl  28.492s  fence 1
///   redis://127.0.0.1:7005  held by 53bf2490b8500e41cb3cfb366b473e3a  ttl  28.495s  fence 1
/// ```
///
/// A free node reads `free` padded to the same column, then `fence N`; the summary says `free
/// (no owner holds it on a quorum)` or `unknown (...)` when no value holds a quorum. When the
/// holder's client named itself (`--owner`, `RedlockBuilder::owner`), its value ends in
/// `@NAME` and the summary adds `(owner "NAME")` after the value.
pub(crate) fn render(status: &LockStatus) -> String {
    let mut out = String::new();
    let nodes = status.nodes.len();
    let _ = write!(out, "key {:?}: ", status.key);
    match status.holder_view() {
        HolderView::Held(holder) => {
            let on = held_on(status, holder);
            let _ = write!(out, "held by {}", visible(holder));
            if let Some(owner) = status.owner() {
                let _ = write!(out, " (owner \"{}\")", visible(&owner));
            }
            let _ = write!(out, " on {on} of {nodes} nodes");
        }
        HolderView::Vacant => out.push_str("free (no owner holds it on a quorum)"),
        HolderView::Unknown if status.answered() >= status.quorum => out.push_str(
            "unknown (no owner on a quorum of the nodes that answered; those that did not could complete one)",
        ),
        HolderView::Unknown => out.push_str("unknown (too few nodes answered)"),
    }
    let _ = writeln!(
        out,
        " (quorum {}, {} answered); highest fencing counter {}",
        status.quorum,
        status.answered(),
        status.max_fence()
    );
    let width = status.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
    for node in &status.nodes {
        let _ = write!(out, "  {:width$}  ", node.node);
        match &node.state {
            Ok(state) => {
                let held = match (state.value.as_deref().map(visible), state.ttl) {
                    (Some(value), Some(ttl)) => format!("held by {value}  ttl {:>8}", seconds(ttl)),
                    (Some(value), None) => format!("held by {value}  ttl     none"),
                    (None, _) => "free".to_owned(),
                };
                let _ = writeln!(out, "{held:54}  fence {}", state.fence);
            }
            Err(cause) => {
                let _ = writeln!(out, "unreachable: {}", visible(&cause.to_string()));
            }
        }
        if !node.unchecked.is_empty() {
            let _ = writeln!(
                out,
                "  {:width$}    unchecked: {} (CONFIG GET refused)",
                "",
                node.unchecked.join(", ")
            );
        }
        if node.scripts_by_eval {
            let _ = writeln!(
                out,
                "  {:width$}    scripts: sent as EVAL (EVALSHA refused)",
                ""
            );
        }
        // What the node's memory policy risks, where it risks anything or could not be read
        // (a node never reached reads unknown too: its line already says why).
        if node.eviction.is_risky()
            || (node.state.is_ok() && node.eviction == EvictionRisk::Unknown)
        {
            let eviction = visible(&node.eviction.to_string());
            let _ = writeln!(out, "  {:width$}    eviction: {eviction}", "");
        }
    }
    out
}

/// Text a node returned (a lock value, an owner name), as `ls` and `git` show a file name:
/// control characters as visible escapes (`\e`, `\r`, `\n`, `\t`, `\x07`), text-direction
/// overrides as `\u{202e}`, and a backslash doubled so that an escape cannot be forged.
/// Anyone who can write to the nodes can write a value; none can drive the terminal.
pub(crate) fn visible(text: &str) -> String {
    escape(text, true)
}

/// [`visible`] without doubling backslashes: for a message's line, whose own text has none
/// that an escape could be mistaken for.
pub(crate) fn escape_controls(text: &str) -> String {
    escape(text, false)
}

fn escape(text: &str, backslash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' if backslash => out.push_str("\\\\"),
            '\x1b' => out.push_str("\\e"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
                let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// A duration as seconds with millisecond precision, e.g. `29.812s`.
pub(crate) fn seconds(d: std::time::Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// How many nodes hold `value`.
fn held_on(status: &LockStatus, value: &str) -> usize {
    status
        .nodes
        .iter()
        .filter(|n| {
            n.state
                .as_ref()
                .is_ok_and(|s| s.value.as_deref() == Some(value))
        })
        .count()
}

/// The `--json` document (schema in docs/cli.md): every field is always present, `null` where
/// it does not apply, so that scripts can read any of them without checking first.
pub(crate) fn to_json(status: &LockStatus) -> Value {
    let (state, holder) = match status.holder_view() {
        HolderView::Held(holder) => ("held", Some(holder)),
        HolderView::Vacant => ("free", None),
        HolderView::Unknown => ("unknown", None),
    };
    let nodes: Vec<Value> = status
        .nodes
        .iter()
        .map(|node| {
            let (risk, policy) = eviction(&node.eviction);
            let mut entry = json!({
                "node": node.node,
                "reachable": node.state.is_ok(),
                "value": null,
                "owner": null,
                "ttl_ms": null,
                "fence": null,
                "error": null,
                "error_kind": null,
                "eviction": risk,
                "eviction_policy": policy,
                "unchecked": node.unchecked,
                "scripts_by_eval": node.scripts_by_eval,
            });
            match &node.state {
                Ok(state) => {
                    entry["value"] = json!(state.value);
                    entry["owner"] = json!(state.owner);
                    entry["ttl_ms"] = json!(state.ttl.map(millis));
                    entry["fence"] = json!(state.fence.get());
                }
                Err(cause) => {
                    entry["error"] = json!(cause.to_string());
                    entry["error_kind"] = json!(cause.kind());
                }
            }
            entry
        })
        .collect();
    json!({
        "schema": JSON_SCHEMA,
        "key": status.key,
        "state": state,
        "holder": holder,
        "owner": status.owner(),
        "held_on": holder.map_or(0, |h| held_on(status, h)),
        "quorum": status.quorum,
        "answered": status.answered(),
        "max_fence": status.max_fence().get(),
        "nodes": nodes,
    })
}

/// A duration in whole milliseconds (rounded down).
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A node's eviction risk as the JSON `eviction` and `eviction_policy` fields.
fn eviction(risk: &EvictionRisk) -> (&'static str, Option<&str>) {
    match risk {
        EvictionRisk::None => ("none", None),
        EvictionRisk::LockKeys { policy } => ("lock_keys", Some(policy)),
        EvictionRisk::LockKeysAndCounters { policy } => ("lock_keys_and_counters", Some(policy)),
        // `Unknown`, and a risk a newer library adds (the enum is non-exhaustive).
        _ => ("unknown", None),
    }
}
