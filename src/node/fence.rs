//! How a node takes the fenced acquire, and the migration that lets it take the fast one.
//!
//! A standalone server (or a Sentinel-managed primary) running Redis 7 or later gets the fenced
//! acquire as one write of two commands on its one connection, `SET lock value NX PX ttl GET`
//! then `INCR counter`, read as two replies: no Lua. Every other node (Redis 6, a Redis
//! Cluster member) runs the acquire script (`scripts::ACQUIRE`), which does the same in one
//! atomic step and also folds a lock's legacy per-name counter into its bucket. The argument
//! that the pipelined form keeps tokens strictly increasing is in `docs/safety.md`, "Fencing
//! tokens".
//!
//! The pipelined form does not look at legacy per-name counters (`P:{K}:fence`), so a node
//! takes it only once they are gone: the connect reads the node's migration marker
//! (`P:fence:migrated`, see [`crate::core::keys`]); if it does not hold the node's current run
//! id, the node stays on the script and a background migration (`client/migrate.rs`) scans the
//! node for legacy counters, folds each into its bucket (raise only, then `DEL`), writes the
//! marker with the run id it scanned, and switches the node's connection to the pipeline. A
//! marker is trusted only with the run id of the process that reads it: a restart (empty or
//! from an older snapshot) scans again once.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::{Pipeline, Value};

use super::Node;
use super::member::MemberConn;
use crate::core::keys::KeyLayout;
use crate::core::lock;
use crate::error::NodeError;

/// A node's choice between the script and the pipelined acquire.
#[derive(Debug, Default)]
pub(crate) struct FencePath {
    /// The migration marker's key; `None` when acquires carry no fencing counter (fencing off,
    /// compat mode): such a node never pipelines nor migrates.
    marker: Option<String>,
    /// Kept on the script whatever the node runs (testkit).
    force_script: bool,
    /// The connection generation whose acquires are pipelined (0: none).
    ready: AtomicU64,
    /// Whether `wanted` holds a migration to start (lets every round skip the mutex).
    want: AtomicBool,
    /// A migration the last connect asked for: its connection generation and the run id it
    /// must scan.
    wanted: Mutex<Option<(u64, String)>>,
}

impl FencePath {
    pub(crate) fn new(marker: Option<String>, force_script: bool) -> Self {
        FencePath {
            marker,
            force_script,
            ..FencePath::default()
        }
    }
}

/// The major version in an `INFO server` reply (`redis_version:7.0.15`).
pub(super) fn redis_major(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse().ok())
}

impl Node {
    /// The migration marker's key, when the connect must read it.
    pub(super) fn fence_marker(&self) -> Option<&str> {
        self.fence.marker.as_deref()
    }

    /// What a connect (generation `generation`) found: the server's major version and the
    /// marker's value. The node pipelines its acquires on this connection when it can and its
    /// legacy counters are folded; asks for a migration when it could but they may not be.
    pub(super) fn observe_fence(
        &self,
        generation: u64,
        major: Option<u32>,
        marker: Option<&str>,
        run_id: &str,
    ) {
        let path = &self.fence;
        path.ready.store(0, Ordering::Release);
        if path.marker.is_none() || path.force_script || major.is_none_or(|m| m < 7) {
            return;
        }
        if marker == Some(run_id) {
            path.ready.store(generation, Ordering::Release);
            tracing::debug!(node = %self.name, "acquires pipelined (SET NX PX GET + INCR)");
        } else {
            *lock(&path.wanted) = Some((generation, run_id.to_owned()));
            path.want.store(true, Ordering::Release);
        }
    }

    /// Whether acquires to this node are pipelined on its current connection (a hint for
    /// building a round's call: [`Self::pipelines_on`] decides per send).
    pub(crate) fn pipelines(&self) -> bool {
        self.fence.ready.load(Ordering::Acquire) != 0
    }

    /// Whether acquires on the connection of `generation` are pipelined.
    pub(super) fn pipelines_on(&self, generation: u64) -> bool {
        self.fence.ready.load(Ordering::Acquire) == generation
    }

    /// Claims the migration the last connect asked for (once): its connection generation and
    /// the run id to scan.
    pub(crate) fn claim_migration(&self) -> Option<(u64, String)> {
        if !self.fence.want.load(Ordering::Acquire) {
            return None;
        }
        let claimed = lock(&self.fence.wanted).take();
        self.fence.want.store(false, Ordering::Release);
        claimed
    }

    /// Whether the connection of `generation` is still the node's latest.
    pub(crate) fn connection_current(&self, generation: u64) -> bool {
        self.generation.load(Ordering::Acquire) == generation
    }

    /// Sends the pipelined acquire and reads its two replies as the script's one: the counter
    /// after `INCR` when our `SET` set the key, the holder's value (a bulk string) when another
    /// value holds it (the `INCR`'s reply is then ignored). Our `SET` followed by a failed
    /// `INCR` (an error reply such as `NOPERM`) is the node failing, as a script error is: the
    /// key we set there is undone like any failed node's.
    pub(super) async fn send_pipelined(
        &self,
        mut conn: redis::aio::MultiplexedConnection,
        pipe: &Pipeline,
        generation: u64,
    ) -> Result<Value, NodeError> {
        let replies = conn
            .send_packed_commands(pipe, 0, 2)
            .await
            .map_err(|e| self.call_error(e, generation))?;
        let mut replies = replies.into_iter();
        match (replies.next(), replies.next()) {
            (Some(Value::Nil), Some(Value::Int(counter))) => Ok(Value::Int(counter)),
            (Some(holder @ Value::BulkString(_)), _) => Ok(holder),
            (Some(Value::ServerError(e)), _) | (Some(Value::Nil), Some(Value::ServerError(e))) => {
                Err(self.call_error(e.into(), generation))
            }
            other => Err(NodeError::BadReply(format!("{other:?}"))),
        }
    }

    /// One page of a migration's `SCAN` for legacy per-name counters, from `cursor`: the next
    /// cursor (0 when complete) and the page's counters with their values, bounded by
    /// `timeout`.
    pub(crate) async fn legacy_counters_page(
        self: &Arc<Self>,
        keys: &KeyLayout,
        cursor: u64,
        count: usize,
        timeout: Duration,
    ) -> Result<(u64, Vec<(Vec<u8>, u64)>), NodeError> {
        let read = async {
            let (conn, generation) = self.connection().await?;
            let MemberConn::Single(mut conn) = conn else {
                return Ok((0, Vec::new()));
            };
            let (next, found) = self
                .scan_page(&mut conn, cursor, &keys.legacy_glob(), count, generation)
                .await?;
            let found: Vec<Vec<u8>> = found
                .into_iter()
                .filter(|k| keys.is_legacy_counter(k))
                .collect();
            let counters = self.counter_values(&mut conn, found, generation).await?;
            Ok((next, counters))
        };
        tokio::time::timeout(timeout, read)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }

    /// Folds legacy counters into their buckets: each bucket raised to at least the counter's
    /// value (raise only: never lowers a counter), then the legacy counters deleted. Nothing
    /// writes a legacy counter (no client of the old layout runs, see `CHANGELOG.md`; repairs
    /// write buckets), so a value read stays the value until the `DEL`.
    pub(crate) async fn fold_legacy(
        self: &Arc<Self>,
        keys: &KeyLayout,
        legacy: &[(Vec<u8>, u64)],
        timeout: Duration,
    ) -> Result<(), NodeError> {
        if legacy.is_empty() {
            return Ok(());
        }
        let buckets: Vec<(Vec<u8>, u64)> = legacy
            .iter()
            .map(|(k, v)| (keys.bucket_of(k), *v))
            .collect();
        self.raise_counters(&buckets, timeout).await?;
        let delete = async {
            let (conn, generation) = self.connection().await?;
            let MemberConn::Single(mut conn) = conn else {
                return Ok(());
            };
            let mut del = redis::cmd("DEL");
            for (k, _) in legacy {
                del.arg(k);
            }
            del.query_async::<()>(&mut conn)
                .await
                .map_err(|e| self.call_error(e, generation))
        };
        tokio::time::timeout(timeout, delete)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }

    /// Ends a migration of the connection of `generation`: writes the marker with the run id
    /// that was scanned, then pipelines that connection's acquires, unless it was replaced
    /// meanwhile (its successor's connect decides from the marker). True when switched.
    pub(crate) async fn finish_migration(
        self: &Arc<Self>,
        generation: u64,
        run_id: &str,
        timeout: Duration,
    ) -> Result<bool, NodeError> {
        let Some(marker) = self.fence.marker.as_deref() else {
            return Ok(false);
        };
        let write = async {
            let (conn, current) = self.connection().await?;
            let MemberConn::Single(mut conn) = conn else {
                return Ok(false);
            };
            if current != generation {
                return Ok(false);
            }
            redis::cmd("SET")
                .arg(marker)
                .arg(run_id)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| self.call_error(e, generation))?;
            Ok(true)
        };
        let written = tokio::time::timeout(timeout, write)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))?;
        if written && self.connection_current(generation) {
            self.fence.ready.store(generation, Ordering::Release);
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_major_version_is_read_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n";
        assert_eq!(redis_major(info), Some(7));
        assert_eq!(redis_major("redis_version:6.2.14\n"), Some(6));
        assert_eq!(redis_major("redis_version:10.0.0"), Some(10));
        assert_eq!(redis_major("run_id:abc"), None);
    }
}
