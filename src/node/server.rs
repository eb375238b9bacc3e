//! What a connect reads of a server (`connection.rs` sends it): its `INFO` (run id, uptime,
//! replication: its identity and whether it was promoted during its current process; memory:
//! the eviction settings) and, only where `INFO` lacks them, the settings the guards need
//! (`CONFIG GET`); the durability marker.

use std::time::Duration;

use super::link::Single;

/// The settings the guards need; `None` where unread.
#[derive(Debug, Default)]
pub(crate) struct NodeConfig {
    pub(super) appendfsync: Option<String>,
    pub(super) maxmemory: Option<String>,
    pub(super) policy: Option<String>,
    /// The settings a guard needed and could not read (`CONFIG GET` refused or renamed), by
    /// their Redis names.
    pub(super) unread: Vec<&'static str>,
}

/// The settings the guards may need, by their `CONFIG GET` names.
const SETTINGS: [&str; 3] = ["appendfsync", "maxmemory", "maxmemory-policy"];

/// The same settings' fields in `INFO` (`appendfsync` has none).
const INFO_FIELDS: [Option<&str>; 3] = [None, Some("maxmemory:"), Some("maxmemory_policy:")];

/// Reads what a connect needs, in one round trip where `INFO` holds it all: the `INFO` sections
/// the guards and the fenced acquire read (server, persistence, replication, memory; one reply
/// on Redis ≥ 7), whose memory section carries `maxmemory` and `maxmemory_policy` (the eviction
/// guard). `appendfsync` is needed only where `aof_enabled:1` (a node without AOF is never taken
/// for durable), and is not in `INFO`: only such a node gets a `CONFIG GET`, in a second round
/// trip, as does a server whose `INFO` lacks a memory field. An older server takes one section
/// per `INFO` and one setting per `CONFIG GET` and refuses both: it gets its default `INFO`
/// (which holds those sections) and one `CONFIG GET` per setting still missing. A refused `INFO`
/// is an error (the connect fails). A refused `CONFIG GET` (renamed or forbidden, as managed
/// services do) leaves those settings unread ([`NodeConfig::unread`]): a node whose
/// `appendfsync` is unread is treated as one that may lose its last writes in a restart, one
/// whose eviction settings are unread has its eviction risk reported as unknown; the connect
/// goes on.
///
/// The first round trip also asks the server to run a script (`EVAL "return 1" 0`): its reply
/// is returned as it came, for the connect to tell a server that cannot run scripts.
pub(crate) async fn read_settings(
    conn: &mut Single,
) -> redis::RedisResult<(String, NodeConfig, Option<redis::Value>)> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("INFO")
        .arg("server")
        .arg("persistence")
        .arg("replication")
        .arg("memory");
    pipe.cmd("EVAL").arg("return 1").arg(0);
    let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    let mut replies = replies.into_iter();
    let (info, eval) = (replies.next(), replies.next());
    let (info, modern) = match info.map(redis::Value::extract_error) {
        Some(Ok(info)) => (redis::from_redis_value::<String>(info)?, true),
        _ => (redis::cmd("INFO").query_async(conn).await?, false),
    };
    let mut config = NodeConfig::from_info(&info);
    let missing = config.missing(&info);
    if !missing.is_empty() {
        let mut pipe = redis::pipe();
        if modern {
            pipe.cmd("CONFIG").arg("GET").arg(&missing[..]);
        } else {
            for name in &missing {
                pipe.cmd("CONFIG").arg("GET").arg(name);
            }
        }
        let replies: redis::RedisResult<Vec<redis::Value>> = pipe.query_async(conn).await;
        let pairs: Vec<(String, String)> = match replies {
            Ok(replies) => replies
                .into_iter()
                .filter_map(config_pairs)
                .flatten()
                .collect(),
            Err(_) => Vec::new(),
        };
        config.fill(&pairs, &missing);
    }
    Ok((info, config, eval))
}

impl NodeConfig {
    /// The settings `INFO` carries (the memory section's).
    fn from_info(info: &str) -> Self {
        let field = |name: Option<&str>| {
            let name = name?;
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        NodeConfig {
            appendfsync: None,
            maxmemory: field(INFO_FIELDS[1]),
            policy: field(INFO_FIELDS[2]),
            unread: Vec::new(),
        }
    }

    /// The settings a guard needs that `INFO` did not give, by their `CONFIG GET` names.
    fn missing(&self, info: &str) -> Vec<&'static str> {
        let aof = info.lines().any(|l| l.trim() == "aof_enabled:1");
        [
            (SETTINGS[0], aof),
            (SETTINGS[1], self.maxmemory.is_none()),
            (SETTINGS[2], self.policy.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, needed)| needed.then_some(name))
        .collect()
    }

    /// Takes the `missing` settings from a `CONFIG GET` reply's pairs; those absent stay unread.
    fn fill(&mut self, pairs: &[(String, String)], missing: &[&'static str]) {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        for &name in missing {
            let value = get(name);
            if value.is_none() {
                self.unread.push(name);
            }
            match name {
                "appendfsync" => self.appendfsync = value,
                "maxmemory" => self.maxmemory = value,
                _ => self.policy = value,
            }
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
    conn: &mut Single,
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
            let mut config = NodeConfig::default();
            let missing = ["appendfsync", "maxmemory", "maxmemory-policy"];
            config.fill(&config_pairs(reply).unwrap(), &missing);
            assert_eq!(config.policy.as_deref(), Some("volatile-lru"));
            assert_eq!(config.maxmemory.as_deref(), Some("0"));
            assert_eq!(config.appendfsync, None);
            assert_eq!(config.unread, ["appendfsync"]);
        }
        assert_eq!(config_pairs(Value::Array(vec![])), Some(vec![]));
        assert_eq!(config_pairs(Value::Map(vec![])), Some(vec![]));
        assert_eq!(config_pairs(Value::Nil), None);
    }

    #[test]
    fn info_memory_gives_the_eviction_settings_and_only_aof_needs_config_get() {
        let info = "# Persistence\r\naof_enabled:0\r\n# Memory\r\nmaxmemory:1048576\r\n\
                    maxmemory_human:1.00M\r\nmaxmemory_policy:allkeys-lru\r\n";
        let config = NodeConfig::from_info(info);
        assert_eq!(config.maxmemory.as_deref(), Some("1048576"));
        assert_eq!(config.policy.as_deref(), Some("allkeys-lru"));
        assert!(config.missing(info).is_empty());
        let aof = info.replace("aof_enabled:0", "aof_enabled:1");
        assert_eq!(config.missing(&aof), ["appendfsync"]);
        let bare = "# Persistence\r\naof_enabled:0\r\n";
        assert_eq!(
            NodeConfig::from_info(bare).missing(bare),
            ["maxmemory", "maxmemory-policy"]
        );
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
