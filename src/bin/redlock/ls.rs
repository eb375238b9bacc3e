//! `redlock ls [PREFIX] [--older-than D] [--json]`: every lock held under a prefix (or only
//! those acquired more than D ago), one line each (or one JSON object).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use quorumlock::{HeldLock, Inventory, Redlock};
use serde_json::{Value, json};

use crate::fail;
use crate::status::seconds;

/// The version of the JSON document `--json` prints (its `schema` field).
const JSON_SCHEMA: u32 = 1;

/// Prints the table (or the JSON document); exits 0 when a quorum of nodes was scanned (the
/// nodes that were not are named on stderr), 69 otherwise. With `older_than`, only the locks
/// acquired more than that long ago are listed (those of unknown age are left out and counted
/// on stderr), and the exit code is 1 when none is.
pub(crate) async fn ls(
    locks: Redlock,
    prefix: &str,
    older_than: Option<Duration>,
    json: bool,
) -> u8 {
    let mut inventory = match locks.locks(prefix).await {
        Ok(i) => i,
        Err(e) => return fail(&e),
    };
    let now = SystemTime::now();
    let unknown_age = older_than.map_or(0, |d| keep_older(&mut inventory, d, now));
    if json {
        out!("{}", to_json(prefix, &inventory, older_than, unknown_age));
    } else {
        out!("{}", render(&inventory, now).trim_end());
    }
    if unknown_age > 0 {
        crate::report(&format_args!(
            "{unknown_age} lock{} of unknown age (values of other Redlock clients) not listed: \
             run without --older-than to see {}",
            if unknown_age == 1 { "" } else { "s" },
            if unknown_age == 1 { "it" } else { "them" },
        ));
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
    if older_than.is_some() && inventory.locks.is_empty() {
        return 1;
    }
    0
}

/// Keeps the locks acquired more than `d` before `now`; returns how many of unknown age were
/// dropped.
fn keep_older(inventory: &mut Inventory, d: Duration, now: SystemTime) -> usize {
    let unknown = inventory
        .locks
        .iter()
        .filter(|l| l.acquired_at.is_none())
        .count();
    inventory
        .locks
        .retain(|l| l.age(now).is_some_and(|age| age > d));
    unknown
}

/// A lock's age in whole seconds, humantime's units without spaces (`3h25m7s`, so that a
/// column stays one word for `awk`); `-` when unknown.
fn age_text(lock: &HeldLock, now: SystemTime) -> String {
    lock.age(now).map_or_else(
        || "-".to_owned(),
        |age| {
            humantime::format_duration(Duration::from_secs(age.as_secs()))
                .to_string()
                .replace(' ', "")
        },
    )
}

/// One line per lock, sorted by key, under a header:
///
/// ```text
/// KEY      HOLDER                                   NODES  AGE     TTL      FENCE
/// backup   019ac4e1f3b07d2e8c2d1f6a3b5e7c9d@host-a  5/5    3h25m7s  28.494s  7
/// nightly  9f0e1d2c3b4a59687766554433221100         3/5?   -       -        12
/// ```
///
/// `NODES` is how many nodes hold the value, of all configured; a `?` marks a lock that stands
/// on fewer than a quorum of the nodes that answered but may on the others. `AGE` is the time
/// since it was acquired (`-` when unknown: a value of another client). `TTL` is the time left
/// on a quorum (`-` when fewer than a quorum answered with it).
fn render(inventory: &Inventory, now: SystemTime) -> String {
    let rows: Vec<[String; 6]> = inventory
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
                age_text(l, now),
                l.ttl.map_or_else(|| "-".to_owned(), seconds),
                l.fence.to_string(),
            ]
        })
        .collect();
    let header = ["KEY", "HOLDER", "NODES", "AGE", "TTL", "FENCE"].map(str::to_owned);
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
fn to_json(
    prefix: &str,
    inventory: &Inventory,
    older_than: Option<Duration>,
    unknown_age: usize,
) -> Value {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    json!({
        "schema": JSON_SCHEMA,
        "prefix": prefix,
        "older_than_ms": older_than.map(ms),
        "unknown_age_not_listed": unknown_age,
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
            "acquired_at_ms": l.acquired_at
                .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
                .map(ms),
            "ttl_ms": l.ttl.map(ms),
            "fence": l.fence.get(),
        })).collect::<Vec<_>>(),
    })
}
