//! How a test server is started: persistence, authentication, extra listeners (unix socket,
//! TLS), memory limits, a disabled `CONFIG`, Cluster mode, replication and configuration lines.

use std::path::PathBuf;

/// How servers are started.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ServerOptions {
    /// Persist with an append-only file fsynced on every write (`appendfsync always`), so a
    /// restart keeps the lock keys and fencing counters.
    pub aof_always: bool,
    /// Require this password (`requirepass`); [`RedisServer::url`](super::RedisServer::url) then carries it.
    pub password: Option<String>,
    /// Also listen on a unix socket in the server's directory ([`RedisServer::unix_url`](super::RedisServer::unix_url)).
    pub unix_socket: bool,
    /// Also listen for TLS on a second port ([`RedisServer::tls_url`](super::RedisServer::tls_url)).
    pub tls: Option<TlsFiles>,
    /// A memory limit in bytes (`maxmemory`) and the eviction policy applied when it is reached
    /// (`maxmemory-policy`, e.g. `volatile-lru`).
    pub maxmemory: Option<(u64, String)>,
    /// Disable the `CONFIG` command (`rename-command CONFIG ""`), as managed services do.
    pub config_disabled: bool,
    /// Run as a Redis Cluster node (`cluster-enabled yes`, its `nodes.conf` in the server's
    /// directory, a 1 s node timeout); see [`RedisClusterMember`](super::RedisClusterMember).
    pub cluster: bool,
    /// Start as a replica of the master on this loopback port (`replicaof 127.0.0.1 PORT`).
    pub replica_of: Option<u16>,
    /// Lines of a configuration file written to the server's directory and read at every
    /// start and restart: `rename-command CONFIG ""`, `user NAME on >PASS ~quorumlock:* +get`.
    pub config: Vec<String>,
    /// Connect as this ACL user (name, password): the URLs carry it and the readiness check
    /// authenticates as it (which needs `+ping`).
    pub user: Option<(String, String)>,
    /// Environment variables of the server process (at every start and restart), for
    /// instance `LD_PRELOAD` and `FAKETIME_TIMESTAMP_FILE` to step its clock with libfaketime.
    pub env: Vec<(String, String)>,
}

/// PEM files for a server's TLS port (see [`ServerOptions::tls`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The server's certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signs client certificates (and, usually, the server's).
    pub ca: PathBuf,
    /// Whether clients must present a certificate signed by `ca` (`tls-auth-clients`).
    pub require_client_cert: bool,
}

impl ServerOptions {
    /// No persistence (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// With `appendonly yes` and `appendfsync always`.
    pub fn aof_always(mut self) -> Self {
        self.aof_always = true;
        self
    }

    /// With `requirepass`.
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// With `maxmemory` (bytes) and this `maxmemory-policy`.
    pub fn maxmemory(mut self, bytes: u64, policy: &str) -> Self {
        self.maxmemory = Some((bytes, policy.to_owned()));
        self
    }

    /// With the `CONFIG` command disabled.
    pub fn config_disabled(mut self) -> Self {
        self.config_disabled = true;
        self
    }

    /// As a Redis Cluster node (see [`ServerOptions::cluster`]).
    pub fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// As a replica of the master on this loopback port.
    pub fn replica_of(mut self, port: u16) -> Self {
        self.replica_of = Some(port);
        self
    }

    /// With this line in the server's configuration file (see [`ServerOptions::config`]).
    ///
    /// ```no_run
    /// use quorumlock::testkit::{LocalCluster, ServerOptions};
    /// // A node like a managed service: CONFIG gone, one ACL user, the default user off.
    /// let options = ServerOptions::new()
    ///     .config_line("rename-command CONFIG \"\"")
    ///     .config_line("user default off")
    ///     .config_line("user app on >secret ~quorumlock:* &quorumlock:* +@all -script")
    ///     .user("app", "secret");
    /// let cluster = LocalCluster::start_with(3, &options)?;
    /// # Ok::<(), quorumlock::testkit::TestkitError>(())
    /// ```
    pub fn config_line(mut self, line: &str) -> Self {
        self.config.push(line.to_owned());
        self
    }

    /// With this environment variable set for the server process (see [`ServerOptions::env`]).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Connecting as this ACL user (see [`ServerOptions::user`]).
    pub fn user(mut self, name: &str, password: &str) -> Self {
        self.user = Some((name.to_owned(), password.to_owned()));
        self
    }

    /// With a unix socket beside the TCP port.
    pub fn unix_socket(mut self) -> Self {
        self.unix_socket = true;
        self
    }

    /// With a TLS port beside the plain one, using these PEM files; `require_client_cert` turns
    /// on mutual TLS.
    pub fn tls(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
        ca: impl Into<PathBuf>,
        require_client_cert: bool,
    ) -> Self {
        self.tls = Some(TlsFiles {
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
            require_client_cert,
        });
        self
    }
}
