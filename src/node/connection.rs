//! The one self-healing connection to a node: established lazily in a spawned task bounded by
//! the connect timeout, replaced only when it breaks (so a node's calls travel in order), and
//! the connect itself (TCP/TLS settings, `INFO` read for the restart and eviction guards in one
//! round trip; `CONFIG GET` only for what `INFO` does not give, `server.rs`). Every connection
//! the crate opens to a node, pub/sub included, is opened here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::AsyncConnectionConfig;
use tokio::time::Instant;

use super::address::redact;
use super::gate::QUEUE;
use super::link::Single;
use super::member::{self, MemberConn, MemberKind};
use super::server::{durability_marker, read_settings};
use super::stream::{Watch, open_watched};
use super::{Node, scripts};
use crate::core::health::classify_eviction;
use crate::core::lock;
use crate::error::{ConfigError, NodeError};

/// The certificates for `rediss://` nodes, when configured (feature `tls`).
#[cfg(feature = "tls")]
pub(crate) type Tls = Option<redis::TlsCertificates>;
/// Nothing without the `tls` feature.
#[cfg(not(feature = "tls"))]
pub(crate) type Tls = ();

pub(super) type Connected = Result<(MemberConn, u64), NodeError>;

/// How long calls fail fast with the last connect error before the next connect is tried, so a
/// dead node costs no connect attempt (and no task) per call.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(25);

enum Slot {
    Empty,
    /// The last connect failed: calls fail fast with its error until the instant passes.
    Failed(NodeError, Instant),
    Connecting(Shared<BoxFuture<'static, Connected>>),
    /// The connection, its generation, and what its socket heard (plain TCP and Unix
    /// connections to one server; see `stream.rs`).
    Ready(MemberConn, u64, Option<Arc<Watch>>),
}

/// A node's connection slot: the live connection or the connect under way, and its
/// generation (one per connect).
pub(super) struct ConnSlot {
    slot: Mutex<Slot>,
    generation: AtomicU64,
    connect_timeout: Duration,
    /// How long the server may stay silent with calls outstanding before acquisitions hold
    /// back from it ([`Node::silent`]).
    node_timeout: Duration,
}

impl ConnSlot {
    pub(super) fn new(connect_timeout: Duration, node_timeout: Duration) -> Self {
        ConnSlot {
            slot: Mutex::new(Slot::Empty),
            generation: AtomicU64::new(0),
            connect_timeout,
            node_timeout,
        }
    }
}

impl Node {
    /// The generation of the node's connection as of now, for [`ScriptCall::with_lean`]: a
    /// call made after this returns runs on this connection or a later one (generations only
    /// grow, one per connect), so a later call that runs on *this* generation ran on the same
    /// connection, to the same server process, as every call in between. `0` for members that
    /// are not one plain server (Cluster, Sentinel): their connection is not one server
    /// process's for its whole life (a Cluster's spans shards; a Sentinel member's primary can
    /// be demoted and resynchronised under it), so nothing is known across calls.
    pub(crate) fn process_generation(&self) -> u64 {
        if self.member.kind() == member::MemberKind::Standalone {
            self.conn.generation.load(Ordering::Acquire)
        } else {
            0
        }
    }

    /// The connect timeout, which also bounds each step of a repair.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.conn.connect_timeout
    }

    /// The live connection, or the one being established (started if none is).
    pub(super) async fn connection(self: &Arc<Self>) -> Connected {
        let pending = {
            let mut slot = lock(&self.conn.slot);
            match &*slot {
                Slot::Ready(conn, generation, _) => return Ok((conn.clone(), *generation)),
                Slot::Connecting(pending) => pending.clone(),
                Slot::Failed(e, until) if Instant::now() < *until => return Err(e.clone()),
                Slot::Failed(..) | Slot::Empty => {
                    let pending = self.spawn_connect();
                    *slot = Slot::Connecting(pending.clone());
                    pending
                }
            }
        };
        pending.await
    }

    pub(super) fn spawn_connect(self: &Arc<Self>) -> Shared<BoxFuture<'static, Connected>> {
        let node = Arc::clone(self);
        let generation = self.conn.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let task = tokio::spawn(async move {
            let result = tokio::time::timeout(node.conn.connect_timeout, node.connect(generation))
                .await
                .unwrap_or(Err(NodeError::Timeout(node.conn.connect_timeout)));
            let mut slot = lock(&node.conn.slot);
            match result {
                Ok((conn, watch)) => {
                    *slot = Slot::Ready(conn.clone(), generation, watch);
                    Ok((conn, generation))
                }
                Err(e) => {
                    tracing::debug!(node = %node.name, error = %e, "connect failed");
                    *slot = Slot::Failed(e.clone(), Instant::now() + RECONNECT_BACKOFF);
                    Err(e)
                }
            }
        });
        let node = Arc::clone(self);
        async move {
            task.await.unwrap_or_else(|e| {
                // The task panicked or its runtime shut down before it could fill the slot: empty
                // it, so the next call connects afresh instead of reusing this failure forever.
                let mut slot = lock(&node.conn.slot);
                if matches!(&*slot, Slot::Connecting(_))
                    && node.conn.generation.load(Ordering::Relaxed) == generation
                {
                    *slot = Slot::Empty;
                }
                Err(NodeError::Dropped(redis::RedisError::from(
                    std::io::Error::other(format!("connect task ended early: {e}")),
                )))
            })
        }
        .boxed()
        .shared()
    }

    /// `opening`, bounded by the connect timeout; its error told as a connect-time one.
    async fn within_connect_timeout<T>(
        &self,
        opening: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, NodeError> {
        tokio::time::timeout(self.conn.connect_timeout, opening)
            .await
            .map_err(|_| NodeError::Timeout(self.conn.connect_timeout))?
            .map_err(|e| self.connect_error(e))
    }

    /// What every connection to one server is opened with: the connect timeout, no response
    /// timeout of its own (each call has its deadline), and a queue no backlog fills (`QUEUE`).
    fn connection_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.conn.connect_timeout))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(QUEUE)
    }

    /// Opens the member's own connection (the one every lock call and every side call of
    /// elections and run-once jobs travels on), bounded by the connect timeout. For one server,
    /// its client carries what the builder configured (certificates for `rediss://`, TCP
    /// keepalive and user timeout; see `RedlockBuilder::open_client`) and the connection gets
    /// [`connection_config`](Self::connection_config): over plain TCP or a Unix socket on a
    /// socket of our own watched for the server's silence (`stream.rs`), over `rediss://`
    /// through redis-rs's TLS. A Cluster member: the cluster client's connection.
    async fn open_member(&self) -> Result<(MemberConn, Option<Arc<Watch>>), NodeError> {
        self.within_connect_timeout(async {
            if let Some(cluster) = self.member.connect_cluster().await {
                return cluster.map(|conn| (conn, None));
            }
            // One server: its client resolved once (a Sentinel member asks its sentinels).
            let client = self.member.server_client().await?;
            match open_watched(client.get_connection_info()).await {
                Some(opened) => {
                    opened.map(|(conn, watch)| (MemberConn::Single(conn), Some(Arc::new(watch))))
                }
                None => client
                    .get_multiplexed_async_connection_with_config(&self.connection_config())
                    .await
                    .map(|conn| (MemberConn::Single(Single::Mux(conn)), None)),
            }
        })
        .await
    }

    /// Opens a new pub/sub connection to this node, with the same client (certificates, TCP
    /// settings) as [`open_member`](Self::open_member), bounded by the connect timeout.
    pub(crate) async fn open_pubsub(&self) -> Result<redis::aio::PubSub, NodeError> {
        self.within_connect_timeout(async {
            self.member.server_client().await?.get_async_pubsub().await
        })
        .await
    }

    /// Connects and reads what the guards need (`INFO`: one round trip on Redis ≥ 7 without
    /// AOF; `read_settings`). Scripts are not loaded: a call's `EVALSHA` answered `NOSCRIPT`
    /// falls back to `EVAL`, which leaves the script in the server's cache for every later call
    /// and client.
    ///
    /// A Cluster member reads every master's `INFO server` and `INFO replication` instead (its
    /// identity is their run ids, its age its youngest master's, a promoted one counting as
    /// just started) and loads the scripts on every node; `CONFIG` and the
    /// durability marker are skipped (its shards may not share a configuration; it is never
    /// taken for durable). A standalone master and a Sentinel member's primary are met alike
    /// (`meet_server`): their identity is the run id and replication id, and a server that was
    /// a replica during its current process (every Sentinel member's primary, and a standalone
    /// master promoted from a replica: a virtual IP or DNS name moved to it) counts as just
    /// started, with its durability marker not trusted (it arrives by replication).
    pub(super) async fn connect(
        &self,
        generation: u64,
    ) -> Result<(MemberConn, Option<Arc<Watch>>), NodeError> {
        let mut cluster = match self.open_member().await? {
            (MemberConn::Single(conn), watch) => {
                return Ok((self.meet_server(conn, generation).await?, watch));
            }
            (MemberConn::Cluster(cluster), _) => cluster,
        };
        let view = super::cluster::cluster_view(&mut cluster)
            .await
            .map_err(|e| self.connect_error(e))?;
        let (run_id, uptime) = (view.run_id(), view.uptime);
        *lock(&self.cluster) = view;
        self.peers.record(self.index, &run_id);
        self.observe_start(run_id.clone(), &run_id, uptime, false, None);
        tracing::debug!(node = %self.name, "connected to the cluster");
        Ok((MemberConn::Cluster(cluster), None))
    }

    /// The connect of a standalone master or a Sentinel member's primary.
    ///
    /// `INFO` is required: the restart guard cannot work without the run id and uptime. The
    /// server's version decides the fenced acquire's form (`acquire_form.rs`).
    async fn meet_server(
        &self,
        mut conn: Single,
        generation: u64,
    ) -> Result<MemberConn, NodeError> {
        let sent = super::wallclock::ours();
        let (info, config, eval) = read_settings(&mut conn).await.map_err(|e| {
            // The connect's first exchange: a connection dropped before any reply is a peer
            // that sent something unsolicited that is not Redis (an SSH banner) or closed at
            // once; the connection's driver has ended with it, so no reply is left to read.
            if e.is_connection_dropped() {
                NodeError::NotRedis { closed_early: true }
            } else {
                self.connect_error(e)
            }
        })?;
        let received = super::wallclock::ours();
        // One reply holds the server, persistence and replication sections.
        let sentinel = self.member.kind() == MemberKind::Sentinel;
        // The clock-jump check's baseline: the server's time in the same `INFO` reply (a server
        // that does not report it leaves the connection unchecked).
        let clock = info
            .server_time()
            .map(|server| crate::core::health::ClockReading {
                sent,
                received,
                server,
            });
        // Every script may go as `EVAL` (a connection's first call of it, after a `NOSCRIPT`, on
        // a node that refuses or does not know `EVALSHA`): a server that does not know it cannot
        // serve the protocol, and must not vote (a plain `SET NX` acquisition would be granted
        // there and lost at the first extension). An ACL refusal is the ACL's error, at the call.
        if let Some(Err(e)) = eval.map(redis::Value::extract_error)
            && scripts::unknown_command(&e).is_some_and(|c| c == "EVAL")
        {
            return Err(NodeError::Unsupported {
                command: "EVAL".to_owned(),
            });
        }
        let (run_id, uptime) = info
            .run_id_and_uptime()
            .ok_or_else(|| NodeError::BadReply {
                expected: "INFO server with run_id and uptime_in_seconds",
                got: "INFO server without them".to_owned(),
            })?;
        self.observe_acquire_form(generation, info.major());
        let aof = info.aof();
        self.observe_config(&config);
        // A server that was a replica during its current process (a Sentinel member's primary
        // may always have been one) holds what replication brought it: its durability marker
        // came from another server and proves nothing about the writes that did not arrive.
        let was_replica = sentinel || info.promoted();
        let fsync_always = !was_replica && aof && config.appendfsync.as_deref() == Some("always");
        let marker = if fsync_always {
            durability_marker(&mut conn, self.health.marker_key(), &run_id).await
        } else {
            None
        };
        if let Some(other) = self.peers.record(self.index, &run_id) {
            tracing::warn!(
                node = %self.name,
                other = %self.peers.names.get(other).map_or("?", String::as_str),
                run_id = %run_id,
                "two node URLs reach the same Redis server; neither counts toward a quorum while they do"
            );
        }
        self.observe_eviction(classify_eviction(
            config.maxmemory.as_deref(),
            config.policy.as_deref(),
        ));
        // The run id and replication id: a failback to a server that kept its run id (demoted,
        // resynchronised, promoted again) reads as a new server. A server promoted during its
        // current process counts as just started: its uptime says nothing about when it was
        // promoted.
        let identity = info.identity(&run_id);
        let same_server = self.met_before(&identity);
        let age = if was_replica { Duration::ZERO } else { uptime };
        self.observe_start(identity, &run_id, age, fsync_always, marker);
        self.clock_baseline(generation, clock, same_server);
        tracing::debug!(node = %self.name, "connected");
        Ok(MemberConn::Single(conn))
    }

    /// A connect-time error; a timeout there is the connect timeout.
    pub(super) fn connect_error(&self, e: redis::RedisError) -> NodeError {
        if let Some(denied) = scripts::denial(&e, None) {
            denied
        } else if e.is_timeout() {
            NodeError::Timeout(self.conn.connect_timeout)
        } else {
            NodeError::from_redis(e)
        }
    }

    /// How long this node's server has been silent with calls outstanding, when it has been
    /// for a node timeout or more (`stream.rs`: bytes written that long ago, nothing read
    /// since, nothing waiting unread). `None` while it answers, and on connections without the
    /// signal (`rediss://`, Cluster members).
    pub(super) fn silent(&self) -> Option<Duration> {
        match &*lock(&self.conn.slot) {
            Slot::Ready(_, _, Some(watch)) => watch.silent_for(self.conn.node_timeout),
            _ => None,
        }
    }

    pub(super) fn invalidate(&self, generation: u64) {
        let mut slot = lock(&self.conn.slot);
        if matches!(&*slot, Slot::Ready(_, g, _) if *g == generation) {
            *slot = Slot::Empty;
            tracing::debug!(node = %self.name, "connection broken; will reconnect");
        }
    }
}

/// A `redis::Client` for one node URL, with our TCP settings (and certificates for `rediss://`
/// when configured): the only way the crate makes a client for a node.
pub(crate) fn open_client(url: &str, tls: &Tls) -> Result<redis::Client, ConfigError> {
    use redis::IntoConnectionInfo;
    let invalid = |source| ConfigError::InvalidUrl {
        url: redact(url),
        source,
    };
    let info = url
        .into_connection_info()
        .map_err(invalid)?
        .set_tcp_settings(tcp_settings());
    // No `CLIENT SETINFO` on connect: two commands per connection the lock does not need.
    let redis = info.redis_settings().clone().set_skip_set_lib_name();
    let info = info.set_redis_settings(redis);
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    #[cfg(feature = "tls")]
    if let Some(certs) = tls
        && matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
    {
        return redis::Client::build_with_tls(info, certs.clone()).map_err(|source| {
            ConfigError::Tls {
                url: redact(url),
                source,
            }
        });
    }
    redis::Client::open(info).map_err(invalid)
}

/// TCP settings for every node connection. A connection is replaced only when it breaks (that
/// keeps each node's calls in order), so a silently dead peer (a host gone without a reset, a
/// partition) must break it: keepalive probes find an idle dead peer within about 16 s, and
/// `TCP_USER_TIMEOUT` drops a connection whose sent data has gone unacknowledged for 10 s.
/// A paused Redis process is not affected: its kernel still acknowledges what it receives.
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2))
        .with_retries(3);
    let settings = TcpSettings::default().set_keepalive(keepalive);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let settings = settings.set_user_timeout(Duration::from_secs(10));
    settings
}
