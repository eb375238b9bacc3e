//! `redlock status KEY`: every node's view of one key, as a table on stdout.

use std::fmt::Write as _;

use quorumlock::{EvictionRisk, HolderView, LockStatus, Redlock};

use crate::fail;

/// Prints the table; exits 0 when a quorum answered, otherwise 69 naming the nodes that did
/// not (the table is printed either way).
pub(crate) async fn status(locks: Redlock, key: &str) -> u8 {
    let status = match locks.status(key).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    out!("{}", render(&status).trim_end());
    match status.require_quorum() {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// The status of one key as a few readable lines: a summary, then one line per node, and under a
/// node whose memory policy can evict keys (or could not be read) an `eviction:` line. As printed
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
/// (no owner holds it on a quorum)` or `unknown (...)` when no value holds a quorum.
pub(crate) fn render(status: &LockStatus) -> String {
    let mut out = String::new();
    let nodes = status.nodes.len();
    let _ = write!(out, "key {:?}: ", status.key);
    match status.holder_view() {
        HolderView::Held(holder) => {
            let on = status
                .nodes
                .iter()
                .filter(|n| {
                    n.state
                        .as_ref()
                        .is_ok_and(|s| s.value.as_deref() == Some(holder))
                })
                .count();
            let _ = write!(out, "held by {holder} on {on} of {nodes} nodes");
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
                let held = match (&state.value, state.ttl) {
                    (Some(value), Some(ttl)) => format!("held by {value}  ttl {:>8}", seconds(ttl)),
                    (Some(value), None) => format!("held by {value}  ttl     none"),
                    (None, _) => "free".to_owned(),
                };
                let _ = writeln!(out, "{held:54}  fence {}", state.fence);
            }
            Err(cause) => {
                let _ = writeln!(out, "unreachable: {cause}");
            }
        }
        // What the node's memory policy risks, where it risks anything or could not be read
        // (a node never reached reads unknown too: its line already says why).
        if node.eviction.is_risky()
            || (node.state.is_ok() && node.eviction == EvictionRisk::Unknown)
        {
            let _ = writeln!(out, "  {:width$}    eviction: {}", "", node.eviction);
        }
    }
    out
}

/// A duration as seconds with millisecond precision, e.g. `29.812s`.
pub(crate) fn seconds(d: std::time::Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
