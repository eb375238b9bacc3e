//! Clusters reused by the tests of one binary, where isolation allows.
//!
//! [`cluster`] hands a test a cluster of `n` default masters: one a finished test gave back
//! when there is one, else a new one. A cluster goes back to the pool only when nothing in it
//! can differ from a fresh one once it is reset:
//! - every server is running and none is paused: `kill`, `restart`, `pause` and `resume`
//!   through this wrapper are tracked (a server killed and restarted is a fresh process, empty),
//!   while a server reached by `server` or the cluster by `faults` could have been signalled in
//!   any way, so the cluster then dies with its test;
//! - the test did not panic;
//! - it ran on a current-thread tokio runtime, so none of its tasks can run after it (on a
//!   multi-thread runtime, or with threads of its own, a test's clients may still be writing).
//!
//! Taking a cluster from the pool resets each node: every other connection killed (their
//! unread input dropped with them), all keys, scripts and functions flushed, the statistics
//! (`INFO commandstats`, `total_connections_received`, ...), the slow log, the latency monitor
//! and the ACL log reset. A node whose `CONFIG GET *` or `ACL LIST` differs from what it had
//! when it was new, or that does not answer within [`RESET_TIMEOUT`], is not reused: the
//! cluster is dropped and another one taken or started.
//!
//! What a reset cannot renew is a server's age (`uptime_in_seconds`, its run id): a test that
//! judges it (the strict restart guard holds out young nodes) takes [`fresh_cluster`].
//!
//! Pub/sub channels are global to a server; since every node is reset between tenants and a
//! cluster has one tenant at a time, no notice crosses from one test to another.
//!
//! Idle clusters sit in a `static`, whose destructor never runs: each carries a
//! [`Reaper`](quorumlock::testkit::Reaper), so its servers die with the test process however it
//! ends.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::sync::Mutex;
use std::time::Duration;

use quorumlock::testkit::{LocalCluster, Reaper, RedisServer, TestkitError};

/// How long one node may take to answer the reset's checks and commands.
const RESET_TIMEOUT: Duration = Duration::from_secs(2);

/// What a node had when it was new: its whole configuration and its users.
#[derive(PartialEq)]
struct Baseline {
    config: BTreeMap<String, String>,
    acl: Vec<String>,
}

struct Pooled {
    cluster: LocalCluster,
    baselines: Vec<Baseline>,
    /// Dropped after `cluster` (fields drop in order): disarmed once the servers are gone.
    reaper: Reaper,
}

static IDLE: Mutex<Vec<Pooled>> = Mutex::new(Vec::new());

/// A cluster of `n` default masters for one test, reused from an earlier test of this binary
/// when one is idle (see the module's text for when a cluster is reused).
pub fn cluster(n: usize) -> Cluster {
    super::init_tracing();
    while let Some(pooled) = take_idle(n) {
        if let Ok(()) = reset(&pooled) {
            return Cluster {
                pooled: Some(pooled),
                faults: Faults::default(),
            };
        }
        // Dropped here: its servers are stopped.
    }
    let cluster = LocalCluster::start(n).unwrap_or_else(|e| panic!("{e}"));
    let baselines = (0..n)
        .map(|i| baseline(server(&cluster, i)).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let reaper = cluster.reap_at_exit().unwrap_or_else(|e| panic!("{e}"));
    Cluster {
        pooled: Some(Pooled {
            cluster,
            baselines,
            reaper,
        }),
        faults: Faults::default(),
    }
}

/// A cluster of `n` default masters of this test's own, new and never reused: for a test that
/// needs young servers (see the module's text) or hands the cluster to something else.
pub fn fresh_cluster(n: usize) -> LocalCluster {
    super::init_tracing();
    LocalCluster::start(n).unwrap_or_else(|e| panic!("{e}"))
}

fn take_idle(n: usize) -> Option<Pooled> {
    let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
    let at = idle.iter().position(|p| p.cluster.len() == n)?;
    Some(idle.swap_remove(at))
}

fn server(cluster: &LocalCluster, i: usize) -> &RedisServer {
    cluster.get(i).expect("a server of the cluster")
}

fn connect(server: &RedisServer) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(server.url())?;
    let conn = client.get_connection_with_timeout(RESET_TIMEOUT)?;
    conn.set_read_timeout(Some(RESET_TIMEOUT))?;
    conn.set_write_timeout(Some(RESET_TIMEOUT))?;
    Ok(conn)
}

fn read_baseline(conn: &mut redis::Connection) -> redis::RedisResult<Baseline> {
    Ok(Baseline {
        config: redis::cmd("CONFIG").arg("GET").arg("*").query(conn)?,
        acl: redis::cmd("ACL").arg("LIST").query(conn)?,
    })
}

fn baseline(server: &RedisServer) -> Result<Baseline, TestkitError> {
    connect(server)
        .and_then(|mut conn| read_baseline(&mut conn))
        .map_err(|e| TestkitError::Command {
            what: format!(
                "read the configuration of the server on port {}",
                server.port()
            ),
            output: e.to_string(),
        })
}

/// Makes every node of `pooled` like a fresh one, or says why it cannot be reused.
fn reset(pooled: &Pooled) -> redis::RedisResult<()> {
    for (i, was) in pooled.baselines.iter().enumerate() {
        let mut conn = connect(server(&pooled.cluster, i))?;
        if read_baseline(&mut conn)? != *was {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the node's configuration or users changed",
            )));
        }
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut conn)?;
        redis::pipe()
            .cmd("FLUSHALL")
            .arg("SYNC")
            .ignore()
            .cmd("SCRIPT")
            .arg("FLUSH")
            .arg("SYNC")
            .ignore()
            .cmd("FUNCTION")
            .arg("FLUSH")
            .arg("SYNC")
            .ignore()
            .cmd("SLOWLOG")
            .arg("RESET")
            .ignore()
            .cmd("LATENCY")
            .arg("RESET")
            .ignore()
            .cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .ignore()
            .cmd("CONFIG")
            .arg("RESETSTAT")
            .ignore()
            .query::<()>(&mut conn)?;
    }
    Ok(())
}

/// One test's cluster (see [`cluster`]): reads through `Deref`, faults through the methods
/// below.
pub struct Cluster {
    pooled: Option<Pooled>,
    faults: Faults,
}

/// The faults a test made through its [`Cluster`].
#[derive(Default)]
struct Faults {
    /// Some server was killed, paused or restarted (the reaper's process ids may be stale).
    any: bool,
    /// The servers paused and not resumed since.
    paused: BTreeSet<usize>,
    /// The test had a server or the whole cluster in hand: anything may have been done.
    untracked: bool,
}

impl Deref for Cluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.pooled.as_ref().expect("held until dropped").cluster
    }
}

impl Cluster {
    fn tracked(&mut self) -> &mut LocalCluster {
        self.faults.any = true;
        &mut self.pooled.as_mut().expect("held until dropped").cluster
    }

    /// The cluster for a fault of any kind; it is not reused afterwards.
    pub fn faults(&mut self) -> &mut LocalCluster {
        self.faults.untracked = true;
        self.tracked()
    }

    /// Server `i` (for its process id, a signal, a restart): the cluster is not reused.
    pub fn server(&mut self, i: usize) -> Result<&mut RedisServer, TestkitError> {
        self.faults().server(i)
    }

    /// SIGKILL server `i`.
    pub fn kill(&mut self, i: usize) -> Result<(), TestkitError> {
        self.faults.paused.remove(&i);
        self.tracked().kill(i)
    }

    /// SIGSTOP server `i`.
    pub fn pause(&mut self, i: usize) -> Result<(), TestkitError> {
        self.faults.paused.insert(i);
        self.tracked().pause(i)
    }

    /// SIGCONT server `i`.
    pub fn resume(&mut self, i: usize) -> Result<(), TestkitError> {
        self.tracked().resume(i)?;
        self.faults.paused.remove(&i);
        Ok(())
    }

    /// Restarts server `i` on its port (empty).
    pub fn restart(&mut self, i: usize) -> Result<(), TestkitError> {
        self.faults.paused.remove(&i);
        self.tracked().restart(i)
    }

    /// Restarts server `i` on its port with its data deleted.
    pub fn restart_empty(&mut self, i: usize) -> Result<(), TestkitError> {
        self.faults.paused.remove(&i);
        self.tracked().restart_empty(i)
    }
}

/// Whether the caller runs on a current-thread tokio runtime (the default of `#[tokio::test]`).
fn on_current_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let Some(mut pooled) = self.pooled.take() else {
            return;
        };
        let faults = &self.faults;
        let cluster = &pooled.cluster;
        let whole = (0..cluster.len()).all(|i| server(cluster, i).is_running());
        if faults.untracked
            || !faults.paused.is_empty()
            || !whole
            || std::thread::panicking()
            || !on_current_thread_runtime()
        {
            return; // dropped: its servers stop
        }
        if faults.any {
            // A restarted server has a new process id: the reaper must name it.
            match cluster.reap_at_exit() {
                Ok(reaper) => pooled.reaper = reaper,
                Err(_) => return,
            }
        }
        IDLE.lock().unwrap_or_else(|e| e.into_inner()).push(pooled);
    }
}
