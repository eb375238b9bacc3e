//! Inventory I/O on one node: the lock keys under a prefix, page by page (`SCAN`), each with
//! its value, remaining time and fencing counter. The merge across nodes is the client's
//! (`client/inventory.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::Node;
use super::cluster;
use super::member::MemberConn;
use crate::core::keys::KeyLayout;
use crate::error::NodeError;

/// One lock key as one node holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// The user key.
    pub(crate) key: String,
    /// The value there (`None`: it expired between the scan and the read), its bytes read as
    /// UTF-8 with invalid sequences replaced (as `status` shows values): another client's value
    /// may be any bytes (rslock's: 20 random ones), and one such key must not fail the page.
    pub(crate) value: Option<String>,
    /// Its remaining time in milliseconds (`PTTL`: negative when absent or without expiry).
    pub(crate) pttl: i64,
    /// The node's fencing counter for the key's slot.
    pub(crate) fence: u64,
}

impl Node {
    /// One page of the lock keys matching `glob` from `cursor`: the next cursor (0 when the
    /// scan is complete) and what the page found, bounded by `timeout`. On a standalone server:
    /// `SCAN`, then one pipeline of `MGET` (values), a `PTTL` per key and `MGET` (counters). On
    /// a Cluster member: the masters one after the other (`SCAN` + `INFO`, the run id checked
    /// as a repair does), then `MGET` (one key), `PTTL`, `GET` per key, each routed by its slot.
    pub(crate) async fn lock_keys_page(
        self: &Arc<Self>,
        keys: &KeyLayout,
        glob: &str,
        cursor: u64,
        count: usize,
        timeout: Duration,
    ) -> Result<(u64, Vec<Found>), NodeError> {
        let read = async {
            let (mut conn, generation) = self.connection().await?;
            let (next, scanned) = match &mut conn {
                MemberConn::Cluster(cluster) => {
                    let masters = crate::core::lock(&self.cluster).masters.clone();
                    let (next, found, run_id) =
                        cluster::cluster_scan_page(cluster, &masters, cursor, glob, count)
                            .await
                            .map_err(|e| self.call_error(e, generation))?;
                    self.check_cluster_run_ids([run_id], generation)?;
                    (next, found)
                }
                MemberConn::Single(_) => {
                    self.scan_page(&mut conn, cursor, glob, count, generation)
                        .await?
                }
            };
            let locks: Vec<(String, String, String)> = scanned
                .iter()
                .filter_map(|k| {
                    let key = keys.user_key_of(k)?;
                    let lock = String::from_utf8_lossy(k).into_owned();
                    let fence = keys.fence_key(&key);
                    Some((key, lock, fence))
                })
                .collect();
            if locks.is_empty() {
                return Ok((next, Vec::new()));
            }
            let found = match &conn {
                MemberConn::Cluster(cluster) => {
                    let reads = locks.iter().map(|(_, lock, fence)| {
                        let mut cluster = cluster.clone();
                        let mut pipe = redis::pipe();
                        // `MGET` of one key: nil for a key of another type in the namespace,
                        // as on a standalone server, where `GET` would fail the whole page.
                        pipe.cmd("MGET").arg(lock).cmd("PTTL").arg(lock);
                        pipe.cmd("GET").arg(fence);
                        async move {
                            let (mut value, pttl, fence) = pipe
                                .query_async::<(Vec<Option<Vec<u8>>>, i64, Option<u64>)>(
                                    &mut cluster,
                                )
                                .await?;
                            Ok::<_, redis::RedisError>((value.pop().flatten(), pttl, fence))
                        }
                    });
                    futures::future::try_join_all(reads)
                        .await
                        .map_err(|e| self.call_error(e, generation))?
                }
                MemberConn::Single(_) => self.read_pipelined(&mut conn, &locks, generation).await?,
            };
            let found = locks
                .into_iter()
                .zip(found)
                .map(|((key, _, _), (value, pttl, fence))| Found {
                    key,
                    value: value.map(|v| String::from_utf8_lossy(&v).into_owned()),
                    pttl,
                    fence: fence.unwrap_or(0),
                })
                .collect();
            Ok((next, found))
        };
        tokio::time::timeout(timeout, read)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }

    /// The value, `PTTL` and counter of each of `locks` (user key, lock key, counter key) on a
    /// standalone server: one pipeline of `MGET` (values), a `PTTL` per key and `MGET`
    /// (counters).
    async fn read_pipelined(
        &self,
        conn: &mut MemberConn,
        locks: &[(String, String, String)],
        generation: u64,
    ) -> Result<Vec<(Option<Vec<u8>>, i64, Option<u64>)>, NodeError> {
        let mut pipe = redis::pipe();
        pipe.cmd("MGET");
        for (_, lock, _) in locks {
            pipe.arg(lock);
        }
        for (_, lock, _) in locks {
            pipe.cmd("PTTL").arg(lock);
        }
        pipe.cmd("MGET");
        for (_, _, fence) in locks {
            pipe.arg(fence);
        }
        let replies: Vec<redis::Value> = pipe
            .query_async(conn)
            .await
            .map_err(|e| self.call_error(e, generation))?;
        if replies.len() != locks.len() + 2 {
            return Err(NodeError::BadReply {
                expected: "an MGET of values, a PTTL per key and an MGET of counters",
                got: format!("{} replies for {} keys", replies.len(), locks.len()),
            });
        }
        let fences: Vec<Option<u64>> = parse(&replies[replies.len() - 1], "an MGET of counters")?;
        let values: Vec<Option<Vec<u8>>> = parse(&replies[0], "an MGET of values")?;
        let pttls: Vec<i64> = replies[1..replies.len() - 1]
            .iter()
            .map(|v| parse(v, "a PTTL"))
            .collect::<Result<_, _>>()?;
        if values.len() != locks.len() {
            return Err(NodeError::BadReply {
                expected: "a value per key",
                got: format!("{} values for {} keys", values.len(), locks.len()),
            });
        }
        Ok(values
            .into_iter()
            .zip(pttls)
            .zip(fences)
            .map(|((v, p), f)| (v, p, f))
            .collect())
    }
}

/// One reply of the inventory's pipeline read as `T`, or what it was instead.
fn parse<T: redis::FromRedisValue>(
    v: &redis::Value,
    expected: &'static str,
) -> Result<T, NodeError> {
    T::from_redis_value_ref(v).map_err(|_| NodeError::unexpected(expected, v))
}
