//! Repair I/O on one node: reading its fencing counters page by page (`SCAN` + `MGET`) and
//! raising them (one pipeline of `EVALSHA`s). What to repair, from where and when is decided by
//! the client (`client/repair.rs`) and the pure rules in [`crate::core::repair`].

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::Node;
use super::cluster;
use super::member::MemberConn;
use super::scripts;
use crate::core::keys::KeyLayout;
use crate::error::NodeError;

impl Node {
    /// One page of a `SCAN` for fencing counters, from `cursor`: the next cursor (0 when the
    /// scan is complete) and the page's counters, `(counter key, value)` (`SCAN ... COUNT
    /// count` then one `MGET`), bounded by `timeout`. Keys the glob matches that are not
    /// counters (see [`crate::core::keys`]) are dropped before the `MGET`.
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
                        cluster::cluster_scan_page(cluster, &masters, cursor, &glob, count)
                            .await
                            .map_err(|e| self.call_error(e, generation))?;
                    self.check_cluster_run_ids([run_id], generation)?;
                    (next, found)
                }
                MemberConn::Single(_) => {
                    self.scan_page(&mut conn, cursor, &glob, count, generation)
                        .await?
                }
            };
            let found: Vec<Vec<u8>> = found.into_iter().filter(|k| keys.is_counter(k)).collect();
            let counters = self.counter_values(&mut conn, found, generation).await?;
            Ok((next, counters))
        };
        tokio::time::timeout(timeout, read)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }

    /// One `SCAN ... MATCH glob COUNT count` page of a single server from `cursor`: the next
    /// cursor and the keys found.
    pub(super) async fn scan_page(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        cursor: u64,
        glob: &str,
        count: usize,
        generation: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), NodeError> {
        super::commands::scan_page(cursor, glob, count)
            .query_async(conn)
            .await
            .map_err(|e| self.call_error(e, generation))
    }

    /// The values of the counters `found` on one page (one `MGET`), with their keys; a counter
    /// whose value is not a number is left out.
    pub(super) async fn counter_values(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        found: Vec<Vec<u8>>,
        generation: u64,
    ) -> Result<Vec<(Vec<u8>, u64)>, NodeError> {
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&found)
            .query_async(conn)
            .await
            .map_err(|e| self.call_error(e, generation))?;
        Ok(found
            .into_iter()
            .zip(values)
            .filter_map(|(k, v)| Some((k, v?.parse().ok()?)))
            .collect())
    }

    /// Raises this node's counters to at least the given values, in one pipeline of `EVALSHA`s
    /// bounded by `timeout`. A `NOSCRIPT` reply (the script is not in the node's cache) sends
    /// one `EVAL` with the body, which caches it, and the pipeline again: raising is
    /// idempotent. A node that refuses `EVALSHA` gets the pipeline as `EVAL`s with the body.
    pub(crate) async fn raise_counters(
        self: &Arc<Self>,
        counters: &[(Vec<u8>, u64)],
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let pipeline = |by_eval: bool| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (key, value) in counters {
                if by_eval {
                    pipe.cmd("EVAL").arg(scripts::RAISE_COUNTER.code());
                } else {
                    pipe.cmd("EVALSHA")
                        .arg(scripts::RAISE_COUNTER.script().get_hash());
                }
                pipe.arg(1).arg(key).arg(*value);
            }
            pipe
        };
        let write = async {
            let (mut conn, generation) = self.connection().await?;
            if let MemberConn::Cluster(cluster) = &conn {
                return self.raise_on_cluster(cluster, counters, generation).await;
            }
            let mut loaded = false;
            // At most: EVALSHA, NOSCRIPT and one EVAL, EVALSHA again; or EVALSHA refused, EVAL.
            for _ in 0..3 {
                let by_eval = self.scripts_by_eval();
                let replies: Vec<Value> = pipeline(by_eval)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?;
                let error = replies.into_iter().find_map(|v| match v {
                    Value::ServerError(e) => Some(redis::RedisError::from(e)),
                    _ => None,
                });
                let Some(e) = error else {
                    return Ok(());
                };
                if by_eval || (loaded && !self.evalsha_refused(&e)) {
                    return Err(self.call_error(e, generation));
                }
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                    && let Some((key, value)) = counters.first()
                {
                    tracing::debug!(node = %self.name, "NOSCRIPT while raising counters; sending the script");
                    scripts::raise_counter_eval(key, *value)
                        .query_async::<Value>(&mut conn)
                        .await
                        .map_err(|e| self.call_error(e, generation))?;
                    loaded = true;
                } else if !self.evalsha_refused(&e) {
                    return Err(self.call_error(e, generation));
                }
            }
            Err(NodeError::BadReply {
                expected: "the counter raise script run by EVALSHA or EVAL",
                got: "a refusal of both".to_owned(),
            })
        };
        tokio::time::timeout(timeout, write)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }
}
