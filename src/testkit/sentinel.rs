//! A local Sentinel-managed primary used as one quorum member.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{RedisServer, ServerOptions, TestkitError, free_port, io, ping, query, wait_until};

/// How long the group may take to settle: the replica in sync, every sentinel aware of the
/// replica and of the two other sentinels (they discover each other through hello messages
/// every 2 s).
const GROUP_READY: Duration = Duration::from_secs(30);
/// How long a failover may take to show (a forced one is announced within a second; after a
/// kill the primary must first be seen down for `down-after-milliseconds`).
const FAILOVER: Duration = Duration::from_secs(30);

/// A Sentinel-managed primary on loopback: one primary, one replica, and three sentinels
/// (`redis-server --sentinel`) monitoring it under [`MASTER_NAME`](Self::MASTER_NAME) with quorum
/// 2 and a `down-after-milliseconds` of 1000. [`url`](Self::url) is its member URL
/// (`redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/quorumlock`). A failover is forced
/// with [`failover`](Self::failover) (`SENTINEL FAILOVER`) or caused with
/// [`kill_primary`](Self::kill_primary); [`wait_for_new_primary`](Self::wait_for_new_primary)
/// waits, bounded, until the sentinels name another server and it answers as a master.
/// Dropping the group kills every process.
///
/// ```no_run
/// use quorumlock::testkit::SentinelGroup;
/// let mut group = SentinelGroup::start()?;
/// let url = group.url();
/// let old = group.primary_port()?;
/// group.failover()?;
/// let new = group.wait_for_new_primary(old)?;
/// assert_ne!(old, new);
/// # Ok::<(), quorumlock::testkit::TestkitError>(())
/// ```
#[derive(Debug)]
pub struct SentinelGroup {
    /// The first primary, then its replica.
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

#[derive(Debug)]
struct Sentinel {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Sentinel {
    fn start(master_port: u16, name: &str) -> Result<Self, TestkitError> {
        let dir = tempfile::Builder::new()
            .prefix("quorumlock-sentinel-")
            .tempdir()
            .map_err(io("create a temporary directory"))?;
        let port = free_port()?;
        let conf: PathBuf = dir.path().join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
             dir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 5000\n\
             sentinel parallel-syncs {name} 1\n",
            dir = dir.path().display(),
        );
        std::fs::write(&conf, text).map_err(io("write sentinel.conf"))?;
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned());
        let child = Command::new(&bin)
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    TestkitError::NotInstalled { bin: bin.clone() }
                } else {
                    TestkitError::Io {
                        what: format!("spawn {bin} --sentinel"),
                        source: e,
                    }
                }
            })?;
        let sentinel = Sentinel {
            port,
            dir,
            child: Some(child),
        };
        let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
        wait_until(
            &format!("sentinel on port {port} answering"),
            Duration::from_secs(10),
            || {
                if ping(addr, None) {
                    Ok(())
                } else {
                    Err(
                        std::fs::read_to_string(sentinel.dir.path().join("sentinel.log"))
                            .unwrap_or_default(),
                    )
                }
            },
        )?;
        Ok(sentinel)
    }
}

impl SentinelGroup {
    /// The name the sentinels monitor the primary under.
    pub const MASTER_NAME: &'static str = "quorumlock";

    /// Starts the primary, its replica and three sentinels, and waits (bounded) until the
    /// replica is in sync and every sentinel knows the replica and the two other sentinels, so
    /// a failover can be authorised and has a server to promote.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`]; [`TestkitError::Timeout`] when the group does not settle.
    pub fn start() -> Result<Self, TestkitError> {
        let primary = RedisServer::start(&ServerOptions::new())?;
        let replica = RedisServer::start(&ServerOptions::new().replica_of(primary.port()))?;
        let sentinels = (0..3)
            .map(|_| Sentinel::start(primary.port(), Self::MASTER_NAME))
            .collect::<Result<Vec<_>, _>>()?;
        let group = SentinelGroup {
            servers: vec![primary, replica],
            sentinels,
        };
        group.wait_settled()?;
        Ok(group)
    }

    /// The member URL: `redis+sentinel://` every sentinel's address, comma-separated, then
    /// `/` and [`MASTER_NAME`](Self::MASTER_NAME).
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{}", addrs.join(","), Self::MASTER_NAME)
    }

    /// The port of the primary the sentinels name now (`SENTINEL get-master-addr-by-name`,
    /// from the first sentinel that answers).
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`] when no sentinel answers within 5 s.
    pub fn primary_port(&self) -> Result<u16, TestkitError> {
        wait_until(
            "a sentinel naming the primary",
            Duration::from_secs(5),
            || self.named_primary(),
        )
    }

    fn named_primary(&self) -> Result<u16, String> {
        let mut last = String::new();
        for s in &self.sentinels {
            let reply: redis::RedisResult<(String, u16)> = query(
                s.port,
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(Self::MASTER_NAME),
            );
            match reply {
                Ok((_, port)) => return Ok(port),
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }

    /// The server (primary or replica) listening on `port`, if it is one of the group's.
    pub fn server_on(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.servers.iter_mut().find(|s| s.port() == port)
    }

    /// Forces a failover (`SENTINEL FAILOVER`, which needs no agreement that the primary is
    /// down): the replica is promoted and the old primary turned into its replica. Returns the
    /// old primary's port; follow with [`wait_for_new_primary`](Self::wait_for_new_primary).
    /// A refusal (`NOGOODSLAVE` while the sentinels' view of the replica is stale) is asked
    /// again, for at most 10 s.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`] when no sentinel accepts within 10 s.
    pub fn failover(&self) -> Result<u16, TestkitError> {
        let old = self.primary_port()?;
        wait_until(
            "a sentinel accepting SENTINEL FAILOVER",
            Duration::from_secs(10),
            || {
                let mut last = String::new();
                for s in &self.sentinels {
                    let reply: redis::RedisResult<String> = query(
                        s.port,
                        redis::cmd("SENTINEL")
                            .arg("FAILOVER")
                            .arg(Self::MASTER_NAME),
                    );
                    match reply {
                        Ok(_) => return Ok(old),
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(last)
            },
        )
    }

    /// SIGKILLs the current primary: the sentinels see it down after 1 s and promote the
    /// replica. Returns the killed primary's port.
    ///
    /// # Errors
    ///
    /// As [`primary_port`](Self::primary_port); [`TestkitError::NoSuchNode`] when the named
    /// primary is none of the group's servers.
    pub fn kill_primary(&mut self) -> Result<u16, TestkitError> {
        let port = self.primary_port()?;
        self.server_on(port)
            .ok_or(TestkitError::NoSuchNode(usize::from(port)))?
            .kill();
        Ok(port)
    }

    /// Waits (bounded) until the sentinels name a primary other than the one on `old`, that
    /// server answers `ROLE` as a master, and the old one, if still running, no longer does
    /// (the sentinels demote it to a replica shortly after the promotion: until then a client
    /// still connected to it can write there, writes the demotion discards); returns the new
    /// primary's port.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`].
    pub fn wait_for_new_primary(&self, old: u16) -> Result<u16, TestkitError> {
        wait_until("a new primary named and serving", FAILOVER, || {
            let port = self.named_primary()?;
            if port == old {
                return Err(format!("the sentinels still name port {old}"));
            }
            let role: Vec<redis::Value> =
                query(port, &redis::cmd("ROLE")).map_err(|e| format!("ROLE on {port}: {e}"))?;
            if !is_master(&role) {
                return Err(format!("port {port} answers ROLE {:?}", role.first()));
            }
            if self
                .servers
                .iter()
                .any(|s| s.port() == old && s.is_running())
            {
                let old_role: Vec<redis::Value> = query(old, &redis::cmd("ROLE"))
                    .map_err(|e| format!("ROLE on the old primary {old}: {e}"))?;
                if is_master(&old_role) {
                    return Err(format!("the old primary on {old} is not demoted yet"));
                }
            }
            Ok(port)
        })
    }

    /// Waits (bounded) until the replica (every server but the named primary that is running)
    /// is in sync and every sentinel knows one replica and two other sentinels.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`].
    pub fn wait_settled(&self) -> Result<(), TestkitError> {
        wait_until("the Sentinel group settled", GROUP_READY, || {
            let primary = self.named_primary()?;
            let info: String = query(primary, redis::cmd("INFO").arg("replication"))
                .map_err(|e| format!("INFO on {primary}: {e}"))?;
            let running = self.servers.iter().filter(|s| s.is_running()).count();
            let online = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .count();
            if online + 1 < running {
                return Err(format!("{online} replica(s) online of {}", running - 1));
            }
            for s in &self.sentinels {
                let replicas: Vec<redis::Value> = query(
                    s.port,
                    redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(Self::MASTER_NAME),
                )
                .map_err(|e| e.to_string())?;
                let peers: Vec<redis::Value> = query(
                    s.port,
                    redis::cmd("SENTINEL")
                        .arg("SENTINELS")
                        .arg(Self::MASTER_NAME),
                )
                .map_err(|e| e.to_string())?;
                if replicas.len() + 1 < running || peers.len() < 2 {
                    return Err(format!(
                        "sentinel {} knows {} replica(s), {} sentinel(s)",
                        s.port,
                        replicas.len(),
                        peers.len()
                    ));
                }
            }
            Ok(())
        })
    }
}

fn is_master(role: &[redis::Value]) -> bool {
    matches!(role.first(), Some(redis::Value::BulkString(b)) if b.as_slice() == b"master")
}
