//! Repair I/O on one node: reading its fencing counters page by page (`SCAN` + `MGET`) and
//! raising them (one pipeline of `EVALSHA`s). What to repair, from where and when is decided by
//! the client (`client/repair.rs`) and the pure rules in [`crate::core::repair`].

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::Node;
use super::member::{self, MemberConn};
use super::scripts;
use crate::core::keys::KeyLayout;
use crate::error::NodeError;

impl Node {
    /// One page of a `SCAN` for fencing counters, from `cursor`: the next cursor (0 when the
    /// scan is complete) and the page's counters, `(counter key, value)` (`SCAN ... COUNT
    /// count` then one `MGET`), bounded by `timeout`. Both layouts are read (the slot buckets and
    /// the legacy per-name counters, see [`crate::core::keys`]): one glob covers both, and keys of
    /// other shapes it matches are dropped before the `MGET`.
    pub(crate) async fn fence_counters_page(
        self: &Arc<Self>,
        keys: &KeyLayout,
        cursor: u64,
        count: usize,
        timeout: Duration,
    ) -> Result<(u64, Vec<(Vec<u8>, u64)>), NodeError> {
        let read = async {
            let (mut conn, generation) = self.connection().await?;
            let glob = keys.counter_glob();
            let (next, found): (u64, Vec<Vec<u8>>) = match &mut conn {
                // Master by master, each page checked against the run ids met on connect.
                MemberConn::Cluster(cluster) => {
                    let masters = crate::core::lock(&self.cluster).masters.clone();
                    let (next, found, run_id) =
                        member::cluster_scan_page(cluster, &masters, cursor, &glob, count)
                            .await
                            .map_err(|e| self.call_error(e, generation))?;
                    self.check_cluster_run_ids([run_id], generation)?;
                    (next, found)
                }
                MemberConn::Single(_) => redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&glob)
                    .arg("COUNT")
                    .arg(count)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?,
            };
            let found: Vec<Vec<u8>> = found.into_iter().filter(|k| keys.is_counter(k)).collect();
            let mut counters = Vec::with_capacity(found.len());
            if !found.is_empty() {
                let values: Vec<Option<String>> = redis::cmd("MGET")
                    .arg(&found)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?;
                counters.extend(
                    found
                        .into_iter()
                        .zip(values)
                        .filter_map(|(k, v)| Some((k, v?.parse().ok()?))),
                );
            }
            Ok((next, counters))
        };
        tokio::time::timeout(timeout, read)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }

    /// Raises this node's counters to at least the given values, in one pipeline of `EVALSHA`s
    /// bounded by `timeout`. A `NOSCRIPT` reply (the node's script cache was flushed) loads the
    /// script and sends the pipeline again: raising is idempotent.
    pub(crate) async fn raise_counters(
        self: &Arc<Self>,
        counters: &[(Vec<u8>, u64)],
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (key, value) in counters {
            pipe.cmd("EVALSHA")
                .arg(scripts::RAISE_COUNTER.script().get_hash())
                .arg(1)
                .arg(key)
                .arg(*value);
        }
        let write = async {
            let (mut conn, generation) = self.connection().await?;
            if let MemberConn::Cluster(cluster) = &conn {
                return self.raise_on_cluster(cluster, counters, generation).await;
            }
            let mut loaded = false;
            loop {
                let replies: Vec<Value> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?;
                let error = replies.into_iter().find_map(|v| match v {
                    Value::ServerError(e) => Some(e),
                    _ => None,
                });
                match error {
                    None => return Ok(()),
                    Some(e) if !loaded && e.kind() == Some(redis::ServerErrorKind::NoScript) => {
                        tracing::debug!(node = %self.name, "NOSCRIPT while raising counters; loading the script");
                        redis::cmd("SCRIPT")
                            .arg("LOAD")
                            .arg(scripts::RAISE_COUNTER.code())
                            .query_async::<String>(&mut conn)
                            .await
                            .map_err(|e| self.call_error(e, generation))?;
                        loaded = true;
                    }
                    Some(e) => return Err(NodeError::from_redis(e.into())),
                }
            }
        };
        tokio::time::timeout(timeout, write)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }
}
