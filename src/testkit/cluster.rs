//! A local Redis Cluster used as one quorum member.

use std::process::Command;
use std::time::Duration;

use super::{RedisServer, ServerOptions, TestkitError, wait_until};

/// How long a cluster may take to agree on its slots (`cluster_state:ok` on every node), after
/// its creation or a shard's restart.
const CLUSTER_READY: Duration = Duration::from_secs(30);

/// A Redis Cluster of three masters (no replicas) on free loopback ports, joined with
/// `redis-cli --cluster create`: one quorum member whose lock keys are spread over its shards.
/// [`url`](Self::url) is its member URL (`redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`).
/// A shard can be killed and restarted (empty, on its port, keeping its `nodes.conf`, so it
/// rejoins with its slots). Dropping the member kills every shard.
///
/// ```no_run
/// use quorumlock::testkit::RedisClusterMember;
/// let mut cluster = RedisClusterMember::start()?;
/// let url = cluster.url(); // redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
/// cluster.kill_shard(1)?;  // its slots fail until it is back
/// cluster.restart_shard(1)?; // back, empty, cluster_state:ok again
/// # Ok::<(), quorumlock::testkit::TestkitError>(())
/// ```
#[derive(Debug)]
pub struct RedisClusterMember {
    shards: Vec<RedisServer>,
    /// Replicas added with [`add_replica`](Self::add_replica), in order.
    replicas: Vec<RedisServer>,
    options: ServerOptions,
}

impl RedisClusterMember {
    /// How many masters a member has.
    pub const SHARDS: usize = 3;

    /// Starts three cluster-enabled servers, creates the cluster (`redis-cli --cluster create
    /// ... --cluster-replicas 0 --cluster-yes`) and waits (bounded) until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`]; [`TestkitError::Command`] when `redis-cli` fails (or is
    /// missing: install `redis-tools`, or set `REDIS_CLI_BIN`); [`TestkitError::Timeout`] when
    /// the cluster does not become ready.
    pub fn start() -> Result<Self, TestkitError> {
        Self::start_with(&ServerOptions::new())
    }

    /// As [`start`](Self::start), every shard with these options (made cluster-enabled), e.g.
    /// a password: [`url`](Self::url) then carries it, and `redis-cli` authenticates with it.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with(options: &ServerOptions) -> Result<Self, TestkitError> {
        let options = options.clone().cluster();
        let shards = (0..Self::SHARDS)
            .map(|_| RedisServer::start(&options))
            .collect::<Result<Vec<_>, _>>()?;
        let member = RedisClusterMember {
            shards,
            replicas: Vec::new(),
            options: options.clone(),
        };
        let cli = std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".to_owned());
        let mut cmd = Command::new(&cli);
        cmd.args(["--cluster", "create"])
            .args(member.addresses())
            .args(["--cluster-replicas", "0", "--cluster-yes"]);
        if let Some(password) = &options.password {
            cmd.args(["-a", password, "--no-auth-warning"]);
        }
        let what = format!("{cli} --cluster create");
        let output = cmd.output().map_err(|e| TestkitError::Command {
            what: what.clone(),
            output: format!("{e} (install redis-tools, or set REDIS_CLI_BIN)"),
        })?;
        if !output.status.success() {
            return Err(TestkitError::Command {
                what,
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        member.wait_ok()?;
        Ok(member)
    }

    /// `127.0.0.1:PORT` of every shard, in order.
    pub fn addresses(&self) -> Vec<String> {
        self.shards
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect()
    }

    /// The member URL: `redis+cluster://` and every shard's address, comma-separated (with
    /// `:PASSWORD@` first when the shards have one).
    pub fn url(&self) -> String {
        let auth = self
            .shards
            .first()
            .and_then(|s| s.options.password.as_deref())
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        format!("redis+cluster://{auth}{}", self.addresses().join(","))
    }

    /// Shard `i`.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchNode`].
    pub fn shard(&mut self, i: usize) -> Result<&mut RedisServer, TestkitError> {
        self.shards.get_mut(i).ok_or(TestkitError::NoSuchNode(i))
    }

    /// The shard whose slots hold `key` (`CLUSTER KEYSLOT`, then the shard serving that slot).
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`] when no live shard answers.
    pub fn shard_of(&self, key: &str) -> Result<usize, TestkitError> {
        wait_until(
            &format!("the shard of {key:?}"),
            Duration::from_secs(5),
            || {
                let mut last = "no shard running".to_owned();
                for shard in self.shards.iter().filter(|s| s.is_running()) {
                    let reply: redis::RedisResult<(i64, String)> = query_shard(
                        shard,
                        redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
                    )
                    .and_then(|slot| {
                        Ok((
                            slot,
                            query_shard(shard, &redis::cmd("CLUSTER").arg("NODES").clone())?,
                        ))
                    });
                    match reply {
                        Ok((slot, nodes)) => match owner_port(&nodes, slot) {
                            Some(port) => {
                                return self
                                    .shards
                                    .iter()
                                    .position(|s| s.port() == port)
                                    .ok_or_else(|| format!("slot {slot} served by port {port}"));
                            }
                            None => last = format!("slot {slot} unassigned"),
                        },
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(last)
            },
        )
    }

    /// SIGKILL shard `i`: its slots fail (no replicas) until it is back.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchNode`].
    pub fn kill_shard(&mut self, i: usize) -> Result<(), TestkitError> {
        self.shard(i)?.kill();
        Ok(())
    }

    /// Restarts shard `i` on its port, empty (no persistence) but with its `nodes.conf`, and
    /// waits (bounded) until the whole cluster reports `cluster_state:ok` again.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::restart`], and [`TestkitError::Timeout`].
    pub fn restart_shard(&mut self, i: usize) -> Result<(), TestkitError> {
        self.shard(i)?.restart()?;
        self.wait_ok()
    }

    /// Starts a replica of shard `shard` (same options, cluster-enabled), joins it to the
    /// cluster (`CLUSTER MEET`, then `CLUSTER REPLICATE` of the shard's node id) and waits
    /// (bounded) until its replication link is up. Returns its index for
    /// [`replica`](Self::replica). The replica is not a shard: [`shard_of`](Self::shard_of)
    /// and [`wait_ok`](Self::wait_ok) look at the masters started with the member only.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`]; [`TestkitError::Timeout`] when it does not join or sync.
    pub fn add_replica(&mut self, shard: usize) -> Result<usize, TestkitError> {
        let master = self
            .shards
            .get(shard)
            .ok_or(TestkitError::NoSuchNode(shard))?;
        let master_port = master.port();
        let master_id: String = query_shard(master, redis::cmd("CLUSTER").arg("MYID"))
            .map_err(|e| command_error("CLUSTER MYID", &e))?;
        let replica = RedisServer::start(&self.options)?;
        let _: () = query_shard(
            &replica,
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(master_port),
        )
        .map_err(|e| command_error("CLUSTER MEET", &e))?;
        wait_until("the replica to learn its master", CLUSTER_READY, || {
            let nodes: String = query_shard(&replica, redis::cmd("CLUSTER").arg("NODES"))
                .map_err(|e| e.to_string())?;
            if nodes.contains(&master_id) {
                Ok(())
            } else {
                Err(format!("the replica does not know {master_id} yet"))
            }
        })?;
        wait_until("CLUSTER REPLICATE", CLUSTER_READY, || {
            query_shard::<()>(
                &replica,
                redis::cmd("CLUSTER").arg("REPLICATE").arg(&master_id),
            )
            .map_err(|e| e.to_string())
        })?;
        wait_until("the replica's link to its master", CLUSTER_READY, || {
            let info: String = query_shard(&replica, redis::cmd("INFO").arg("replication"))
                .map_err(|e| e.to_string())?;
            if info.lines().any(|l| l.trim() == "master_link_status:up")
                && info
                    .lines()
                    .any(|l| l.trim() == "master_sync_in_progress:0")
            {
                Ok(())
            } else {
                Err("replication link not up yet".to_owned())
            }
        })?;
        self.replicas.push(replica);
        Ok(self.replicas.len() - 1)
    }

    /// Replica `i` (see [`add_replica`](Self::add_replica)).
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchNode`].
    pub fn replica(&mut self, i: usize) -> Result<&mut RedisServer, TestkitError> {
        self.replicas.get_mut(i).ok_or(TestkitError::NoSuchNode(i))
    }

    /// Waits until every running shard reports `cluster_state:ok` and knows all
    /// [`SHARDS`](Self::SHARDS) masters.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`].
    pub fn wait_ok(&self) -> Result<(), TestkitError> {
        wait_until("cluster_state:ok on every shard", CLUSTER_READY, || {
            for shard in self.shards.iter().filter(|s| s.is_running()) {
                let info: String = query_shard(shard, redis::cmd("CLUSTER").arg("INFO"))
                    .map_err(|e| format!("port {}: {e}", shard.port()))?;
                let ok = info.lines().any(|l| l.trim() == "cluster_state:ok");
                let known = info
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("cluster_size:"))
                    .and_then(|v| v.parse::<usize>().ok());
                if !ok || known != Some(Self::SHARDS) {
                    return Err(format!(
                        "port {}: state ok {ok}, cluster_size {known:?}",
                        shard.port()
                    ));
                }
            }
            Ok(())
        })
    }
}

fn command_error(what: &str, e: &redis::RedisError) -> TestkitError {
    TestkitError::Command {
        what: what.to_owned(),
        output: e.to_string(),
    }
}

/// One command on one shard, with its password when it has one.
fn query_shard<T: redis::FromRedisValue>(
    shard: &RedisServer,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(shard.url())?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    cmd.query(&mut conn)
}

/// The port of the master serving `slot` in a `CLUSTER NODES` reply.
fn owner_port(nodes: &str, slot: i64) -> Option<u16> {
    nodes.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields.get(2)?.contains("master") {
            return None;
        }
        let serves = fields.iter().skip(8).any(|range| {
            let mut bounds = range.split('-').map(str::parse::<i64>);
            match (bounds.next(), bounds.next()) {
                (Some(Ok(lo)), Some(Ok(hi))) => (lo..=hi).contains(&slot),
                (Some(Ok(one)), None) => one == slot,
                _ => false,
            }
        });
        if !serves {
            return None;
        }
        // 127.0.0.1:PORT@BUSPORT
        let addr = fields.get(1)?.split('@').next()?;
        addr.rsplit(':').next()?.parse().ok()
    })
}
