//! `redlock ls [PREFIX] [--json]`: every lock held under a prefix, one line each (or one JSON
//! object).

use std::fmt::Write as _;

use quorumlock::{Inventory, Redlock};
use serde_json::{Value, json};

use crate::fail;
use crate::status::seconds;

/// The version of the JSON document `--json` prints (its `schema` field).
const JSON_SCHEMA: u32 = 1;

/// Prints the table (or the JSON document); exits 0 when a quorum of nodes was scanned (the
/// nodes that were not are named on stderr), 69 otherwise.
pub(crate) async fn ls(locks: Redlock, prefix: &str, json: bool) -> u8 {
    let inventory = match locks.locks(prefix).await {
        Ok(i) => i,
        Err(e) => return fail(&e),
    };
    if json {
        out!("{}", to_json(prefix, &inventory));
    } else {
        out!("{}", render(&inventory).trim_end());
    }
    for failure in &inventory.failures {
        crate::report(&format_args!("not scanned: {failure}"));
    }
    if inventory.truncated {
        crate::report(&format_args!(
            "a node holds more than {} lock keys under {prefix:?}: the list is partial (use a longer prefix)",
            quorumlock::MAX_LOCKS
        ));
    }
    0
}

/// One line per lock, sorted by key, under a header:
///
/// ```text
/// KEY      HOLDER                                   NODES  TTL      FENCE
/// backup   5d1c3c0e0f9a4b7e8c2d1f6a3b5e7c9d@host-a  5/5    28.494s  7
/// nightly  9f0e1d2c3b4a59687766554433221100         3/5?   -        12
/// ```
///
/// `NODES` is how many nodes hold the value, of all configured; a `?` marks a lock that stands
/// on fewer than a quorum of the nodes that answered but may on the others. `TTL` is the time
/// left on a quorum (`-` when fewer than a quorum answered with it).
fn render(inventory: &Inventory) -> String {
    let rows: Vec<[String; 5]> = inventory
        .locks
        .iter()
        .map(|l| {
            [
                l.key.escape_debug().to_string(),
                l.value.escape_debug().to_string(),
                format!(
                    "{}/{}{}",
                    l.held_on,
                    inventory.nodes,
                    if l.certain { "" } else { "?" }
                ),
                l.ttl.map_or_else(|| "-".to_owned(), seconds),
                l.fence.to_string(),
            ]
        })
        .collect();
    let header = ["KEY", "HOLDER", "NODES", "TTL", "FENCE"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                let _ = write!(line, "{cell}");
            } else {
                let _ = write!(line, "{cell:w$}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// The inventory as one JSON object (schema in docs/cli.md).
fn to_json(prefix: &str, inventory: &Inventory) -> Value {
    json!({
        "schema": JSON_SCHEMA,
        "prefix": prefix,
        "nodes": inventory.nodes,
        "quorum": inventory.quorum,
        "truncated": inventory.truncated,
        "failures": inventory.failures.iter().map(|f| json!({
            "node": f.node,
            "error": f.cause.to_string(),
            "error_kind": f.cause.kind(),
        })).collect::<Vec<_>>(),
        "locks": inventory.locks.iter().map(|l| json!({
            "key": l.key,
            "value": l.value,
            "owner": l.owner,
            "held_on": l.held_on,
            "certain": l.certain,
            "ttl_ms": l.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            "fence": l.fence.get(),
        })).collect::<Vec<_>>(),
    })
}
