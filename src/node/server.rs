//! What a connect reads of a server (`connection.rs` sends it): its `INFO` (run id, uptime,
//! replication: its identity and whether it was promoted during its current process) and the
//! settings the guards need (`CONFIG GET`), in one round trip; the durability marker.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// The settings read from a node with `CONFIG GET`; `None` where unreadable.
#[derive(Debug, Default)]
pub(crate) struct NodeConfig {
    pub(super) appendfsync: Option<String>,
    pub(super) maxmemory: Option<String>,
    pub(super) policy: Option<String>,
}

/// The settings a connect reads with `CONFIG GET`.
const SETTINGS: [&str; 3] = ["appendfsync", "maxmemory", "maxmemory-policy"];

/// Reads what a connect needs in one round trip on Redis ≥ 7: the `INFO` sections the guards
/// and the fenced acquire read (server, persistence, replication; one reply) and `appendfsync`,
/// `maxmemory` and `maxmemory-policy` (one `CONFIG GET`). An older server takes one section and
/// one setting per command and refuses both: it then gets its default `INFO` (which holds those
/// sections) and one `CONFIG GET` per setting, in a second round trip. A refused `INFO` is an
/// error (the connect fails). A refused `CONFIG GET` (renamed or forbidden, as managed services
/// do) leaves every setting unknown: the node is then treated as one that may lose its last
/// writes in a restart, and its eviction risk is reported as unknown; the connect goes on.
///
/// The same round trip asks the server to run a script (`EVAL "return 1" 0`): its reply is
/// returned as it came, for the connect to tell a server that cannot run scripts.
pub(crate) async fn read_settings(
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<(String, NodeConfig, Option<redis::Value>)> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("INFO")
        .arg("server")
        .arg("persistence")
        .arg("replication");
    pipe.cmd("CONFIG").arg("GET").arg(&SETTINGS[..]);
    pipe.cmd("EVAL").arg("return 1").arg(0);
    let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    let mut replies = replies.into_iter();
    let (info, config, eval) = (replies.next(), replies.next(), replies.next());
    if let Some(Ok(info)) = info.map(redis::Value::extract_error) {
        let config = config.map_or_else(NodeConfig::default, NodeConfig::from_reply);
        return Ok((redis::from_redis_value(info)?, config, eval));
    }
    let info: String = redis::cmd("INFO").query_async(conn).await?;
    let mut pipe = redis::pipe();
    for name in SETTINGS {
        pipe.cmd("CONFIG").arg("GET").arg(name);
    }
    let replies: redis::RedisResult<Vec<redis::Value>> = pipe.query_async(conn).await;
    let config = match replies {
        Ok(replies) => {
            let pairs = replies.into_iter().filter_map(config_pairs).flatten();
            NodeConfig::from_pairs(pairs.collect())
        }
        Err(_) => NodeConfig::default(),
    };
    Ok((info, config, eval))
}

impl NodeConfig {
    /// The settings in a `CONFIG GET` reply; all unknown if it is an error.
    fn from_reply(reply: redis::Value) -> Self {
        config_pairs(reply).map_or_else(NodeConfig::default, NodeConfig::from_pairs)
    }

    fn from_pairs(pairs: Vec<(String, String)>) -> Self {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        NodeConfig {
            appendfsync: get(SETTINGS[0]),
            maxmemory: get(SETTINGS[1]),
            policy: get(SETTINGS[2]),
        }
    }
}

/// The `(name, value)` pairs of a `CONFIG GET` reply: a flat list `[name, value, ...]` (RESP2)
/// or a map `{name: value}` (RESP3, a `?protocol=resp3` URL or a user's RESP3 client); `None`
/// for any other shape (an error).
pub(crate) fn config_pairs(reply: redis::Value) -> Option<Vec<(String, String)>> {
    let text = |v: redis::Value| redis::from_redis_value::<String>(v).ok();
    match reply {
        redis::Value::Array(flat) => {
            let mut items = flat.into_iter();
            let mut pairs = Vec::new();
            while let (Some(name), Some(value)) = (items.next(), items.next()) {
                pairs.push((text(name)?, text(value)?));
            }
            Some(pairs)
        }
        redis::Value::Map(map) => map
            .into_iter()
            .map(|(name, value)| Some((text(name)?, text(value)?)))
            .collect(),
        _ => None,
    }
}

/// Writes the node's durability marker (`key`: `P:durability-marker`) if it has none (`SET NX`,
/// the current run id: acknowledged only once fsynced under `appendfsync always`) and reads it
/// back. Written once on a node that runs with `appendfsync always`, holding the run id of the
/// server it was written to; found after a restart holding an earlier run id, it shows the
/// keyspace survived the restart. `None` on any error (a node out of memory under `noeviction`,
/// a user whose ACL refuses the key, say): the node's data is then not trusted to survive.
pub(crate) async fn durability_marker(
    conn: &mut MultiplexedConnection,
    key: &str,
    run_id: &str,
) -> Option<String> {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(key)
        .arg(run_id)
        .arg("NX")
        .ignore()
        .cmd("GET")
        .arg(key);
    let reply: redis::RedisResult<(Option<String>,)> = pipe.query_async(conn).await;
    reply.ok().and_then(|(marker,)| marker)
}

pub(crate) fn parse_info(info: &str) -> Option<(String, Duration)> {
    let mut run_id = None;
    let mut uptime = None;
    for line in info.lines() {
        if let Some(v) = line.strip_prefix("run_id:") {
            run_id = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("uptime_in_seconds:") {
            uptime = v.trim().parse().ok().map(Duration::from_secs);
        }
    }
    Some((run_id?, uptime?))
}

/// The identity the restart guard compares across connects for a server that may change role
/// (a Sentinel member's primary, a Cluster master): its run id and its replication id
/// (`master_replid` in `INFO replication`). A restart changes the run id; a promotion, even of a
/// server demoted and promoted back within one process (a failback), gives it a new
/// replication id while the run id stays. An unreadable replication id reads as `?` (a later
/// readable one then differs: the conservative direction).
pub(crate) fn server_identity(run_id: &str, info_replication: &str) -> String {
    let replid = info_replication
        .lines()
        .find_map(|l| l.strip_prefix("master_replid:"))
        .map_or("?", str::trim);
    format!("{run_id}/{replid}")
}

/// Whether an `INFO replication` reply shows a server promoted from a replica during its
/// current process: Redis keeps its replication id from before the promotion as
/// `master_replid2`, and `second_repl_offset` is then the offset where it took over (`-1` on a
/// server that was never a replica since it started). An unreadable reply counts as promoted
/// (the conservative reading: the server is held out as if it had just started).
pub(crate) fn promoted(info_replication: &str) -> bool {
    info_replication
        .lines()
        .find_map(|l| l.strip_prefix("second_repl_offset:"))
        .is_none_or(|v| v.trim() != "-1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_get_replies_are_read_in_both_protocols() {
        use redis::Value;
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("maxmemory"),
            bulk("0"),
            bulk("maxmemory-policy"),
            bulk("volatile-lru"),
        ]);
        let resp3 = Value::Map(vec![
            (bulk("maxmemory-policy"), bulk("volatile-lru")),
            (bulk("maxmemory"), bulk("0")),
        ]);
        for reply in [resp2, resp3] {
            let config = NodeConfig::from_reply(reply);
            assert_eq!(config.policy.as_deref(), Some("volatile-lru"));
            assert_eq!(config.maxmemory.as_deref(), Some("0"));
            assert_eq!(config.appendfsync, None);
        }
        assert_eq!(config_pairs(Value::Array(vec![])), Some(vec![]));
        assert_eq!(config_pairs(Value::Map(vec![])), Some(vec![]));
        assert_eq!(config_pairs(Value::Nil), None);
        assert_eq!(NodeConfig::from_reply(Value::Nil).policy, None);
    }

    #[test]
    fn the_identity_of_a_server_that_may_change_role_carries_its_replication_id() {
        let info = "# Replication\r\nrole:master\r\nmaster_replid:abc\r\nmaster_replid2:000\r\n";
        assert_eq!(server_identity("run1", info), "run1/abc");
        assert_eq!(server_identity("run1", "# Replication\r\n"), "run1/?");
    }

    #[test]
    fn a_promotion_shows_in_info_replication() {
        let never = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:ab\r\n\
                     master_replid2:0000000000000000000000000000000000000000\r\n\
                     master_repl_offset:0\r\nsecond_repl_offset:-1\r\n";
        assert!(!promoted(never));
        let after = never.replace("second_repl_offset:-1", "second_repl_offset:1234");
        assert!(promoted(&after));
        assert!(promoted("# Replication\r\nrole:master\r\n"));
    }

    #[test]
    fn info_parsing_finds_run_id_and_uptime() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        assert_eq!(
            parse_info(info),
            Some(("abc123".to_owned(), Duration::from_secs(42)))
        );
        assert_eq!(parse_info("garbage"), None);
    }
}
