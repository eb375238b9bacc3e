//! The plain commands (no lock script) that the layers above send: the waiting client's reads
//! of the holder's key and its waiters marker (run here, on the node's one connection,
//! [`Node::with_connection`], bounded by the caller's deadline), and the commands of the features
//! on top that the client sends to every node (run-once markers, an election's record and
//! notices: built here, sent by `client/side.rs`); and the `SCAN` page that a repair reads on a
//! standalone server and on each master of a Cluster member. No layer above assembles a raw
//! command.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Node;
use crate::error::NodeError;

impl Node {
    /// The key's remaining time in milliseconds (`PTTL`): `-2` absent, `-1` no expiry.
    pub(crate) async fn pttl(
        self: &Arc<Self>,
        key: &str,
        deadline: Instant,
    ) -> Result<i64, NodeError> {
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(key);
        self.with_connection(
            |mut conn| async move { cmd.query_async::<i64>(&mut conn).await },
            deadline,
        )
        .await
    }

    /// Adds the client `id` to the waiters marker `marker` (a set, also the release channel's
    /// name), sets the waiters count beside it and both expiries to `ttl`, in one script call
    /// (`lua.rs`, `MARK_WAITING`).
    pub(crate) async fn mark_waiting(
        self: &Arc<Self>,
        marker: &str,
        id: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(), NodeError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut eval = redis::cmd("EVAL");
        eval.arg(super::lua::MARK_WAITING.code())
            .arg(2)
            .arg(marker)
            .arg(crate::core::keys::waiters_count_of(marker))
            .arg(id)
            .arg(ttl_ms);
        self.with_connection(
            |mut conn| async move { eval.query_async::<redis::Value>(&mut conn).await },
            deadline,
        )
        .await
        .map(drop)
    }
}

/// `GET key`.
pub(crate) fn get(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("GET");
    cmd.arg(key);
    cmd
}

/// `TYPE key` (reply: `string`, `none`, `hash`, ...).
pub(crate) fn key_type(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("TYPE");
    cmd.arg(key);
    cmd
}

/// `SET key value NX PX ttl_ms`: written only where the key is absent, expiring after
/// `ttl_ms`. The acquire with fencing off, and a run-once tick's marker. Sized once, the ttl
/// written as digits without a `String` in between.
pub(crate) fn set_nx_px(key: &str, value: &str, ttl_ms: u64) -> redis::Cmd {
    let mut set = redis::Cmd::with_capacity(6, 3 + key.len() + value.len() + 4 + 20);
    set.arg("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms);
    set
}

/// `PUBLISH channel message` (reply: the subscribers reached).
pub(crate) fn publish(channel: &str, message: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("PUBLISH");
    cmd.arg(channel).arg(message);
    cmd
}

/// `EVAL` of a script sent with its body (no `SCRIPT LOAD`, no `NOSCRIPT`): for the scripts a
/// feature runs rarely, such as an election's, once per term.
pub(crate) fn eval(body: &str, keys: &[&str], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
    cmd
}

/// `SCAN cursor MATCH glob COUNT count`: one page of a key scan (a repair's reading of the
/// fencing counters, on a standalone server or on each master of a Cluster member).
pub(crate) fn scan_page(cursor: u64, glob: &str, count: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(glob)
        .arg("COUNT")
        .arg(count);
    cmd
}
