//! A Redis Cluster member's own I/O: what a connect learns of its masters (`ClusterView`:
//! addresses, run ids, promotions), a `SCAN` page over the masters one after the other, and
//! the calls that check the shard's identity on every script (`run_on_cluster`,
//! `raise_on_cluster`, `check_cluster_run_ids`). What a member is, and its URL, is
//! `member.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};

use super::Node;
use super::scripts::{self, ScriptCall};
use super::server::{parse_info, promoted, server_identity};
use crate::core::lock;
use crate::error::NodeError;

/// What a connect learns of a Cluster member's masters.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterView {
    /// Each master's `(host, port)`, sorted: the order of a repair's `SCAN` over them.
    pub(crate) masters: Vec<(String, u16)>,
    /// Each master's identity: its run id and replication id ([`server_identity`]), so that a
    /// master demoted and promoted back (the same run id) reads as changed.
    pub(crate) run_ids: BTreeSet<String>,
    /// The member's age for the restart guard: the smallest age among its masters, where a
    /// master promoted from a replica in its current process counts as just started (its
    /// uptime says nothing about when it was promoted, and asynchronous replication may have
    /// lost its old master's last writes).
    pub(crate) uptime: Duration,
}

impl ClusterView {
    /// The member's identity for the restart guard: every master's run id, sorted.
    pub(crate) fn run_id(&self) -> String {
        self.run_ids.iter().cloned().collect::<Vec<_>>().join(",")
    }
}

/// One `INFO <section>` from every master of the cluster: `(address, text)` per master.
async fn info_of_masters(
    conn: &mut ClusterConnection,
    section: &str,
) -> redis::RedisResult<Vec<(String, String)>> {
    let mut info = redis::cmd("INFO");
    info.arg(section);
    let reply = conn
        .route_command(
            info,
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await?;
    let Value::Map(per_node) = reply else {
        return Err(bad("INFO from every master: not a map of replies"));
    };
    per_node
        .into_iter()
        .map(|(addr, text)| {
            Ok((
                redis::from_redis_value(addr)?,
                redis::from_redis_value(text)?,
            ))
        })
        .collect()
}

/// Reads `INFO server` and `INFO replication` from every master of the cluster (two round
/// trips, on connect only).
pub(crate) async fn cluster_view(conn: &mut ClusterConnection) -> redis::RedisResult<ClusterView> {
    let servers = info_of_masters(conn, "server").await?;
    // A master missing from this reply (the slot map changed in between) counts as promoted:
    // the conservative reading.
    let replication = info_of_masters(conn, "replication").await?;
    let mut view = ClusterView {
        uptime: Duration::MAX,
        ..ClusterView::default()
    };
    for (addr, text) in servers {
        let (run_id, uptime) =
            parse_info(&text).ok_or_else(|| bad("INFO server lacks run_id or uptime"))?;
        let replication = replication.iter().find(|(a, _)| *a == addr);
        let was_replica = replication.is_none_or(|(_, text)| promoted(text));
        let run_id = server_identity(&run_id, replication.map_or("", |(_, text)| text));
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse().ok()?)))
            .ok_or_else(|| bad("a master address without a port"))?;
        view.masters.push((host, port));
        view.run_ids.insert(run_id);
        view.uptime = view
            .uptime
            .min(if was_replica { Duration::ZERO } else { uptime });
    }
    if view.masters.is_empty() {
        return Err(bad("no master answered INFO"));
    }
    view.masters.sort();
    Ok(view)
}

fn bad(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Parse, what))
}

/// Bits of a repair cursor over a Cluster member that hold the master's index; the rest hold
/// that master's own `SCAN` cursor.
const MASTER_SHIFT: u32 = 56;

/// One page of a `SCAN ... MATCH pattern COUNT count` over a Cluster member's masters, one
/// after the other: the cursor carries the master's index (top 8 bits) and its own cursor. 0
/// when every master was scanned. With the page, the run id of the master scanned, read after
/// the page (`INFO server` on the same master): the caller checks it is one it met, since the
/// cluster client reconnects to a restarted master without a word, and a cursor means nothing
/// to a new process.
pub(crate) async fn cluster_scan_page(
    conn: &mut ClusterConnection,
    masters: &[(String, u16)],
    cursor: u64,
    pattern: &str,
    count: usize,
) -> redis::RedisResult<(u64, Vec<Vec<u8>>, String)> {
    let index = usize::try_from(cursor >> MASTER_SHIFT).unwrap_or(usize::MAX);
    let own = cursor & ((1 << MASTER_SHIFT) - 1);
    let Some((host, port)) = masters.get(index) else {
        return Err(bad("a repair cursor past the cluster's masters"));
    };
    let scan = super::commands::scan_page(own, pattern, count);
    let route = || {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.clone(),
            port: *port,
        })
    };
    let reply = conn.route_command(scan, route()).await?;
    let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)?;
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let info: String = redis::from_redis_value(conn.route_command(info, route()).await?)?;
    let (run_id, _) = parse_info(&info).ok_or_else(|| bad("INFO server lacks run_id"))?;
    let mut replication = redis::cmd("INFO");
    replication.arg("replication");
    let replication: String =
        redis::from_redis_value(conn.route_command(replication, route()).await?)?;
    let run_id = server_identity(&run_id, &replication);
    if next >> MASTER_SHIFT != 0 {
        return Err(bad("a SCAN cursor too large to carry a master index"));
    }
    let next = match next {
        0 if index + 1 < masters.len() => u64::try_from(index + 1).unwrap_or(0) << MASTER_SHIFT,
        0 => 0,
        own => (u64::try_from(index).unwrap_or(0) << MASTER_SHIFT) | own,
    };
    Ok((next, keys, run_id))
}

/// Whether a Cluster member's reply to `call` is the acquire script's refusal naming our own
/// value: the cluster client re-sends a pipeline it could not read the answer of (its own
/// retries), and the second run finds the key the first one set. Read as a refusal, our own
/// key would count against us and the undo would skip the node (ours would stay until its
/// ttl); it is a failure instead. Only the acquire script answers with a bulk string.
fn resent_acquire(call: &ScriptCall, reply: &Value) -> bool {
    match reply {
        Value::BulkString(holder) => call
            .first_arg()
            .is_some_and(|ours| ours == holder.as_slice()),
        _ => false,
    }
}

impl Node {
    /// One script call on a Cluster member, with `INFO server` and `INFO replication` in the same
    /// pipeline (one round trip, one shard: the pipeline follows the script's key): an identity
    /// (run id and replication id) of that shard this client has not met means the shard
    /// restarted, failed over or failed back since the connect, behind
    /// the cluster client's own reconnect. The call then counts as failed and the connection is
    /// dropped: the next call reconnects, reads every master's run id, and the restart guard
    /// holds the member out and repairs it. The script is sent as `EVAL` (the shard may be new
    /// to its script cache); its body is a few hundred bytes.
    pub(super) async fn run_on_cluster(
        &self,
        conn: &mut ClusterConnection,
        call: &ScriptCall,
        generation: u64,
    ) -> Result<Value, NodeError> {
        let mut pipe = redis::pipe();
        match call.eval() {
            Some(eval) => pipe.add_command(eval),
            None => pipe.add_command(call.evalsha().clone()),
        };
        pipe.cmd("INFO").arg("server");
        pipe.cmd("INFO").arg("replication");
        let replies: Vec<Value> = pipe
            .query_async(conn)
            .await
            .map_err(|e| self.call_error(e, generation))?;
        let [reply, info, replication] =
            <[Value; 3]>::try_from(replies).map_err(|replies| NodeError::BadReply {
                expected: "3 replies to a pipeline of 3 commands",
                got: format!("{} replies", replies.len()),
            })?;
        let text = |v: &Value, expected| {
            <String as redis::FromRedisValue>::from_redis_value_ref(v)
                .map_err(|_| NodeError::unexpected(expected, v))
        };
        let info = text(&info, "INFO server as text")?;
        let replication = text(&replication, "INFO replication as text")?;
        let (run_id, _) = parse_info(&info).ok_or_else(|| NodeError::BadReply {
            expected: "INFO server with a run_id",
            got: "INFO server without one".to_owned(),
        })?;
        self.check_cluster_run_ids([server_identity(&run_id, &replication)], generation)?;
        let reply = reply
            .extract_error()
            .map_err(|e| self.call_error(e, generation))?;
        if resent_acquire(call, &reply) {
            return Err(NodeError::BadReply {
                expected: "the reply of the acquire's first run",
                got: "our own value, already holding the key: the cluster client sent this \
                      acquire again after it had run (a retry), so its counter is unknown; the \
                      member counts as failed and our key there is released with the others"
                    .to_owned(),
            });
        }
        Ok(reply)
    }

    /// Raises counters on a Cluster member: one `EVAL` per key (counters of different names live
    /// in different slots, and a pipeline must stay in one), all in flight at once; then every
    /// master's run id is checked, since a shard restarted meanwhile lost what was raised there
    /// and the repair must not end on it (the reconnect this forces makes a repair of its own).
    pub(super) async fn raise_on_cluster(
        &self,
        cluster: &ClusterConnection,
        counters: &[(Vec<u8>, u64)],
        generation: u64,
    ) -> Result<(), NodeError> {
        let raises = counters.iter().map(|(key, value)| {
            let mut conn = cluster.clone();
            async move {
                scripts::raise_counter_eval(key, *value)
                    .query_async::<Value>(&mut conn)
                    .await
            }
        });
        for reply in futures::future::join_all(raises).await {
            reply.map_err(|e| self.call_error(e, generation))?;
        }
        let view = cluster_view(&mut cluster.clone())
            .await
            .map_err(|e| self.call_error(e, generation))?;
        self.check_cluster_run_ids(view.run_ids, generation)
    }

    /// Checks that each identity (run id and replication id) read from a Cluster member's
    /// masters is one the last connect met; otherwise drops the connection (the next call
    /// reconnects and the restart guard sees the change) and fails.
    pub(super) fn check_cluster_run_ids(
        &self,
        run_ids: impl IntoIterator<Item = String>,
        generation: u64,
    ) -> Result<(), NodeError> {
        let known = lock(&self.cluster);
        if run_ids.into_iter().all(|id| known.run_ids.contains(&id)) {
            return Ok(());
        }
        drop(known);
        self.invalidate(generation);
        Err(NodeError::Dropped(redis::RedisError::from(
            std::io::Error::other(
                "a shard of this cluster member restarted, failed over or failed back (a run id or replication id not met before); reconnecting",
            ),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resent_acquire_is_told_from_another_owner() {
        let call = ScriptCall::fenced_acquire(
            "quorumlock:{job}",
            "quorumlock:fence:{x}",
            "ours",
            10_000,
            false,
        );
        assert_eq!(call.first_arg(), Some(&b"ours"[..]));
        assert!(resent_acquire(&call, &Value::BulkString(b"ours".to_vec())));
        assert!(!resent_acquire(
            &call,
            &Value::BulkString(b"theirs".to_vec())
        ));
        assert!(!resent_acquire(&call, &Value::Int(7)));
        let plain = ScriptCall::plain(redis::cmd("PING"));
        assert!(!resent_acquire(
            &plain,
            &Value::BulkString(b"ours".to_vec())
        ));
    }
}
