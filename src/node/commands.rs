//! The plain commands (no script) that the waiting client sends one node: the holder's key's
//! remaining time, and the waiters marker. Built here, so that no layer above assembles a raw
//! command; each runs on the node's one connection ([`Node::with_connection`]), bounded by the
//! caller's deadline.

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
    /// name) and sets the marker's expiry to `ttl`, in one pipeline.
    pub(crate) async fn mark_waiting(
        self: &Arc<Self>,
        marker: &str,
        id: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(), NodeError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        pipe.cmd("SADD")
            .arg(marker)
            .arg(id)
            .ignore()
            .cmd("PEXPIRE")
            .arg(marker)
            .arg(ttl_ms)
            .ignore();
        self.with_connection(
            |mut conn| async move { pipe.query_async::<()>(&mut conn).await },
            deadline,
        )
        .await
    }
}
