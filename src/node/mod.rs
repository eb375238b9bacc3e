//! The node layer: everything the crate says to one Redis server goes through a [`Node`].
//!
//! One lazily established, self-healing multiplexed connection per node ([`connection`]),
//! shared by lock rounds, election records, run-once markers and repairs (pub/sub opens its own
//! connection through the same client and settings); per-call deadlines and error
//! classification (here); scripts with their `NOSCRIPT` fallback ([`scripts`]); a round's gate
//! ([`gate`]); the restart and eviction guards' view of the node ([`health`]); repair I/O
//! ([`repair`]); the waiting client's plain commands ([`commands`]); address parsing and
//! redaction ([`address`]).
//!
//! Connecting runs in a spawned task bounded by the connect timeout, so a caller whose per-node
//! deadline is short can give up waiting without cancelling the connect for the next caller.
//! A connection is replaced only when it breaks (not on a timeout): while it lives, every call
//! to a node travels in order on it, so a release always reaches the node after the acquire it
//! undoes.

pub(crate) mod acquire_form;
pub(crate) mod address;
pub(crate) mod cluster;
pub(crate) mod commands;
pub(crate) mod connection;
pub(crate) mod gate;
pub(crate) mod health;
pub(crate) mod inventory;
mod link;
mod liveness;
pub(crate) mod lua;
pub(crate) mod member;
pub(crate) mod pubsub;
mod repair;
mod resp;
pub(crate) mod scripts;
mod server;
mod stream;
mod wallclock;
mod wire;

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use link::Single;
use redis::Value;
use tokio::time::Instant;

use crate::core::health::{EvictionGuard, RestartGuard};
use crate::error::NodeError;

use self::cluster::ClusterView;
use self::connection::ConnSlot;
pub(crate) use self::gate::{Gate, NotSent, RoundGate, Ungated};
use self::health::NodeHealth;
pub(crate) use self::health::{HoldOut, MaxTtl, Peers};
use self::liveness::Liveness;
use self::member::{Member, MemberConn};
use self::scripts::ScriptCall;

/// What a call is for: its label in metrics and log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Extend,
    Release,
    Status,
    /// Raising lagging fencing counters after an acquisition.
    Raise,
    /// A command of a feature on top (election records, run-once markers).
    Command,
}

impl Op {
    /// The label used in metrics and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Extend => "extend",
            Op::Release => "release",
            Op::Status => "status",
            Op::Raise => "raise",
            Op::Command => "command",
        }
    }
}

/// What a node needs of the client's configuration: plain values, never the builder.
#[derive(Debug, Clone)]
pub(crate) struct NodeSettings {
    pub(crate) connect_timeout: Duration,
    /// The node timeout: how long a connection's server may stay silent with calls
    /// outstanding before acquisitions stop queueing calls to it (`connection.rs`).
    pub(crate) node_timeout: Duration,
    pub(crate) restart_guard: RestartGuard,
    pub(crate) eviction_guard: EvictionGuard,
    /// Whether acquires carry a fencing counter (`acquire_form.rs`).
    pub(crate) fenced: bool,
    /// The clock-drift factor: the clock-jump check (`wallclock.rs`) allows this much drift.
    pub(crate) drift_factor: f64,
    /// Keep this node on the acquire script whatever it runs (a test hook).
    #[cfg(feature = "testkit")]
    pub(crate) force_script: bool,
    /// The key of the node's durability marker (`health.rs`), under the key prefix.
    pub(crate) durability_marker: String,
}

/// One Redis master. Its state is split by concern, each part owned by one file: the
/// connection slot ([`connection`]), the restart and eviction guards' view ([`health`]),
/// whether its last call failed (`liveness.rs`), the fenced acquire's form ([`acquire_form`]) and the
/// script mode ([`scripts`]).
pub(crate) struct Node {
    name: String,
    /// A standalone master, a Redis Cluster or a Sentinel-managed primary ([`member`]).
    member: Member,
    /// A Cluster member's masters as last read (their run ids, checked on every call, and their
    /// addresses, for a repair's `SCAN`).
    cluster: Mutex<ClusterView>,
    /// This node's place among the client's nodes, and their shared run ids.
    index: usize,
    peers: Arc<Peers>,
    /// The one connection (`connection.rs`).
    conn: ConnSlot,
    /// The restart and eviction guards' view of the node (`health.rs`).
    health: NodeHealth,
    /// Whether the last call failed, and why (`liveness.rs`).
    live: Liveness,
    /// Scripts go as `EVAL` with their body: an `EVALSHA` was refused (see `scripts.rs`).
    by_eval: AtomicBool,
    /// Whether the switch to `EVAL` was logged (once per node).
    by_eval_logged: AtomicBool,
    /// Which lock scripts the current connection's server is known to have cached.
    scripts_seen: scripts::ScriptsSeen,
    /// The script or the pipelined fenced acquire (`acquire_form.rs`).
    acquire_form: acquire_form::AcquireForm,
    /// The node's wall clock as last read on each connection (`wallclock.rs`).
    wallclock: wallclock::WallClock,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Node {
    pub(crate) fn new(
        name: String,
        member: Member,
        settings: NodeSettings,
        max_ttl: Arc<MaxTtl>,
        index: usize,
        peers: Arc<Peers>,
    ) -> Self {
        Node {
            name,
            member,
            cluster: Mutex::new(ClusterView::default()),
            index,
            peers,
            conn: ConnSlot::new(settings.connect_timeout, settings.node_timeout),
            acquire_form: acquire_form::AcquireForm::new(&settings),
            wallclock: wallclock::WallClock::new(settings.drift_factor),
            health: NodeHealth::new(settings, max_ttl),
            live: Liveness::default(),
            by_eval: AtomicBool::new(false),
            by_eval_logged: AtomicBool::new(false),
            scripts_seen: scripts::ScriptsSeen::default(),
        }
    }

    /// Whether this member is a Redis Cluster (it serves lock rounds only, not
    /// [`with_connection`](Self::with_connection)).
    pub(crate) fn is_cluster(&self) -> bool {
        self.member.kind() == member::MemberKind::Cluster
    }

    /// The node's address, password redacted.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs one script call, bounded by `deadline`.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future may or may not leave the command sent (over `rediss://`, redis-rs
    /// skips a queued command whose caller is gone); if sent, later calls on this node travel
    /// after it on the same connection.
    pub(crate) async fn run(
        self: Arc<Self>,
        call: Arc<ScriptCall>,
        deadline: Instant,
        hold_out: HoldOut,
        op: Op,
    ) -> Result<Value, NodeError> {
        let start = Instant::now();
        match tokio::time::timeout_at(
            deadline,
            Arc::clone(&self).call(call, hold_out, op, Ungated),
        )
        .await
        {
            Ok(Ok(r)) => r,
            Err(_) => {
                let e = NodeError::Timeout(deadline.saturating_duration_since(start));
                self.timed_out(op, &e);
                Err(e)
            }
        }
    }

    /// Runs one script call with no deadline of its own: a round bounds all its calls with one
    /// timer. `Err` (a round's [`NotSent`]) when `gate` stopped the call before it was handed
    /// to its connection. Cancellation as for [`run`](Self::run).
    pub(crate) async fn call<G: Gate>(
        self: Arc<Self>,
        call: Arc<ScriptCall>,
        hold_out: HoldOut,
        op: Op,
        gate: G,
    ) -> Result<Result<Value, NodeError>, G::Stop> {
        #[cfg(feature = "metrics")]
        let start = Instant::now();
        match self.run_now(&call, hold_out, op, gate).await {
            Ok(Ok(value)) => {
                #[cfg(feature = "metrics")]
                crate::metrics::node_latency(&self.name, op.as_str(), start.elapsed());
                self.mark_up();
                Ok(Ok(value))
            }
            // Given up unsent because its round was closed: nothing of the node to record.
            Ok(Err(stop)) => Err(stop),
            Err(e) => {
                self.failed(op, &e);
                Ok(Err(e))
            }
        }
    }

    /// `Ok(Err(_))`: not sent, because the round was closed while this call waited to connect.
    async fn run_now<G: Gate>(
        self: &Arc<Self>,
        call: &ScriptCall,
        hold_out: HoldOut,
        op: Op,
        gate: G,
    ) -> Result<Result<Value, G::Stop>, NodeError> {
        let (mut conn, generation) = self.connection().await?;
        // The lean form where this connection is known to have seen the token (release).
        let call = call.for_node(self.index, generation);
        // Checked after connecting: a (re)connect is what reads the node's run id and uptime.
        if hold_out == HoldOut::Respect {
            let why = self.held_out();
            self.note_held_out(why.as_ref());
            if let Some(reason) = why {
                return Err(reason);
            }
        }
        // The breaker: an acquisition queues no call behind a node's unanswered ones once the
        // node has been silent for a node timeout (`stream.rs`); it counts as failed at once,
        // unsent (its round's gate never sees it handed: the release skips the node). Other
        // calls still go: a release or an extension follows, in order, a call the node has.
        if op == Op::Acquire
            && let Some(for_) = self.silent()
        {
            return Err(NodeError::Silent { for_ });
        }
        // The first poll of the send below hands the command to the connection's queue. Its
        // driver writes it to the socket later, and skips it if this future is gone by then.
        if let Err(stop) = gate.pass() {
            return Ok(Err(stop));
        }
        // Each send is a future of its own that takes the gate and borrows the connection: the
        // state this call keeps while it waits for the reply is that future's, not a copy of it
        // beside the locals above (a round moves every call's future several times), and the
        // connection is held once, here, not once per nested send.
        match &mut conn {
            // An acquire whose last reading of the node's clock is a period old reads it first,
            // on the same connection (the clock-jump check, `wallclock.rs`): a node whose clock
            // jumped since the last reading does not count, whatever the script answered.
            // Boxed: at most one acquire per node and period takes this path, and both futures
            // side by side would set the size of every call's future (see below).
            MemberConn::Single(conn) if op == Op::Acquire && self.clock_due(generation) => {
                let clock = Self::read_clock(conn.clone());
                let send = self.send_single(conn, call, gate, generation);
                let (clock, reply) = Box::pin(async move { futures::join!(clock, send) }).await;
                self.check_clock(generation, clock)?;
                reply
            }
            MemberConn::Single(conn) => self.send_single(conn, call, gate, generation).await,
            // Boxed, as the fallback below: the cold paths stay out of the call's future, which
            // a round moves several times per node (`FuturesUnordered::push`), so its size is
            // paid in copies on every call.
            MemberConn::Cluster(cluster) => {
                Box::pin(self.run_on_cluster(cluster, call, generation))
                    .await
                    .map(Ok)
            }
        }
    }

    /// Sends a call on a single server's connection: the pipelined fenced acquire where the
    /// node takes it (`acquire_form.rs`), else the script.
    async fn send_single<G: Gate>(
        &self,
        conn: &mut Single,
        call: &ScriptCall,
        gate: G,
        generation: u64,
    ) -> Result<Result<Value, G::Stop>, NodeError> {
        if call.is_pipelined() && self.pipelines_on(generation) {
            self.send_pipelined(conn, call, generation).await.map(Ok)
        } else {
            self.send_script(conn, call, gate, generation).await
        }
    }

    /// Sends a script call (or a plain command) on a single server's connection, with the
    /// `EVAL` fallback. `Ok(Err(_))`: the fallback was not sent because the round was closed.
    async fn send_script<G: Gate>(
        &self,
        conn: &mut Single,
        call: &ScriptCall,
        gate: G,
        generation: u64,
    ) -> Result<Result<Value, G::Stop>, NodeError> {
        // A node that refuses `EVALSHA`, and a connection's first call of a script (which
        // caches it there), get the body.
        let first = !self.scripts_seen.cached(call, generation);
        if (first || self.scripts_by_eval())
            && let Some(eval) = call.eval()
        {
            // Boxed: a cold path (once per script and connection, or managed services), kept
            // out of the call's future (below).
            let reply = Box::pin(async move {
                conn.send_packed_command(&eval)
                    .await
                    .and_then(Value::extract_error)
            })
            .await;
            if first && reply.is_ok() {
                self.scripts_seen.saw(call, generation);
            }
            return reply.map(Ok).map_err(|e| self.call_error(e, generation));
        }
        // A server error comes back as a value; `extract_error` turns it into an error.
        let reply = match conn.send_evalsha(call).await.and_then(Value::extract_error) {
            Err(e)
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                    || (call.is_script() && self.evalsha_refused(&e)) =>
            {
                // The fallback is a new send, possibly long after the round's verdict (a parked
                // call is polled by `flush`): not once the round is closed, where it could land
                // after a later extension or the release.
                if let Err(stop) = gate.pass() {
                    return Ok(Err(stop));
                }
                match call.eval() {
                    Some(eval) => {
                        Box::pin(async move {
                            conn.send_packed_command(&eval)
                                .await
                                .and_then(Value::extract_error)
                        })
                        .await
                    }
                    None => Err(e),
                }
            }
            other => other,
        };
        reply.map(Ok).map_err(|e| self.call_error(e, generation))
    }

    /// Runs `op` on this node's one connection (connecting first if needed), bounded by
    /// `deadline`: for the commands of features on top (election records, run-once markers),
    /// which ignore the hold-out (they are not votes) but share the connection, its ordering and
    /// its fail-fast while the node is known down. A broken connection is dropped as for any call.
    pub(crate) async fn with_connection<T, F, Fut>(
        self: &Arc<Self>,
        op: F,
        deadline: Instant,
    ) -> Result<T, NodeError>
    where
        F: FnOnce(Single) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let start = Instant::now();
        let call = async {
            let (conn, generation) = self.connection().await?;
            let MemberConn::Single(conn) = conn else {
                return Err(NodeError::Redis(member::cluster_serves_locks_only()));
            };
            op(conn).await.map_err(|e| self.call_error(e, generation))
        };
        let result = match tokio::time::timeout_at(deadline, call).await {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout(
                deadline.saturating_duration_since(start),
            )),
        };
        match &result {
            Ok(_) => self.mark_up(),
            Err(e) => self.failed(Op::Command, e),
        }
        result
    }

    /// Classifies a call's error; a broken connection is dropped so the next call reconnects.
    /// So is one whose server turned read-only: a Sentinel member's old primary, demoted by a
    /// failover (the reconnect asks the sentinels for the new one).
    fn call_error(&self, e: redis::RedisError, generation: u64) -> NodeError {
        if let Some(denied) = scripts::denial(&e, None) {
            return denied;
        }
        if e.is_unrecoverable_error()
            || e.is_connection_dropped()
            || e.is_io_error()
            || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        {
            self.invalidate(generation);
        }
        NodeError::from_redis(e)
    }
}
