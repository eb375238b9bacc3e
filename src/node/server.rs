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

/// The `INFO` fields a connect reads, in [`ServerInfo::parse`]'s order.
const INFO_FIELDS: [&str; 9] = [
    "redis_version",
    "run_id",
    "uptime_in_seconds",
    "server_time_usec",
    "aof_enabled",
    "maxmemory",
    "maxmemory_policy",
    "master_replid",
    "second_repl_offset",
];

/// What a connect reads of a server's `INFO` reply (server, persistence, replication and
/// memory sections), found in one pass over its lines: each field's value, trimmed, from the
/// first line that gives it; `None` where no line does.
#[derive(Debug, Default)]
pub(crate) struct ServerInfo {
    fields: [Option<String>; INFO_FIELDS.len()],
}

impl ServerInfo {
    pub(crate) fn parse(info: &str) -> Self {
        let mut fields: [Option<String>; INFO_FIELDS.len()] = Default::default();
        for line in info.lines() {
            let line = line.trim();
            // A field's line is its name, a colon, its value.
            let named =
                |f: &&str| line.as_bytes().get(f.len()) == Some(&b':') && line.starts_with(*f);
            if let Some(i) = INFO_FIELDS.iter().position(named)
                && fields[i].is_none()
            {
                fields[i] = Some(line[INFO_FIELDS[i].len() + 1..].trim().to_owned());
            }
        }
        ServerInfo { fields }
    }

    fn field(&self, name: &str) -> Option<&str> {
        let i = INFO_FIELDS.iter().position(|f| *f == name)?;
        self.fields[i].as_deref()
    }

    /// The run id and the uptime (the restart guard cannot work without them).
    pub(crate) fn run_id_and_uptime(&self) -> Option<(String, Duration)> {
        let uptime = self.field("uptime_in_seconds")?.parse().ok()?;
        Some((
            self.field("run_id")?.to_owned(),
            Duration::from_secs(uptime),
        ))
    }

    /// The major version (`redis_version:7.0.15`).
    pub(crate) fn major(&self) -> Option<u32> {
        self.field("redis_version")?.split('.').next()?.parse().ok()
    }

    /// The server's wall clock (`server_time_usec`, Redis 6.2 and later).
    pub(crate) fn server_time(&self) -> Option<Duration> {
        let micros = self.field("server_time_usec")?.parse().ok()?;
        Some(Duration::from_micros(micros))
    }

    /// Whether AOF is on (`aof_enabled:1`).
    pub(crate) fn aof(&self) -> bool {
        self.field("aof_enabled") == Some("1")
    }

    /// Whether the server was promoted from a replica during its current process: Redis keeps
    /// its replication id from before the promotion as `master_replid2`, and
    /// `second_repl_offset` is then the offset where it took over (`-1` on a server that was
    /// never a replica since it started). An unreadable reply counts as promoted (the
    /// conservative reading: the server is held out as if it had just started).
    pub(crate) fn promoted(&self) -> bool {
        self.field("second_repl_offset") != Some("-1")
    }

    /// The identity the restart guard compares across connects for a server that may change
    /// role: `run_id` and the replication id (`master_replid`). A restart changes the run id;
    /// a promotion, even of a server demoted and promoted back within one process (a
    /// failback), gives it a new replication id while the run id stays. An unreadable
    /// replication id reads as `?` (a later readable one then differs: the conservative
    /// direction).
    pub(crate) fn identity(&self, run_id: &str) -> String {
        let replid = self.field("master_replid").unwrap_or("?");
        format!("{run_id}/{replid}")
    }
}

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
) -> redis::RedisResult<(ServerInfo, NodeConfig, Option<redis::Value>)> {
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
    let info = ServerInfo::parse(&info);
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
    /// The settings `INFO` carries (the memory section's; `appendfsync` is not in `INFO`).
    fn from_info(info: &ServerInfo) -> Self {
        let field = |name| info.field(name).map(str::to_owned);
        NodeConfig {
            appendfsync: None,
            maxmemory: field("maxmemory"),
            policy: field("maxmemory_policy"),
            unread: Vec::new(),
        }
    }

    /// The settings a guard needs that `INFO` did not give, by their `CONFIG GET` names.
    fn missing(&self, info: &ServerInfo) -> Vec<&'static str> {
        [
            (SETTINGS[0], info.aof()),
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

/// The run id and uptime in an `INFO server` reply ([`ServerInfo::run_id_and_uptime`]).
pub(crate) fn parse_info(info: &str) -> Option<(String, Duration)> {
    ServerInfo::parse(info).run_id_and_uptime()
}

/// The identity of the server whose `INFO replication` reply is `info_replication`, with
/// `run_id` ([`ServerInfo::identity`]).
pub(crate) fn server_identity(run_id: &str, info_replication: &str) -> String {
    ServerInfo::parse(info_replication).identity(run_id)
}

/// Whether an `INFO replication` reply shows a server promoted from a replica during its
/// current process ([`ServerInfo::promoted`]).
pub(crate) fn promoted(info_replication: &str) -> bool {
    ServerInfo::parse(info_replication).promoted()
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
        let parsed = ServerInfo::parse(info);
        let config = NodeConfig::from_info(&parsed);
        assert_eq!(config.maxmemory.as_deref(), Some("1048576"));
        assert_eq!(config.policy.as_deref(), Some("allkeys-lru"));
        assert!(config.missing(&parsed).is_empty());
        let aof = ServerInfo::parse(&info.replace("aof_enabled:0", "aof_enabled:1"));
        assert_eq!(config.missing(&aof), ["appendfsync"]);
        let bare = ServerInfo::parse("# Persistence\r\naof_enabled:0\r\n");
        assert_eq!(
            NodeConfig::from_info(&bare).missing(&bare),
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
        assert_eq!(parse_info("run_id:abc\r\nuptime_in_seconds:soon\r\n"), None);
    }

    #[test]
    fn the_major_version_is_read_from_info_server() {
        let major = |info: &str| ServerInfo::parse(info).major();
        assert_eq!(
            major("# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n"),
            Some(7)
        );
        assert_eq!(major("redis_version:6.2.14\n"), Some(6));
        assert_eq!(major("redis_version:10.0.0"), Some(10));
        assert_eq!(major("run_id:abc"), None);
    }

    /// One reply of the four sections, as Redis 7 sends it: every field a connect reads comes
    /// from the one pass, the first line of a field given twice counts, and other fields (whose
    /// values may hold colons) are passed over.
    #[test]
    fn one_pass_reads_every_field_a_connect_needs() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\nuptime_in_seconds:42\r\n\
                    server_time_usec:1700000000123456\r\nexecutable:/usr/bin/redis-server\r\n\
                    config_file:C:\\redis.conf\r\n\r\n# Persistence\r\naof_enabled:1\r\n\r\n\
                    # Replication\r\nrole:master\r\nmaster_replid:r1\r\nmaster_replid:r2\r\n\
                    second_repl_offset:-1\r\n\r\n# Memory\r\nmaxmemory:0\r\n\
                    maxmemory_policy:noeviction\r\n";
        let parsed = ServerInfo::parse(info);
        assert_eq!(
            parsed.run_id_and_uptime(),
            Some(("abc".to_owned(), Duration::from_secs(42)))
        );
        assert_eq!(
            parsed.server_time(),
            Some(Duration::from_micros(1_700_000_000_123_456))
        );
        assert!(parsed.aof());
        assert!(!parsed.promoted());
        assert_eq!(parsed.identity("abc"), "abc/r1");
        assert_eq!(parsed.field("config_file"), None);
        let config = NodeConfig::from_info(&parsed);
        assert_eq!(config.maxmemory.as_deref(), Some("0"));
        assert_eq!(config.policy.as_deref(), Some("noeviction"));
        assert_eq!(config.missing(&parsed), ["appendfsync"]);
        let empty = ServerInfo::parse("");
        assert_eq!(empty.run_id_and_uptime(), None);
        assert_eq!(empty.server_time(), None);
        assert!(!empty.aof());
        assert!(empty.promoted());
        assert_eq!(empty.identity("abc"), "abc/?");
    }
}
