//! [`RedlockBuilder`]: defaults as constants, by-value setters, checked once by
//! [`RedlockBuilder::build`] into the engine's plain configuration and its nodes.

use std::time::Duration;

use crate::client::Engine;
use crate::client::assemble::{Source, Tls};
use crate::client::config::Config;
use crate::client::io_thread::IoThread;
use crate::core::health::{EvictionGuard, RestartGuard};
use crate::core::keys::{self, KeyLayout};
use crate::core::timing;
use crate::error::{ConfigError, Setting};

/// Builds a [`Redlock`](crate::Redlock). Obtained from [`Redlock::builder`](crate::Redlock::builder).
///
/// # Defaults
///
/// | setting | default |
/// | --- | --- |
/// | node timeout | [`DEFAULT_NODE_TIMEOUT`](Self::DEFAULT_NODE_TIMEOUT) (50 ms) |
/// | connect timeout | [`DEFAULT_CONNECT_TIMEOUT`](Self::DEFAULT_CONNECT_TIMEOUT) (1 s) |
/// | drift factor | [`DEFAULT_DRIFT_FACTOR`](Self::DEFAULT_DRIFT_FACTOR) (0.01, plus 2 ms) |
/// | retries of `acquire` | [`DEFAULT_RETRY_COUNT`](Self::DEFAULT_RETRY_COUNT) (3) |
/// | retry delay | [`DEFAULT_RETRY_DELAY`](Self::DEFAULT_RETRY_DELAY) (50 ms) + up to [`DEFAULT_RETRY_JITTER`](Self::DEFAULT_RETRY_JITTER) (100 ms) |
/// | restart guard | [`RestartGuard::Restarted`] |
/// | eviction guard | [`EvictionGuard::Warn`] |
/// | max ttl | the largest ttl this client has used |
/// | fencing tokens | on |
/// | key prefix | [`DEFAULT_KEY_PREFIX`](Self::DEFAULT_KEY_PREFIX) (`quorumlock`) |
/// | compat mode (plain resource names, as other Redlock clients) | off |
/// | owner name shown by `status` | none |
/// | lock name as a metrics label | off |
///
/// ```
/// use std::time::Duration;
/// use quorumlock::Redlock;
///
/// let locks = Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .node_timeout(Duration::from_millis(20))
///     .retry_count(5)
///     .build()?; // no connection is made yet: nodes may be down
/// # Ok::<(), quorumlock::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build() is called"]
pub struct RedlockBuilder {
    members: Vec<Source>,
    node_timeout: Duration,
    connect_timeout: Duration,
    drift_factor: f64,
    retry_count: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    restart_guard: RestartGuard,
    eviction_guard: EvictionGuard,
    max_ttl: Option<Duration>,
    fencing: bool,
    key_prefix: String,
    compat: bool,
    owner: Option<String>,
    metrics_lock_label: bool,
    /// Members (by position) kept on the acquire script (a test hook).
    #[cfg(feature = "testkit")]
    script_acquire: Vec<usize>,
    io_thread: IoThread,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

impl RedlockBuilder {
    /// How long one node may stay silent while a call waits for it. Small against the ttl: a
    /// node that answers nothing for this long counts as failed for that round. A call queued
    /// behind this client's own earlier calls waits on while its node keeps answering them, up
    /// to the operation's bound (`docs/safety.md`, "The node timeout measures the node").
    pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
    /// How long a connection (TCP, handshake, script load) may take. Connecting runs in the
    /// background, so a slow connect delays only the rounds that need that node.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    /// Clock drift allowed per unit of ttl; 2 ms are always added.
    pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
    /// Extra attempt rounds [`Redlock::acquire`](crate::Redlock::acquire) makes after the first one fails.
    pub const DEFAULT_RETRY_COUNT: u32 = 3;
    /// Fixed part of the pause between attempt rounds.
    pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(50);
    /// Random part of the pause between attempt rounds (uniform in `[0, jitter]`).
    pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(100);
    /// The longest node timeout, connect timeout, retry delay or jitter [`build`](Self::build)
    /// accepts (one hour): beyond it a setting is a mistake, not a choice.
    pub const MAX_TIMING: Duration = Duration::from_secs(3600);
    /// The longest max ttl [`build`](Self::build) accepts (the longest ttl Redis' `PX` takes in
    /// practice, 49 days).
    pub const MAX_TTL: Duration = timing::MAX_TTL;
    /// The prefix of every key the client writes (`quorumlock:{K}` for user key `K`).
    pub const DEFAULT_KEY_PREFIX: &'static str = keys::DEFAULT_PREFIX;

    pub(crate) fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedlockBuilder {
            members: urls
                .into_iter()
                .map(|u| Source::Url(u.as_ref().to_owned()))
                .collect(),
            node_timeout: Self::DEFAULT_NODE_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            drift_factor: Self::DEFAULT_DRIFT_FACTOR,
            retry_count: Self::DEFAULT_RETRY_COUNT,
            retry_delay: Self::DEFAULT_RETRY_DELAY,
            retry_jitter: Self::DEFAULT_RETRY_JITTER,
            restart_guard: RestartGuard::default(),
            eviction_guard: EvictionGuard::default(),
            max_ttl: None,
            fencing: true,
            key_prefix: Self::DEFAULT_KEY_PREFIX.to_owned(),
            compat: false,
            owner: None,
            metrics_lock_label: false,
            #[cfg(feature = "testkit")]
            script_acquire: Vec::new(),
            io_thread: IoThread::Never,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Adds one member by URL, after those already given: `redis://`, `rediss://`, `unix://`,
    /// `redis+cluster://` or `redis+sentinel://` (see `docs/deployments.md`).
    ///
    /// ```
    /// use quorumlock::RedlockBuilder;
    ///
    /// let locks = RedlockBuilder::default()
    ///     .node("redis://127.0.0.1:7001")
    ///     .node("redis://127.0.0.1:7002")
    ///     .node("redis://127.0.0.1:7003")
    ///     .build()?;
    /// # Ok::<(), quorumlock::ConfigError>(())
    /// ```
    pub fn node(mut self, url: impl AsRef<str>) -> Self {
        self.members.push(Source::Url(url.as_ref().to_owned()));
        self
    }

    /// Adds one member through a [`redis::Client`] you already configured (TLS, credentials,
    /// db, RESP version): bring your own client. Members by client and by URL mix freely.
    ///
    /// The member is one standalone **master** (not a replica, not a Cluster node: use
    /// [`cluster_client`](Self::cluster_client) for a Cluster, a `redis+sentinel://` URL for a
    /// Sentinel-managed primary). The client is a recipe, never a connection: the member still
    /// opens its own one multiplexed connection from it, lazily, replaces it only when it
    /// breaks (so a node's calls stay in order), and reads the server's run id on every
    /// connect, so a restart is held out and repaired as for a URL member.
    ///
    /// - **Kept** from your client: the address (TCP, TLS or Unix socket), TLS certificates
    ///   and hostname checks, username and password, db, RESP version (2 or 3), the library name
    ///   it was given with `set_lib_name` (sent as `CLIENT SETINFO`; none is sent otherwise).
    ///   The builder's own certificates (`tls_root_certificate` and `tls_client_certificate`,
    ///   feature `tls`) apply to URL members only.
    /// - **Replaced**: TCP settings, by the crate's (keepalive and `TCP_USER_TIMEOUT`, which
    ///   break a connection to a silently dead peer).
    /// - **Ours**, since they belong to a connection, not to a client: the connect timeout
    ///   ([`connect_timeout`](Self::connect_timeout)), no response timeout on the connection
    ///   (each call has its own deadline from [`node_timeout`](Self::node_timeout) and the
    ///   lock's validity).
    /// - **Pub/sub** (release notices for waiting acquisitions, election notices): a second
    ///   connection per node, opened from the same client, whatever its RESP version; push
    ///   messages never travel on the lock connection.
    ///
    /// A client with wrong credentials is not refused here (nothing connects at build): every
    /// call to that member fails with [`NodeError::Redis`](crate::NodeError::Redis) carrying
    /// the server's refusal, listed in the round's [`Error::NoQuorum`](crate::Error::NoQuorum).
    ///
    /// ```
    /// use quorumlock::RedlockBuilder;
    /// use redis::IntoConnectionInfo;
    ///
    /// // Say the service already has clients with its credentials and RESP version.
    /// let info = |port: u16| -> redis::RedisResult<redis::ConnectionInfo> {
    ///     Ok(redis::ConnectionAddr::Tcp("127.0.0.1".into(), port)
    ///         .into_connection_info()?
    ///         .set_redis_settings(
    ///             redis::RedisConnectionInfo::default()
    ///                 .set_username("locks")
    ///                 .set_password("s3cret")
    ///                 .set_protocol(redis::ProtocolVersion::RESP3),
    ///         ))
    /// };
    /// let locks = RedlockBuilder::default()
    ///     .client(redis::Client::open(info(7001)?)?)
    ///     .client(redis::Client::open(info(7002)?)?)
    ///     .node("redis://locks:s3cret@127.0.0.1:7003") // by URL, beside them
    ///     .build()?;
    /// assert_eq!(locks.node_names()[0], "redis://locks@127.0.0.1:7001"); // never the password
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client(mut self, client: redis::Client) -> Self {
        self.members.push(Source::Client(Box::new(client)));
        self
    }

    /// Adds one Redis Cluster member through a [`ClusterClient`](redis::cluster::ClusterClient)
    /// you already configured (credentials, TLS, RESP version), as a `redis+cluster://` URL
    /// would: the whole Cluster is one member of the quorum (see `docs/deployments.md`).
    ///
    /// A cluster client cannot be changed once built, so it is used as it is: its TCP
    /// settings, retries and response timeout stay yours (the per-call deadline still cuts
    /// every call at [`node_timeout`](Self::node_timeout)); the connect is bounded by
    /// [`connect_timeout`](Self::connect_timeout). Every call reads the run id of the shard
    /// that ran it, so a shard restarted or failed over holds the member out and repairs it, as
    /// for a URL member. A cluster client does not say which seeds it has: the member is named
    /// `cluster client #N` (N its position among the members, from 1), and the same Cluster
    /// given twice is found at connect (by run ids: neither counts), not at build. Elections
    /// and run-once jobs need single-server members, as with the URL.
    ///
    /// ```
    /// use quorumlock::RedlockBuilder;
    /// use redis::cluster::ClusterClient;
    ///
    /// let cluster = ClusterClient::builder(["redis://127.0.0.1:7101", "redis://127.0.0.1:7102"])
    ///     .password("s3cret")
    ///     .build()?;
    /// let locks = RedlockBuilder::default()
    ///     .cluster_client(cluster)
    ///     .node("redis://127.0.0.1:7001")
    ///     .node("redis://127.0.0.1:7002")
    ///     .build()?;
    /// assert_eq!(locks.node_names()[0], "cluster client #1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cluster_client(mut self, client: redis::cluster::ClusterClient) -> Self {
        self.members.push(Source::Cluster(Box::new(client)));
        self
    }

    /// Per-node, per-call timeout: how long a node may stay silent while a call waits for it.
    /// A call queued behind this client's own earlier calls waits on while its node keeps
    /// answering them (a burst of operations is not a node failure); it is given up for that
    /// backlog ([`NodeError::Backlog`](crate::NodeError::Backlog),
    /// [`Error::Overloaded`](crate::Error::Overloaded)) only at the operation's own bound. Each
    /// call is also cut short where a success could no longer leave positive validity.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Connection timeout (TCP connect, handshake and script loading).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Clock-drift factor: `drift = ttl * factor + 2 ms` is subtracted from every validity.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Extra attempt rounds of [`Redlock::acquire`](crate::Redlock::acquire) after the first.
    pub fn retry_count(mut self, count: u32) -> Self {
        self.retry_count = count;
        self
    }

    /// The crate's retry policy: the pause before retry `n` (0-based) of a series (attempt
    /// rounds, lease extensions that could not reach a quorum) is
    /// `min(delay * 2^n, max(delay, 1 s)) + uniform(0, jitter)`. A waiting
    /// [`Redlock::acquire_timeout`](crate::Redlock::acquire_timeout) is woken by release notices and uses this only as its poll.
    pub fn retry_delay(mut self, delay: Duration, jitter: Duration) -> Self {
        self.retry_delay = delay;
        self.retry_jitter = jitter;
        self
    }

    /// How nodes that may have restarted without their data are kept out of quorums.
    pub fn restart_guard(mut self, guard: RestartGuard) -> Self {
        self.restart_guard = guard;
        self
    }

    /// How nodes whose memory policy can evict lock keys are treated: warned about (the
    /// default) or held out of quorums ([`EvictionGuard::Strict`]).
    pub fn eviction_guard(mut self, guard: EvictionGuard) -> Self {
        self.eviction_guard = guard;
        self
    }

    /// The largest ttl any client uses on these nodes: how long a restarted node is held out.
    /// Without it, the largest ttl this client has used (at least one second).
    pub fn max_ttl(mut self, ttl: Duration) -> Self {
        self.max_ttl = Some(ttl);
        self
    }

    /// The prefix of every key this client writes: the lock on `K` is `PREFIX:{K}`, the fencing
    /// counters `PREFIX:fence:{T}` (default [`DEFAULT_KEY_PREFIX`](Self::DEFAULT_KEY_PREFIX)).
    /// Clients that lock the same names must use the same prefix; different prefixes are
    /// separate namespaces on shared nodes. 1 to 64 ASCII letters, digits, `-`, `_` or `.`
    /// ([`build`](Self::build) returns [`ConfigError::InvalidPrefix`] otherwise).
    ///
    /// ```
    /// use quorumlock::{ConfigError, Redlock};
    ///
    /// let nodes = ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"];
    /// let locks = Redlock::builder(nodes).key_prefix("billing").build()?;
    /// assert!(matches!(
    ///     Redlock::builder(nodes).key_prefix("a:b").build(),
    ///     Err(ConfigError::InvalidPrefix { .. })
    /// ));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Compat mode (default: off): lock the plain resource name the way other Redlock clients
    /// do, so that this client and services on redsync (Go), node-redlock, pottery (Python) or
    /// rslock exclude each other on the same nodes, for example during a migration.
    ///
    /// Give the name of the Redis key the other client writes: redsync, node-redlock and rslock
    /// lock the name they are given (use the same name); pottery's `Redlock(key=NAME)` locks
    /// `redlock:NAME` (its `_KEY_PREFIX`), so give `redlock:NAME` to exclude it (tested against
    /// rslock and pottery: `tests/compat.rs`).
    ///
    /// The lock on `K` is the key `K` itself (no prefix, no hash tag), set with
    /// `SET K value NX PX ttl` (`value`: 32 hex digits, as other clients write); release is compare-and-delete,
    /// extension compare-and-`PEXPIRE` (an extension never re-sets a key a node lost). Every
    /// call names the key `K` only, as the other clients' calls do: a Redis user limited to the
    /// resource's key is enough (`docs/acl.md`), and on a Redis Cluster member no call spans two
    /// slots. So there is no waiters marker either: a waiting `acquire` polls (the client's
    /// retry pause, doubling up to 1 s) instead of being woken by the release. There are
    /// no fencing counters: tokens are [`FencingToken`](crate::FencingToken) 0, and elections and
    /// run-once jobs refuse the client ([`ConfigError::FencingRequired`]), as with
    /// [`fencing(false)`](Self::fencing). Every client of a resource must use the same nodes,
    /// in any order, and the same quorum (a majority).
    ///
    /// ```
    /// use quorumlock::Redlock;
    ///
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .compat(true) // the lock on "orders" is the Redis key "orders", as in redsync
    ///     .build()?;
    /// # Ok::<(), quorumlock::ConfigError>(())
    /// ```
    pub fn compat(mut self, enabled: bool) -> Self {
        self.compat = enabled;
        self
    }

    /// Names this client as the owner of the locks it takes (default: none), the way consul
    /// shows a session's node: `"host-a/pid 4711"`, a pod name, a job id. The name is stored
    /// on the nodes with each lock and shown by [`Redlock::status`] ([`KeyState::owner`],
    /// [`LockStatus::owner`]), by `redlock status`, by [`Lock::owner`] and by an election's
    /// [`Leader::owner`], beside the lock's random value that `status` showed alone before.
    ///
    /// It travels inside the lock's value, after its 32 hex digits: `<32 hex digits>@<name>`,
    /// with `%` and the space written `%25` and `%20`. The hex digits alone still make each
    /// acquisition's value unique, and every ownership check (extension, release) compares the
    /// whole value as before, so naming a client changes no safety argument; no other key or
    /// command is used (the ACL of [`guide::acl`](crate::guide::acl) is enough, compat mode
    /// works alike). Names are not secrets (anyone who can read the keys reads them) and not
    /// checked for uniqueness: two clients may share a name. It costs its length in bytes on
    /// each acquire, extend and release call.
    ///
    /// 1 to 128 bytes of UTF-8 without control characters; [`build`](Self::build) returns
    /// [`ConfigError::InvalidOwner`] otherwise.
    ///
    /// ```
    /// use quorumlock::{ConfigError, Redlock};
    ///
    /// let nodes = ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"];
    /// let pid = std::process::id();
    /// let locks = Redlock::builder(nodes).owner(format!("host-a/pid {pid}")).build()?;
    /// assert_eq!(locks.owner(), Some(format!("host-a/pid {pid}").as_str()));
    /// assert!(matches!(
    ///     Redlock::builder(nodes).owner("two\nlines").build(),
    ///     Err(ConfigError::InvalidOwner { .. })
    /// ));
    /// # Ok::<(), ConfigError>(())
    /// ```
    ///
    /// [`Redlock::status`]: crate::Redlock::status
    /// [`KeyState::owner`]: crate::KeyState::owner
    /// [`LockStatus::owner`]: crate::LockStatus::owner
    /// [`Lock::owner`]: crate::Lock::owner
    /// [`Leader::owner`]: crate::Leader::owner
    pub fn owner(mut self, name: impl Into<String>) -> Self {
        self.owner = Some(name.into());
        self
    }

    /// (Feature `metrics`.) Gives the per-lock metrics a `lock` label with the lock's name (the
    /// user key; a semaphore permit's key, an election's or a run-once job's name): default
    /// off. `quorumlock_attempts_total`, `quorumlock_acquire_total`,
    /// `quorumlock_acquire_wait_seconds` and `quorumlock_locks_lost_total` then count per lock,
    /// so that the one hot or failing lock among many can be found. Off by default because
    /// each name is a time series in the metrics backend: turn it on when the set of names is
    /// small and fixed (jobs, resources), not when names carry ids (`order-81723`). The node
    /// metrics are per node, never per lock. The table of every metric is in `docs/observability.md`
    /// ([`guide::observability`](crate::guide::observability)).
    ///
    /// ```
    /// use quorumlock::Redlock;
    ///
    /// let nodes = ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"];
    /// // A handful of fixed job names: one series per job is affordable.
    /// let locks = Redlock::builder(nodes).metrics_lock_label(true).build()?;
    /// # let _ = locks;
    /// # Ok::<(), quorumlock::ConfigError>(())
    /// ```
    pub fn metrics_lock_label(mut self, enabled: bool) -> Self {
        self.metrics_lock_label = enabled;
        self
    }

    /// Whether acquisitions hand out fencing tokens (default: yes).
    ///
    /// With `false`, each node runs a plain `SET NX PX` instead of the acquire-and-fence script
    /// (about 3 µs less server CPU per node and acquisition, which matters only when the Redis
    /// nodes are CPU-bound), [`Lock::token`](crate::Lock::token) is always 0, and
    /// [`Election`](crate::Election) and [`RunOnce`](crate::RunOnce) refuse the client. Keep
    /// fencing on for anything whose correctness matters: see `docs/safety.md`.
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing = enabled;
        self
    }

    /// Where the client's node connections and rounds run (default [`IoThread::Never`]: on the
    /// caller's runtime).
    ///
    /// With [`IoThread::Always`], the connections and every operation (acquisitions, extensions,
    /// releases, status reads, keep-alive, waiting) run on a current-thread runtime on one
    /// thread the client owns, started at its first operation and ended when the last handle on
    /// the client is dropped; an operation then costs its caller two hand-offs between threads.
    /// Measured on 2-core machines (`docs/benchmarks.md`, the `quorumlock-io` rows), it gives no lower
    /// latency than the default on a multi-thread runtime and costs about three times the
    /// client CPU per operation under concurrency: keep the default unless your own figures
    /// say otherwise.
    pub fn io_thread(mut self, mode: IoThread) -> Self {
        self.io_thread = mode;
        self
    }

    /// (Feature `testkit`, for tests.) Keeps the member at `position` (0-based, in the order
    /// given) on the acquire script, as a Redis 6 node or a Cluster member is, even when it
    /// could take the pipelined acquire: lets a test mix both forms in one client.
    #[cfg(feature = "testkit")]
    #[doc(hidden)]
    pub fn testkit_script_acquire(mut self, position: usize) -> Self {
        self.script_acquire.push(position);
        self
    }

    /// (Feature `tls`.) Trusts this CA certificate (PEM) for `rediss://` nodes, in place of the
    /// system's root certificates: for Redis servers with certificates from a private CA.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls
            .get_or_insert(redis::TlsCertificates {
                client_tls: None,
                root_cert: None,
            })
            .root_cert = Some(pem.into());
        self
    }

    /// (Feature `tls`.) Presents this client certificate and private key (both PEM) to
    /// `rediss://` nodes that require mutual TLS (`tls-auth-clients yes`).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls
            .get_or_insert(redis::TlsCertificates {
                client_tls: None,
                root_cert: None,
            })
            .client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// The checked configuration as an engine over its nodes ([`build`](Self::build) wraps it
    /// in the face).
    pub(crate) fn engine(self) -> Result<Engine, ConfigError> {
        if self.members.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(ConfigError::DriftFactor(self.drift_factor));
        }
        let keys = KeyLayout::new(&self.key_prefix, self.compat)?;
        let owner_suffix = match &self.owner {
            Some(name) => crate::core::value::owner_suffix(name)?,
            None => String::new(),
        };
        if self.node_timeout.is_zero() {
            return Err(ConfigError::ZeroDuration(Setting::NodeTimeout));
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroDuration(Setting::ConnectTimeout));
        }
        for (name, value, max) in [
            (Setting::NodeTimeout, self.node_timeout, Self::MAX_TIMING),
            (
                Setting::ConnectTimeout,
                self.connect_timeout,
                Self::MAX_TIMING,
            ),
            (Setting::RetryDelay, self.retry_delay, Self::MAX_TIMING),
            (Setting::RetryJitter, self.retry_jitter, Self::MAX_TIMING),
            (
                Setting::MaxTtl,
                self.max_ttl.unwrap_or_default(),
                Self::MAX_TTL,
            ),
        ] {
            if value > max {
                return Err(ConfigError::TooLong { name, value, max });
            }
        }
        let cfg = self.config(keys, owner_suffix);
        Engine::assemble(
            &self.members,
            cfg,
            self.max_ttl,
            &self.tls(),
            self.scripted(),
        )
    }

    /// The members (by position, from 0) a test keeps on the acquire script (feature
    /// `testkit`).
    fn scripted(&self) -> &[usize] {
        #[cfg(feature = "testkit")]
        return &self.script_acquire;
        #[cfg(not(feature = "testkit"))]
        &[]
    }

    /// The checked settings as the engine's plain values.
    fn config(&self, keys: KeyLayout, owner_suffix: String) -> Config {
        Config {
            node_timeout: self.node_timeout,
            connect_timeout: self.connect_timeout,
            drift_factor: self.drift_factor,
            retry_count: self.retry_count,
            retry_delay: self.retry_delay,
            retry_jitter: self.retry_jitter,
            restart_guard: self.restart_guard,
            eviction_guard: self.eviction_guard,
            fencing: self.fencing && !self.compat,
            keys,
            owner: self.owner.clone(),
            owner_suffix,
            metrics_lock_label: self.metrics_lock_label,
            io_thread: self.io_thread,
        }
    }

    #[cfg(feature = "tls")]
    fn tls(&self) -> Tls {
        self.tls.clone()
    }

    #[cfg(not(feature = "tls"))]
    fn tls(&self) -> Tls {}
}

impl Default for RedlockBuilder {
    /// A builder with no members yet, for members given one by one with
    /// [`node`](RedlockBuilder::node), [`client`](RedlockBuilder::client) or
    /// [`cluster_client`](RedlockBuilder::cluster_client).
    fn default() -> Self {
        RedlockBuilder::new(std::iter::empty::<&str>())
    }
}
