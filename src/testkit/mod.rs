//! Throwaway local `redis-server` processes (feature `testkit`): what the tests, the benchmarks
//! and `redlock demo` run against. Each server gets a free loopback port, its own temporary
//! directory and log file, and no persistence unless asked; it can be killed (SIGKILL), paused
//! (SIGSTOP), resumed and restarted on the same port. Dropping a server kills it and waits for
//! it, so a panicking test leaves nothing behind.
//!
//! The binary is `redis-server` from `PATH`, or the path in `REDIS_SERVER_BIN`.
//!
//! Beside N standalone masters ([`LocalCluster`]) it starts the other deployment shapes a
//! quorum member can take: a Redis Cluster ([`RedisClusterMember`], three masters joined with
//! `redis-cli --cluster create`) and a Sentinel-managed primary ([`SentinelGroup`], a primary, a
//! replica and three sentinels). `redis-cli` comes from `PATH` or `REDIS_CLI_BIN`; sentinels
//! run as `redis-server --sentinel`.
//!
//! ```no_run
//! use quorumlock::testkit::LocalCluster;
//! let mut cluster = LocalCluster::start(5)?;
//! let urls = cluster.urls();
//! cluster.pause(0)?; // a hung master
//! cluster.kill(1)?;  // a dead one
//! cluster.restart(1)?; // back, empty
//! # Ok::<(), quorumlock::testkit::TestkitError>(())
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod cluster;
mod net;
mod options;
mod reaper;
mod sentinel;

pub use cluster::RedisClusterMember;
use net::{free_port, ping, query, wait_until};
pub use options::{ServerOptions, TlsFiles};
pub use reaper::Reaper;
pub use sentinel::SentinelGroup;

/// How long a server may take to answer its first PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports a start tries before giving up (the free-port check can race).
const PORT_TRIES: usize = 5;

/// Why the harness could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// `redis-server` is not installed.
    #[error(
        "redis-server not found ({bin}): install it with `sudo apt-get install -y redis-server` \
         (Debian/Ubuntu), or point REDIS_SERVER_BIN at the binary"
    )]
    NotInstalled {
        /// The binary that was tried.
        bin: String,
    },
    /// The server did not become ready.
    #[error("redis-server on port {port} did not start: {reason}; its log:\n{log}")]
    NotReady {
        /// The port.
        port: u16,
        /// What went wrong.
        reason: String,
        /// The server's log file.
        log: String,
    },
    /// A Cluster or Sentinel group did not reach the state waited for in time.
    #[error("{what} not reached within {timeout:?}: {last}")]
    Timeout {
        /// The state waited for.
        what: String,
        /// The bound.
        timeout: Duration,
        /// The last thing observed.
        last: String,
    },
    /// A helper command (`redis-cli --cluster create`, say) failed.
    #[error("{what} failed: {output}")]
    Command {
        /// The command.
        what: String,
        /// Its output.
        output: String,
    },
    /// An index beyond the cluster's size.
    #[error("no node {0} in this cluster")]
    NoSuchNode(usize),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestkitError {
    let what = what.into();
    move |source| TestkitError::Io { what, source }
}

/// One `redis-server` child process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
    options: ServerOptions,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers PING.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotInstalled`] when there is no `redis-server`; [`TestkitError::NotReady`]
    /// (with the server's log) when it does not come up.
    pub fn start(options: &ServerOptions) -> Result<Self, TestkitError> {
        let mut last = None;
        for _ in 0..PORT_TRIES {
            let dir = tempfile::Builder::new()
                .prefix("quorumlock-redis-")
                .tempdir()
                .map_err(io("create a temporary directory"))?;
            let tls_port = match options.tls {
                Some(_) => Some(free_port()?),
                None => None,
            };
            let mut server = RedisServer {
                port: free_port()?,
                tls_port,
                dir,
                child: None,
                options: options.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e @ TestkitError::NotReady { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| TestkitError::Io {
            what: "start redis-server".to_owned(),
            source: std::io::Error::other("no port tried"),
        }))
    }

    fn spawn(&mut self) -> Result<(), TestkitError> {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned());
        let dir = self.dir.path();
        let mut cmd = Command::new(&bin);
        if !self.options.config.is_empty() {
            let conf = dir.join("redis.conf");
            std::fs::write(&conf, self.options.config.join("\n") + "\n")
                .map_err(io("write redis.conf"))?;
            cmd.arg(conf);
        }
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--save", ""])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--daemonize", "no"]);
        self.option_args(&mut cmd);
        cmd.envs(self.options.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                TestkitError::NotInstalled { bin: bin.clone() }
            } else {
                TestkitError::Io {
                    what: format!("spawn {bin}"),
                    source: e,
                }
            }
        })?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// The command-line arguments of the server's [`ServerOptions`] beyond its port, bind
    /// address and files.
    fn option_args(&self, cmd: &mut Command) {
        if let Some(password) = &self.options.password {
            cmd.args(["--requirepass", password]);
        }
        if self.options.unix_socket {
            cmd.arg("--unixsocket")
                .arg(self.socket_path())
                .args(["--unixsocketperm", "700"]);
        }
        if let (Some(tls), Some(port)) = (&self.options.tls, self.tls_port) {
            cmd.arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args([
                    "--tls-auth-clients",
                    if tls.require_client_cert { "yes" } else { "no" },
                ]);
        }
        if let Some((bytes, policy)) = &self.options.maxmemory {
            cmd.arg("--maxmemory")
                .arg(bytes.to_string())
                .arg("--maxmemory-policy")
                .arg(policy);
        }
        if self.options.config_disabled {
            cmd.args(["--rename-command", "CONFIG", ""]);
        }
        if self.options.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-node-timeout", "1000"]);
        }
        if let Some(port) = self.options.replica_of {
            cmd.args(["--replicaof", "127.0.0.1"]).arg(port.to_string());
        }
        if self.options.aof_always {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
    }

    fn wait_ready(&mut self) -> Result<(), TestkitError> {
        let start = Instant::now();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(self.not_ready(format!("exited with {status}")));
            }
            if ping(addr, self.auth()) {
                return Ok(());
            }
            if start.elapsed() > READY_TIMEOUT {
                self.stop();
                return Err(self.not_ready(format!("no PONG within {READY_TIMEOUT:?}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn not_ready(&self, reason: String) -> TestkitError {
        TestkitError::NotReady {
            port: self.port,
            reason,
            log: self.log(),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, or `redis://:PASSWORD@127.0.0.1:PORT` with a password
    /// (`redis://USER:PASSWORD@...` with an ACL user).
    pub fn url(&self) -> String {
        match self.auth() {
            Some((user, password)) => format!("redis://{user}:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The user (empty for the default) and password clients authenticate with, if any.
    fn auth(&self) -> Option<(&str, &str)> {
        match (&self.options.user, &self.options.password) {
            (Some((user, password)), _) => Some((user, password)),
            (None, Some(password)) => Some(("", password)),
            (None, None) => None,
        }
    }

    /// `rediss://127.0.0.1:TLS_PORT` (with the password when one is set), when started with
    /// [`ServerOptions::tls`].
    pub fn tls_url(&self) -> Option<String> {
        let port = self.tls_port?;
        Some(match &self.options.password {
            Some(password) => format!("rediss://:{password}@127.0.0.1:{port}"),
            None => format!("rediss://127.0.0.1:{port}"),
        })
    }

    /// `unix:///path/redis.sock` (with `?pass=PASSWORD` when one is set), when started with
    /// [`ServerOptions::unix_socket`].
    pub fn unix_url(&self) -> Option<String> {
        if !self.options.unix_socket {
            return None;
        }
        let path = self.socket_path();
        Some(match &self.options.password {
            Some(password) => format!("unix://{}?pass={password}", path.display()),
            None => format!("unix://{}", path.display()),
        })
    }

    fn socket_path(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// Its directory: data files, log, configuration file and unix socket.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (possibly paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL, then wait for the process. A no-op when not running.
    pub fn kill(&mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the server keeps its port and connections but answers nothing.
    ///
    /// # Errors
    ///
    /// When the process is not running or the signal fails.
    pub fn pause(&mut self) -> Result<(), TestkitError> {
        self.signal(Signal::SIGSTOP)
    }

    /// SIGCONT after [`pause`](Self::pause).
    ///
    /// # Errors
    ///
    /// When the process is not running or the signal fails.
    pub fn resume(&mut self) -> Result<(), TestkitError> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&mut self, sig: Signal) -> Result<(), TestkitError> {
        let pid = self.pid().ok_or_else(|| TestkitError::Io {
            what: format!("signal {sig} to the server on port {}", self.port),
            source: std::io::Error::other("not running"),
        })?;
        let pid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        kill(pid, sig).map_err(|e| TestkitError::Io {
            what: format!("signal {sig} to the server on port {}", self.port),
            source: std::io::Error::from(e),
        })
    }

    /// Kills the server (if running) and starts it again on the same port with the same data
    /// directory: empty without persistence, with its keys under [`ServerOptions::aof_always`].
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn restart(&mut self) -> Result<(), TestkitError> {
        self.stop();
        self.spawn()
    }

    /// Kills the server and starts it again on the same port with its data files deleted (its
    /// log and configuration file kept).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn restart_empty(&mut self) -> Result<(), TestkitError> {
        self.stop();
        for entry in std::fs::read_dir(self.dir.path()).map_err(io("read the data directory"))? {
            let path = entry.map_err(io("read the data directory"))?.path();
            if path
                .file_name()
                .is_some_and(|n| n != "redis.log" && n != "redis.conf")
            {
                let _ = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
        self.spawn()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// N independent local masters.
#[derive(Debug)]
pub struct LocalCluster {
    servers: Vec<RedisServer>,
}

impl LocalCluster {
    /// Starts `n` servers without persistence.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`]; servers already started are stopped.
    pub fn start(n: usize) -> Result<Self, TestkitError> {
        Self::start_with(n, &ServerOptions::default())
    }

    /// Starts `n` servers with these options.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`]; servers already started are stopped.
    pub fn start_with(n: usize, options: &ServerOptions) -> Result<Self, TestkitError> {
        let servers = (0..n)
            .map(|_| RedisServer::start(options))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LocalCluster { servers })
    }

    /// How many servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// True for a cluster of none.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Every server's URL, in order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// Server `i`.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchNode`].
    pub fn server(&mut self, i: usize) -> Result<&mut RedisServer, TestkitError> {
        self.servers.get_mut(i).ok_or(TestkitError::NoSuchNode(i))
    }

    /// Server `i`, read-only.
    pub fn get(&self, i: usize) -> Option<&RedisServer> {
        self.servers.get(i)
    }

    /// SIGKILL server `i`.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchNode`].
    pub fn kill(&mut self, i: usize) -> Result<(), TestkitError> {
        self.server(i)?.kill();
        Ok(())
    }

    /// SIGSTOP server `i`.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::pause`].
    pub fn pause(&mut self, i: usize) -> Result<(), TestkitError> {
        self.server(i)?.pause()
    }

    /// SIGCONT server `i`.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::resume`].
    pub fn resume(&mut self, i: usize) -> Result<(), TestkitError> {
        self.server(i)?.resume()
    }

    /// Restart server `i` on its port (empty unless it persists).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::restart`].
    pub fn restart(&mut self, i: usize) -> Result<(), TestkitError> {
        self.server(i)?.restart()
    }

    /// A [`Reaper`] that kills these servers (as they run now) and removes their directories
    /// when this process ends, however it ends, for a cluster kept where no destructor runs:
    /// a `static` pool of clusters shared by the tests of one binary, say. Dropping the reaper
    /// disarms it. A server restarted after this call is not covered (its process id changed).
    ///
    /// ```no_run
    /// use std::sync::Mutex;
    /// use quorumlock::testkit::{LocalCluster, Reaper};
    /// static SHARED: Mutex<Vec<(LocalCluster, Reaper)>> = Mutex::new(Vec::new());
    /// let cluster = LocalCluster::start(5)?;
    /// let reaper = cluster.reap_at_exit()?;
    /// SHARED.lock().unwrap().push((cluster, reaper)); // never dropped, yet never leaked
    /// # Ok::<(), quorumlock::testkit::TestkitError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] when `sh` cannot be started.
    pub fn reap_at_exit(&self) -> Result<Reaper, TestkitError> {
        Reaper::watch(
            self.servers.iter().filter_map(RedisServer::pid),
            self.servers.iter().map(RedisServer::dir),
        )
    }

    /// Restart server `i` on its port with its data deleted.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::restart_empty`].
    pub fn restart_empty(&mut self, i: usize) -> Result<(), TestkitError> {
        self.server(i)?.restart_empty()
    }
}

/// Test support (not a stable API): the current reading of the clock that lock deadlines are
/// measured on (`CLOCK_BOOTTIME` on Linux and Android), as time since that clock's origin.
#[doc(hidden)]
pub fn deadline_clock_now() -> Duration {
    crate::core::clock::now().since_origin()
}

/// Benchmark support (not a stable API): the body of the library's acquire script, the fenced
/// acquire's form on nodes that do not take the pipelined one (Redis 6, Cluster members;
/// `docs/safety.md`, "Fencing tokens").
#[doc(hidden)]
pub fn acquire_script_source() -> &'static str {
    crate::node::scripts::ACQUIRE.code()
}
