//! What one quorum member is: a standalone master (`redis://`, `rediss://`, `unix://`), a Redis
//! Cluster (`redis+cluster://`), or a Sentinel-managed primary (`redis+sentinel://`), and the
//! connection the node layer holds to it.
//!
//! # Member URLs
//!
//! - `redis+cluster://[user:password@]host1:port1,host2:port2,...`: seed nodes of one Redis
//!   Cluster; the redis crate's async cluster client discovers the slots and follows
//!   redirections. Every key the crate uses for one lock name shares a hash tag (the name, see
//!   `scripts::lock_key`), so each script runs on one shard. Credentials apply to every node.
//! - `redis+sentinel://host1:port1,host2:port2,.../master-name`: the sentinels of one monitored
//!   primary; the primary is resolved through them (`SENTINEL get-master-addr-by-name`, then
//!   `ROLE` checked) on every connect, so a failover is followed by reconnecting. Credentials
//!   (`redis+sentinel://[user:password@]...`) apply to the primary, not to the sentinels.
//!
//! Both are plain TCP in this version (no `rediss+...`); a Cluster over TLS is reachable through
//! a `ClusterClient` of the user's (`RedlockBuilder::cluster_client`, `from_cluster_client` below).
//!
//! # The restart guard on these members
//!
//! A Cluster member's identity is the set of its masters' run ids (sorted, joined): any shard
//! restarted or failed over changes it, and the member is then held out for the max ttl
//! (counted from its youngest master, a master promoted from a replica in its current process
//! counting as just started) and repaired, like a restarted standalone node. Because
//! the cluster client reconnects to a shard by itself, every script call also reads the run id
//! of the shard that ran it (`INFO server` in the same pipeline, one round trip): a run id this
//! client has not met makes the call count as failed and the member reconnect, which applies
//! the guard.
//!
//! A Sentinel member's identity is the run id and replication id of its current primary (the
//! replication id is renewed by every promotion, so a failback to a server that kept its run
//! id changes it too; a Cluster master's identity is the same pair). A failover changes it:
//! the member is held out for the max ttl counted from the moment the client met the new
//! primary (its uptime says nothing about when it was promoted), and repaired, because
//! asynchronous replication may have lost the last writes. The durability marker is not
//! trusted on these members (a replica receives it by replication, so it proves nothing about
//! the writes that did not arrive).

use std::collections::BTreeSet;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use super::address::node_name;

/// The scheme of a Redis Cluster member URL.
pub(crate) const CLUSTER_SCHEME: &str = "redis+cluster://";
/// The scheme of a Sentinel member URL.
pub(crate) const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// What kind of deployment a member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberKind {
    /// One master.
    Standalone,
    /// A Redis Cluster.
    Cluster,
    /// A Sentinel-managed primary.
    Sentinel,
}

/// How the node layer reaches one member.
pub(crate) enum Member {
    /// One master.
    Standalone(redis::Client),
    /// A Redis Cluster.
    Cluster(ClusterClient),
    /// A Sentinel-managed primary: the sentinel client caches its sentinel connections, hence
    /// the mutex (held only while resolving the primary).
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Member").field(&self.kind()).finish()
    }
}

/// A member URL parsed: its display name (no password), its identity (for duplicate
/// detection) and the member.
pub(crate) struct Parsed {
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) member: Member,
}

/// `Ok(None)` when `url` is not a Cluster or Sentinel member URL (the caller parses it as a
/// standalone node).
pub(crate) fn parse(
    url: &str,
    tcp: &TcpSettings,
    connect_timeout: Duration,
) -> redis::RedisResult<Option<Parsed>> {
    if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
        let (auth, hosts) = split_auth(rest);
        let hosts = hosts.trim_end_matches('/');
        let seeds = hosts_of(hosts)?;
        let client = ClusterClient::builder(
            seeds
                .iter()
                .map(|h| format!("redis://{auth}{h}"))
                .collect::<Vec<_>>(),
        )
        .tcp_settings(tcp.clone())
        .connection_timeout(connect_timeout)
        // Redirections and a slot refresh; the round's deadline bounds the rest.
        .retries(3)
        .min_retry_wait(5)
        .max_retry_wait(50)
        .build()?;
        return Ok(Some(Parsed {
            name: format!("{CLUSTER_SCHEME}{}", seeds.join(",")),
            identity: format!("cluster:{}", sorted(&seeds)),
            member: Member::Cluster(client),
        }));
    }
    if let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) {
        let (auth, rest) = split_auth(rest);
        let (hosts, master) = rest.split_once('/').ok_or_else(|| {
            invalid("a Sentinel member URL ends in /<master-name>: redis+sentinel://h1:p1,h2:p2/mymaster")
        })?;
        let master = master.trim_end_matches('/');
        if master.is_empty() || master.contains('/') {
            return Err(invalid(
                "the master name after the sentinels is missing or has a '/'",
            ));
        }
        let sentinels = hosts_of(hosts)?;
        // The primary's credentials and db come from the userinfo, parsed as a redis:// URL.
        let primary = format!("redis://{auth}127.0.0.1").into_connection_info()?;
        let node_info = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(primary.redis_settings().clone().set_skip_set_lib_name())
            .set_tcp_settings(tcp.clone());
        // A `String` for the build without `tls`; `impl AsRef<str>` with it.
        let service: String = master.to_owned();
        let client = SentinelClient::build(
            sentinels
                .iter()
                .map(|h| format!("redis://{h}"))
                .collect::<Vec<_>>(),
            service,
            Some(node_info),
            SentinelServerType::Master,
        )?;
        return Ok(Some(Parsed {
            name: format!("{SENTINEL_SCHEME}{}/{master}", sentinels.join(",")),
            identity: format!("sentinel:{}/{master}", sorted(&sentinels)),
            member: Member::Sentinel(tokio::sync::Mutex::new(client)),
        }));
    }
    Ok(None)
}

/// A standalone member from a client the crate built for a URL.
pub(crate) fn standalone(client: redis::Client) -> Parsed {
    let info = client.get_connection_info();
    Parsed {
        name: node_name(info),
        identity: identity(info),
        member: Member::Standalone(client),
    }
}

/// A standalone member from a `redis::Client` the user configured. Kept: its address, TLS
/// (certificates and hostname checks), username and password, db, RESP version and library
/// name. Replaced: its TCP settings, by ours (`tcp`: keepalive and user timeout, which break a
/// connection to a silently dead peer; the one connection per node is replaced only when it
/// breaks). Timeouts are not a client's settings: every connection gets ours.
pub(crate) fn from_client(client: &redis::Client, tcp: &TcpSettings) -> redis::RedisResult<Parsed> {
    let info = client
        .get_connection_info()
        .clone()
        .set_tcp_settings(tcp.clone());
    Ok(standalone(redis::Client::open(info)?))
}

/// A Cluster member from a `ClusterClient` the user configured, kept as it is (a cluster
/// client cannot be changed once built: its TCP settings, retries and response timeout stay
/// the user's; the per-call deadline still bounds every call). It does not say which seeds it
/// has, so its display name is its position among the members (`cluster client #3`) and a
/// duplicate is found only at connect, by its masters' run ids.
pub(crate) fn from_cluster_client(client: ClusterClient, position: usize) -> Parsed {
    let name = format!("cluster client #{position}");
    Parsed {
        identity: name.clone(),
        name,
        member: Member::Cluster(client),
    }
}

/// What makes two standalone members one server for the builder's duplicate check: the
/// address and the db.
fn identity(info: &redis::ConnectionInfo) -> String {
    format!("{}/{}", info.addr(), info.redis_settings().db())
}

/// Why a Cluster member has no single-server connection for a feature's commands.
pub(crate) fn cluster_serves_locks_only() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "a Redis Cluster member serves locks only: elections and run-once jobs need standalone \
         or Sentinel members",
    ))
}

fn invalid(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, what))
}

/// `user:password@` (kept with its `@`) and the rest.
fn split_auth(rest: &str) -> (&str, &str) {
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    match authority.rfind('@') {
        Some(at) => rest.split_at(at + 1),
        None => ("", rest),
    }
}

/// `host:port,host:port` checked: each has a host and a numeric port.
fn hosts_of(hosts: &str) -> redis::RedisResult<Vec<String>> {
    let list: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if list.is_empty() {
        return Err(invalid("no host:port listed"));
    }
    for h in &list {
        match h.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => return Err(invalid("every host is written host:port")),
        }
    }
    Ok(list)
}

fn sorted(hosts: &[String]) -> String {
    hosts
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .cloned()
        .collect::<Vec<_>>()
        .join(",")
}

impl Member {
    /// The kind of deployment.
    pub(crate) fn kind(&self) -> MemberKind {
        match self {
            Member::Standalone(_) => MemberKind::Standalone,
            Member::Cluster(_) => MemberKind::Cluster,
            Member::Sentinel(_) => MemberKind::Sentinel,
        }
    }

    /// A client for the one server behind the member: the standalone master, or the primary
    /// the sentinels name now. A Cluster member has none (side connections of elections and
    /// run-once jobs need one server).
    pub(crate) async fn server_client(&self) -> redis::RedisResult<redis::Client> {
        match self {
            Member::Standalone(client) => Ok(client.clone()),
            Member::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
            Member::Cluster(_) => Err(cluster_serves_locks_only()),
        }
    }

    /// Opens a Cluster member's connection (the cluster client's); `None` for a member of one
    /// server, which the node layer connects itself (`connection.rs`: a watched socket, or
    /// redis-rs's for `rediss://`).
    pub(crate) async fn connect_cluster(&self) -> Option<redis::RedisResult<MemberConn>> {
        match self {
            Member::Cluster(client) => {
                Some(client.get_async_connection().await.map(MemberConn::Cluster))
            }
            _ => None,
        }
    }
}

/// The node layer's connection to a member.
#[derive(Clone)]
pub(crate) enum MemberConn {
    /// To one server.
    Single(super::link::Single),
    /// To a Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for MemberConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            MemberConn::Single(c) => c.req_packed_command(cmd),
            MemberConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            MemberConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            MemberConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            MemberConn::Single(c) => c.get_db(),
            MemberConn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp() -> TcpSettings {
        TcpSettings::default()
    }

    #[test]
    fn member_urls_parse_and_never_show_the_password() {
        let t = Duration::from_secs(1);
        let c = parse("redis+cluster://:pw@h1:7000,h2:7001", &tcp(), t)
            .unwrap()
            .unwrap();
        assert_eq!(c.name, "redis+cluster://h1:7000,h2:7001");
        assert_eq!(c.member.kind(), MemberKind::Cluster);
        let s = parse("redis+sentinel://h1:26379,h2:26380/mymaster", &tcp(), t)
            .unwrap()
            .unwrap();
        assert_eq!(s.name, "redis+sentinel://h1:26379,h2:26380/mymaster");
        assert_eq!(s.member.kind(), MemberKind::Sentinel);
        // The same hosts in another order are the same member.
        let s2 = parse("redis+sentinel://h2:26380,h1:26379/mymaster", &tcp(), t)
            .unwrap()
            .unwrap();
        assert_eq!(s.identity, s2.identity);
        assert!(parse("redis://h1:6379", &tcp(), t).unwrap().is_none());
    }

    #[test]
    fn bad_member_urls_are_errors() {
        let t = Duration::from_secs(1);
        for url in [
            "redis+cluster://",
            "redis+cluster://h1",
            "redis+cluster://h1:notaport",
            "redis+sentinel://h1:26379",
            "redis+sentinel://h1:26379/",
            "redis+sentinel://h1:26379/a/b",
        ] {
            assert!(parse(url, &tcp(), t).is_err(), "{url}");
        }
    }
}
