//! One Redis master: a lazily established, self-healing multiplexed connection, per-call
//! deadlines, error classification, and the restart guard's view of the node.
//!
//! Connecting runs in a spawned task bounded by the connect timeout, so a caller whose per-node
//! deadline is short can give up waiting without cancelling the connect for the next caller.
//! A connection is replaced only when it breaks (not on a timeout): while it lives, every call
//! to a node travels in order on it, so a release always reaches the node after the acquire it
//! undoes.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::time::Instant;

use crate::clock::{self, Stamp};
use crate::config::{EvictionGuard, EvictionRisk, RedlockBuilder, RestartGuard};
use crate::error::NodeError;
use crate::lock;
use crate::metrics;
use crate::scripts::{self, ScriptCall};

type Connected = Result<(MultiplexedConnection, u64), NodeError>;

/// How long calls fail fast with the last connect error before the next connect is tried, so a
/// dead node costs no connect attempt (and no task) per call.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(25);

enum Slot {
    Empty,
    /// The last connect failed: calls fail fast with its error until the instant passes.
    Failed(NodeError, Instant),
    Connecting(Shared<BoxFuture<'static, Connected>>),
    Ready(MultiplexedConnection, u64),
}

#[derive(Default)]
struct Health {
    run_id: Option<String>,
    /// Whether the last connect found the node durable: `appendfsync always`, with its
    /// durability marker in place.
    durable: bool,
    repair: Repair,
    /// The node's memory policy as last read (warned about when it changes to a risky one).
    eviction: EvictionRisk,
    /// Bumped each time a restart makes a repair needed: a repair started before the latest
    /// restart (its raises went to the lost data) cannot finish it.
    repair_epoch: u64,
}

/// The key of a node's durability marker: written once (`SET NX`) on a node that runs with
/// `appendfsync always`, holding the run id of the server it was written to. Found after a
/// restart holding an earlier run id, it shows the keyspace survived the restart.
pub(crate) const MARKER_KEY: &str = "quorumlock:durability-marker";

/// `Node::started` when no restart hold-out applies.
const NOT_STARTED: i64 = i64::MIN;

/// A duration in nanoseconds, saturating.
fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// How a connect met the node, for the restart guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Meeting {
    /// This client never connected to it before.
    First,
    /// The same run id as last time: no restart.
    Same,
    /// A new run id: the node restarted since this client last saw it.
    Restarted,
}

/// Whether the node's keyspace demonstrably survived its start: it runs with `appendfsync
/// always` (`fsync_always`), its durability marker holds a run id other than the current one
/// (written before this run started, and still there), and, for a client that saw the run
/// before, that one was durable too (`durable_before`). A marker holding the current run id was
/// written after the start (perhaps by another client that met the node first): it proves
/// nothing. Pure.
pub(crate) fn data_survived(
    fsync_always: bool,
    marker: Option<&str>,
    run_id: &str,
    durable_before: Option<bool>,
) -> bool {
    fsync_always && durable_before != Some(false) && marker.is_some_and(|m| m != run_id)
}

/// The restart guard's verdict on a connect: `(hold out, repair)`. A held-out node counts
/// toward no quorum until the max ttl in use has passed since its start (checked on every
/// call); a node to repair has its fencing counters restored from the others first. A node
/// whose data survived is neither. Pure.
pub(crate) fn restart_verdict(
    guard: RestartGuard,
    meeting: Meeting,
    survived: bool,
) -> (bool, bool) {
    if guard == RestartGuard::Off || survived {
        return (false, false);
    }
    match meeting {
        Meeting::Restarted => (true, true),
        // Young on first contact may mean restarted without its data: time only, since
        // nothing says its counters fell behind.
        Meeting::First if guard == RestartGuard::Strict => (true, false),
        Meeting::First | Meeting::Same => (false, false),
    }
}

/// The run ids a client's nodes last connected to, shared by its nodes: URLs that differ can
/// reach one server (two databases of it, a hostname and its address, a Unix socket and TCP),
/// and one server must not count as two votes.
///
/// Each node records the run id of every connect; a node counts toward no quorum while another
/// node's latest run id is the same. A restart changes the run id: both nodes record the new
/// one as they reconnect (each on its next call), so the duplication stands across restarts;
/// it ends only when one of the URLs reaches another server.
#[derive(Debug)]
pub(crate) struct Peers {
    names: Vec<String>,
    run_ids: Mutex<Vec<Option<String>>>,
    /// Whether two nodes share a run id now: lets every call skip the mutex otherwise.
    shared: AtomicBool,
}

impl Peers {
    pub(crate) fn new(names: impl IntoIterator<Item = String>) -> Self {
        let names: Vec<String> = names.into_iter().collect();
        Peers {
            run_ids: Mutex::new(vec![None; names.len()]),
            names,
            shared: AtomicBool::new(false),
        }
    }

    /// Records node `i`'s run id; returns the other node sharing it, if any.
    fn record(&self, i: usize, run_id: &str) -> Option<usize> {
        let mut run_ids = lock(&self.run_ids);
        if let Some(slot) = run_ids.get_mut(i) {
            *slot = Some(run_id.to_owned());
        }
        let shared = (0..run_ids.len()).any(|j| twin(&run_ids, j).is_some());
        self.shared.store(shared, Ordering::Release);
        twin(&run_ids, i)
    }

    /// Another node whose latest run id is node `i`'s: its name and the run id.
    fn twin_of(&self, i: usize) -> Option<(&str, String)> {
        if !self.shared.load(Ordering::Acquire) {
            return None;
        }
        let run_ids = lock(&self.run_ids);
        let j = twin(&run_ids, i)?;
        Some((self.names.get(j)?.as_str(), run_ids.get(i)?.clone()?))
    }
}

/// The first node other than `i` whose run id is `i`'s. Pure.
pub(crate) fn twin(run_ids: &[Option<String>], i: usize) -> Option<usize> {
    let mine = run_ids.get(i)?.as_deref()?;
    run_ids
        .iter()
        .enumerate()
        .find(|&(j, r)| j != i && r.as_deref() == Some(mine))
        .map(|(j, _)| j)
}

/// Whether a restarted node's fencing counters still have to be restored from the others.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Repair {
    #[default]
    Clean,
    Needed,
    Running,
}

/// The largest ttl in use: how long a restarted node is held out.
#[derive(Debug)]
pub(crate) struct MaxTtl {
    fixed: Option<Duration>,
    seen_ms: AtomicU64,
}

impl MaxTtl {
    const FLOOR: Duration = Duration::from_secs(1);

    pub(crate) fn new(fixed: Option<Duration>) -> Self {
        MaxTtl {
            fixed,
            seen_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.seen_ms.fetch_max(ms, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> Duration {
        self.fixed.unwrap_or_else(|| {
            Duration::from_millis(self.seen_ms.load(Ordering::Relaxed)).max(Self::FLOOR)
        })
    }

    /// Whether the max ttl is configured (it never grows).
    fn is_fixed(&self) -> bool {
        self.fixed.is_some()
    }
}

/// How many commands a node connection's queue (redis-rs' channel to its driver task) holds.
/// Far above any backlog the node timeout allows, so a call never waits for room: a call handed
/// to its connection is always already queued. That makes it safe to keep a call's future
/// without polling it (the library parks the unanswered calls of finished rounds): a future
/// waiting for room would hold that room once granted, forever if unpolled, and starve the
/// connection (`t25_connections_stay_usable_after_heavy_concurrency`).
const QUEUE: usize = 1 << 16;

/// A round's gate: which of its calls have been handed to their connection, and whether the
/// round is *closed*. A round is closed at its verdict when its unanswered calls must not be
/// sent late (sent after a later extension or the release, an acquire or an extension could
/// leave the key with the wrong expiry, or re-set it): a call still waiting for its connection
/// then gives up instead of sending.
///
/// A call handed to its connection is queued there (see [`QUEUE`]) and runs before any call
/// queued after it; dropped before redis-rs writes it, it may be skipped, but a kept future,
/// even unpolled, keeps it. A call still waiting for its connection is sent only if polled.
///
/// A gate may also close by itself at a time on the deadline clock (an extension's gate
/// closes at the lock's deadline: nothing of it is sent after), and a call's `EVAL` fallback
/// after a `NOSCRIPT` reply is a new send: it passes the gate again.
#[derive(Debug, Clone)]
pub(crate) struct RoundGate(Arc<GateState>);

#[derive(Debug)]
struct GateState {
    closed: AtomicBool,
    /// When the round closes by itself, on the deadline clock.
    until: Option<Stamp>,
    handed: Box<[AtomicBool]>,
}

impl RoundGate {
    /// A gate for `n` calls; with `until`, it also closes by itself then (deadline clock).
    pub(crate) fn new(n: usize, until: Option<Stamp>) -> Self {
        RoundGate(Arc::new(GateState {
            closed: AtomicBool::new(false),
            until,
            handed: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }))
    }

    /// Closes the round: calls still waiting for a connection will not be sent.
    pub(crate) fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire) || self.0.until.is_some_and(|u| u <= clock::now())
    }

    /// Whether call `i` has been handed to its connection.
    pub(crate) fn handed(&self, i: usize) -> bool {
        self.0
            .handed
            .get(i)
            .is_some_and(|h| h.load(Ordering::Acquire))
    }

    /// Lets call `i` through (marking it handed), unless the round is closed. Checked right
    /// before the send, in the same poll.
    fn pass(&self, i: usize) -> bool {
        if self.is_closed() {
            return false;
        }
        if let Some(h) = self.0.handed.get(i) {
            h.store(true, Ordering::Release);
        }
        true
    }
}

/// Whether a call must skip a node that is held out (after a restart, as a second URL of one
/// server, for its eviction policy under the strict guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldOut {
    /// Acquire and extend: a held-out node counts as failed and is not asked.
    Respect,
    /// Release and status: always ask.
    Ignore,
}

/// One Redis master.
pub(crate) struct Node {
    name: String,
    client: redis::Client,
    connect_timeout: Duration,
    guard: RestartGuard,
    eviction_guard: EvictionGuard,
    max_ttl: Arc<MaxTtl>,
    /// This node's place among the client's nodes, and their shared run ids.
    index: usize,
    peers: Arc<Peers>,
    generation: AtomicU64,
    slot: Mutex<Slot>,
    health: Mutex<Health>,
    /// The reference instant of `started`.
    epoch: Instant,
    /// When the node started (nanoseconds after `epoch`, negative before it) if the restart
    /// guard holds it out until the max ttl has passed since then; [`NOT_STARTED`] otherwise.
    /// The hold-out is computed on every check against the max ttl in use *then*, so a max
    /// ttl that grows after the connect lengthens it.
    started: AtomicI64,
    /// Whether the last check found the node within its restart hold-out (for the log line
    /// when it ends).
    holding: AtomicBool,
    /// True while `health` holds a repair: lets every call skip the mutex in the common case.
    /// Set (under the mutex) before the connect that found a restart completes.
    suspect: AtomicBool,
    /// True while the strict eviction guard holds the node out.
    evicting: AtomicBool,
    /// Whether the last call (or connect) failed: failures are logged at warn on the way down
    /// and at info on the way back, not on every call.
    down: AtomicBool,
    /// How many times this client saw the node's run id change: a `SCAN` cursor from one
    /// incarnation means nothing to the next (see `repair.rs`).
    incarnation: AtomicU64,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Node {
    pub(crate) fn new(
        name: String,
        client: redis::Client,
        cfg: &RedlockBuilder,
        max_ttl: Arc<MaxTtl>,
        (index, peers): (usize, Arc<Peers>),
    ) -> Self {
        Node {
            name,
            client,
            connect_timeout: cfg.connect_timeout,
            guard: cfg.restart_guard,
            eviction_guard: cfg.eviction_guard,
            max_ttl,
            index,
            peers,
            generation: AtomicU64::new(0),
            slot: Mutex::new(Slot::Empty),
            health: Mutex::new(Health::default()),
            epoch: Instant::now(),
            started: AtomicI64::new(NOT_STARTED),
            holding: AtomicBool::new(false),
            suspect: AtomicBool::new(false),
            evicting: AtomicBool::new(false),
            down: AtomicBool::new(false),
            incarnation: AtomicU64::new(0),
        }
    }

    /// The node's address, password redacted.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Why this node counts toward no quorum now, if it does not: it reaches the same server
    /// as another node, its memory policy can evict lock keys (strict eviction guard), it is
    /// within the delayed-restart window, or its fencing counters are being restored after a
    /// restart.
    pub(crate) fn held_out(&self) -> Option<NodeError> {
        if let Some((other, run_id)) = self.peers.twin_of(self.index) {
            return Some(NodeError::SameServer {
                other: other.to_owned(),
                run_id,
            });
        }
        if self.evicting.load(Ordering::Acquire) {
            return Some(NodeError::Evicting(lock(&self.health).eviction.clone()));
        }
        if let Some(remaining) = self.restart_hold_out() {
            return Some(NodeError::HeldOut { remaining });
        }
        if !self.suspect.load(Ordering::Acquire) {
            return None;
        }
        let health = lock(&self.health);
        self.settle(&health);
        (health.repair != Repair::Clean).then_some(NodeError::Repairing)
    }

    /// How much longer the restart guard holds the node out: until the max ttl in use now has
    /// passed since the node's start.
    fn restart_hold_out(&self) -> Option<Duration> {
        let start = self.started.load(Ordering::Acquire);
        if start == NOT_STARTED {
            return None;
        }
        let now = nanos(self.epoch.elapsed());
        let until = start.saturating_add(nanos(self.max_ttl.get()));
        if now < until {
            if !self.holding.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    node = %self.name,
                    max_ttl = ?self.max_ttl.get(),
                    "node started less than the max ttl now in use ago; it counts toward no quorum until that has passed"
                );
            }
            return Some(Duration::from_nanos(
                u64::try_from(until - now).unwrap_or(0),
            ));
        }
        if self.holding.swap(false, Ordering::Relaxed) {
            tracing::info!(node = %self.name, "restarted node's hold-out is over");
        }
        // A max ttl that can still grow (the largest this client used) could make the node
        // young again: keep its start until a configured max ttl says it never will.
        if self.max_ttl.is_fixed() {
            let _ = self.started.compare_exchange(
                start,
                NOT_STARTED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        None
    }

    /// Clears the `suspect` hint once no repair holds the node out (called under the mutex).
    fn settle(&self, health: &Health) {
        if health.repair == Repair::Clean {
            self.suspect.store(false, Ordering::Release);
        }
    }

    /// The node's memory policy risk as last read on connect.
    pub(crate) fn eviction(&self) -> EvictionRisk {
        lock(&self.health).eviction.clone()
    }

    /// Another node reaching the same server, by name, if any.
    pub(crate) fn same_server(&self) -> Option<NodeError> {
        self.peers
            .twin_of(self.index)
            .map(|(other, run_id)| NodeError::SameServer {
                other: other.to_owned(),
                run_id,
            })
    }

    /// True while the node's fencing counters may be behind after a restart: it is then no
    /// source for restoring another node's counters.
    pub(crate) fn needs_repair(&self) -> bool {
        lock(&self.health).repair != Repair::Clean
    }

    /// Claims the restoring of this node's counters (once per needed repair): the repair's
    /// epoch, which [`finish_repair`](Self::finish_repair) must present.
    pub(crate) fn claim_repair(&self) -> Option<u64> {
        if !self.suspect.load(Ordering::Acquire) {
            return None;
        }
        let mut health = lock(&self.health);
        if health.repair == Repair::Needed {
            health.repair = Repair::Running;
            Some(health.repair_epoch)
        } else {
            None
        }
    }

    /// Whether the repair claimed with `epoch` is still the one to do (the node has not
    /// restarted again since).
    pub(crate) fn repair_current(&self, epoch: u64) -> bool {
        let health = lock(&self.health);
        health.repair == Repair::Running && health.repair_epoch == epoch
    }

    /// Ends the repair claimed with `epoch`: clean on success, to be claimed again on failure.
    /// Ignored when the node restarted again since the claim (that restart needs a repair of
    /// its own).
    pub(crate) fn finish_repair(&self, epoch: u64, ok: bool) {
        let mut health = lock(&self.health);
        if health.repair == Repair::Running && health.repair_epoch == epoch {
            health.repair = if ok { Repair::Clean } else { Repair::Needed };
        }
        self.settle(&health);
    }

    /// How many restarts (run id changes) of this node this client has seen.
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }

    /// One page of a `SCAN` for fencing counters, from `cursor`: the next cursor (0 when the
    /// scan is complete) and the page's counters, `(counter key, value)` (`SCAN ... COUNT
    /// count` then one `MGET`), bounded by `timeout`.
    pub(crate) async fn fence_counters_page(
        self: &Arc<Self>,
        cursor: u64,
        count: usize,
        timeout: Duration,
    ) -> Result<(u64, Vec<(Vec<u8>, u64)>), NodeError> {
        let read = async {
            let (mut conn, generation) = self.connection().await?;
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(scripts::FENCE_PATTERN)
                .arg("COUNT")
                .arg(count)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.call_error(e, generation))?;
            let mut counters = Vec::with_capacity(keys.len());
            if !keys.is_empty() {
                let values: Vec<Option<String>> = redis::cmd("MGET")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?;
                counters.extend(
                    keys.into_iter()
                        .zip(values)
                        .filter_map(|(k, v)| Some((k, v?.parse().ok()?))),
                );
            }
            Ok((next, counters))
        };
        tokio::time::timeout(timeout, read)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }

    /// Raises this node's counters to at least the given values, in one pipeline of `EVALSHA`s
    /// bounded by `timeout`. A `NOSCRIPT` reply (the node's script cache was flushed) loads the
    /// script and sends the pipeline again: raising is idempotent.
    pub(crate) async fn raise_counters(
        self: &Arc<Self>,
        counters: &[(Vec<u8>, u64)],
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (key, value) in counters {
            pipe.cmd("EVALSHA")
                .arg(scripts::RAISE_COUNTER.script().get_hash())
                .arg(1)
                .arg(key)
                .arg(*value);
        }
        let write = async {
            let (mut conn, generation) = self.connection().await?;
            let mut loaded = false;
            loop {
                let replies: Vec<Value> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?;
                let error = replies.into_iter().find_map(|v| match v {
                    Value::ServerError(e) => Some(e),
                    _ => None,
                });
                match error {
                    None => return Ok(()),
                    Some(e) if !loaded && e.kind() == Some(redis::ServerErrorKind::NoScript) => {
                        tracing::debug!(node = %self.name, "NOSCRIPT while raising counters; loading the script");
                        redis::cmd("SCRIPT")
                            .arg("LOAD")
                            .arg(scripts::RAISE_COUNTER.code())
                            .query_async::<String>(&mut conn)
                            .await
                            .map_err(|e| self.call_error(e, generation))?;
                        loaded = true;
                    }
                    Some(e) => return Err(NodeError::from_redis(e.into())),
                }
            }
        };
        tokio::time::timeout(timeout, write)
            .await
            .unwrap_or(Err(NodeError::Timeout(timeout)))
    }

    /// The connect timeout, which also bounds each step of a repair.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Runs one script call, bounded by `deadline`.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future may or may not leave the command sent (redis-rs skips a queued
    /// command whose caller is gone); if sent, later calls on this node travel after it on the
    /// same connection.
    pub(crate) async fn run(
        self: Arc<Self>,
        call: Arc<ScriptCall>,
        deadline: Instant,
        hold_out: HoldOut,
        op: &'static str,
    ) -> Result<Value, NodeError> {
        let start = Instant::now();
        match tokio::time::timeout_at(deadline, Arc::clone(&self).call(call, hold_out, op, None))
            .await
        {
            Ok(r) => r,
            Err(_) => {
                let e = NodeError::Timeout(deadline.saturating_duration_since(start));
                self.timed_out(op, &e);
                Err(e)
            }
        }
    }

    /// Runs one script call with no deadline of its own: a round bounds all its calls with one
    /// timer. Cancellation as for [`run`](Self::run).
    pub(crate) async fn call(
        self: Arc<Self>,
        call: Arc<ScriptCall>,
        hold_out: HoldOut,
        op: &'static str,
        gate: Option<(RoundGate, usize)>,
    ) -> Result<Value, NodeError> {
        #[cfg(feature = "metrics")]
        let start = Instant::now();
        match self.run_now(&call, hold_out, gate).await {
            Ok(Some(value)) => {
                #[cfg(feature = "metrics")]
                metrics::node_latency(&self.name, op, start.elapsed());
                self.mark_up();
                Ok(value)
            }
            // Given up unsent because its round was closed: nobody reads this, nothing to
            // record.
            Ok(None) => Err(NodeError::Timeout(Duration::ZERO)),
            Err(e) => {
                self.failed(op, &e);
                Err(e)
            }
        }
    }

    /// Records a call that its round's deadline cut short.
    pub(crate) fn timed_out(&self, op: &'static str, e: &NodeError) {
        self.failed(op, e);
    }

    /// Records a failed call: metrics, a debug event, and a warning when the node goes down.
    /// A node held out (after a restart, as a second URL of one server, for its eviction
    /// policy) is not down: its own warning says why.
    fn failed(&self, op: &'static str, e: &NodeError) {
        metrics::node_error(&self.name, op, e.label());
        tracing::debug!(node = %self.name, op, error = %e, "node call failed");
        if matches!(
            e,
            NodeError::HeldOut { .. }
                | NodeError::Repairing
                | NodeError::SameServer { .. }
                | NodeError::Evicting(_)
        ) {
            return;
        }
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(node = %self.name, op, error = %e, "node unreachable; it counts as failed in every round until it answers again");
        }
    }

    fn mark_up(&self) {
        if self.down.load(Ordering::Relaxed) && self.down.swap(false, Ordering::Relaxed) {
            tracing::info!(node = %self.name, "node answers again");
        }
    }

    /// `Ok(None)`: not sent, because the round was closed while this call waited to connect.
    async fn run_now(
        self: &Arc<Self>,
        call: &ScriptCall,
        hold_out: HoldOut,
        gate: Option<(RoundGate, usize)>,
    ) -> Result<Option<Value>, NodeError> {
        let (mut conn, generation) = self.connection().await?;
        // Checked after connecting: a (re)connect is what reads the node's run id and uptime.
        if hold_out == HoldOut::Respect
            && let Some(reason) = self.held_out()
        {
            return Err(reason);
        }
        // The first poll of the send below hands the command to the connection's queue. Its
        // driver writes it to the socket later, and skips it if this future is gone by then.
        if let Some((gate, i)) = &gate
            && !gate.pass(*i)
        {
            return Ok(None);
        }
        // A server error comes back as a value; `extract_error` turns it into an error.
        let reply = match conn
            .send_packed_command(call.evalsha())
            .await
            .and_then(Value::extract_error)
        {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // The fallback is a new send, possibly long after the round's verdict (a parked
                // call is polled by `flush`): not once the round is closed, where it could land
                // after a later extension or the release.
                if let Some((gate, i)) = &gate
                    && !gate.pass(*i)
                {
                    return Ok(None);
                }
                match call.eval() {
                    Some(eval) => conn
                        .send_packed_command(&eval)
                        .await
                        .and_then(Value::extract_error),
                    None => Err(e),
                }
            }
            other => other,
        };
        reply.map(Some).map_err(|e| self.call_error(e, generation))
    }

    /// Classifies a call's error; a broken connection is dropped so the next call reconnects.
    fn call_error(&self, e: redis::RedisError, generation: u64) -> NodeError {
        if e.is_unrecoverable_error() || e.is_connection_dropped() || e.is_io_error() {
            self.invalidate(generation);
        }
        NodeError::from_redis(e)
    }

    /// The live connection, or the one being established (started if none is).
    async fn connection(self: &Arc<Self>) -> Connected {
        let pending = {
            let mut slot = lock(&self.slot);
            match &*slot {
                Slot::Ready(conn, generation) => return Ok((conn.clone(), *generation)),
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

    fn spawn_connect(self: &Arc<Self>) -> Shared<BoxFuture<'static, Connected>> {
        let node = Arc::clone(self);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(node.connect_timeout, node.connect()).await {
                Ok(Ok(conn)) => Ok((conn, generation)),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(NodeError::Timeout(node.connect_timeout)),
            };
            let mut slot = lock(&node.slot);
            *slot = match &result {
                Ok((conn, generation)) => Slot::Ready(conn.clone(), *generation),
                Err(e) => {
                    tracing::debug!(node = %node.name, error = %e, "connect failed");
                    Slot::Failed(e.clone(), Instant::now() + RECONNECT_BACKOFF)
                }
            };
            result
        });
        let node = Arc::clone(self);
        async move {
            task.await.unwrap_or_else(|e| {
                // The task panicked or its runtime shut down before it could fill the slot: empty
                // it, so the next call connects afresh instead of reusing this failure forever.
                let mut slot = lock(&node.slot);
                if matches!(&*slot, Slot::Connecting(_))
                    && node.generation.load(Ordering::Relaxed) == generation
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

    /// Opens a new connection to this node, bounded by the connect timeout: the one way the
    /// crate connects to a node, for the lock's own connection and for the side connections of
    /// elections and run-once jobs. `client` carries what the builder configured (certificates
    /// for `rediss://`, TCP keepalive and user timeout; see `RedlockBuilder::open_client`), and
    /// every connection gets the same [`AsyncConnectionConfig`].
    pub(crate) async fn open_connection(&self) -> Result<MultiplexedConnection, NodeError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(QUEUE);
        tokio::time::timeout(
            self.connect_timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| NodeError::Timeout(self.connect_timeout))?
        .map_err(|e| self.connect_error(e))
    }

    /// Opens a new pub/sub connection to this node, with the same client (certificates, TCP
    /// settings) as [`open_connection`](Self::open_connection), bounded by the connect timeout.
    pub(crate) async fn open_pubsub(&self) -> Result<redis::aio::PubSub, NodeError> {
        tokio::time::timeout(self.connect_timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| NodeError::Timeout(self.connect_timeout))?
            .map_err(|e| self.connect_error(e))
    }

    /// Connects, loads every script and reads `run_id` / `uptime_in_seconds` in one round trip.
    async fn connect(&self) -> Result<MultiplexedConnection, NodeError> {
        let mut conn = self.open_connection().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("INFO").arg("server");
        pipe.cmd("INFO").arg("persistence");
        for lua in scripts::all() {
            pipe.cmd("SCRIPT").arg("LOAD").arg(lua.code()).ignore();
        }
        let (info, persistence): (String, String) = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.connect_error(e))?;
        let (run_id, uptime) = parse_info(&info)
            .ok_or_else(|| NodeError::BadReply("INFO server lacks run_id or uptime".to_owned()))?;
        let aof = persistence.lines().any(|l| l.trim() == "aof_enabled:1");
        let config = read_config(&mut conn).await;
        let fsync_always = aof && config.appendfsync.as_deref() == Some("always");
        let marker = if fsync_always {
            durability_marker(&mut conn, &run_id).await
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
        self.observe_eviction(EvictionRisk::classify(
            config.maxmemory.as_deref(),
            config.policy.as_deref(),
        ));
        self.observe_start(run_id, uptime, fsync_always, marker);
        tracing::debug!(node = %self.name, "connected");
        Ok(conn)
    }

    /// A connect-time error; a timeout there is the connect timeout.
    fn connect_error(&self, e: redis::RedisError) -> NodeError {
        if e.is_timeout() {
            NodeError::Timeout(self.connect_timeout)
        } else {
            NodeError::from_redis(e)
        }
    }

    /// Records the node's memory policy: a warning when it turns risky (once per node and
    /// policy), and the strict eviction guard's hold-out.
    fn observe_eviction(&self, risk: EvictionRisk) {
        let mut health = lock(&self.health);
        if risk.is_risky() && health.eviction != risk {
            tracing::warn!(
                node = %self.name,
                risk = %risk,
                guard = ?self.eviction_guard,
                "node may evict lock keys under memory pressure, without any restart: set \
                 maxmemory-policy noeviction (or maxmemory 0) on lock nodes"
            );
        } else if risk == EvictionRisk::Unknown && health.eviction != risk {
            tracing::debug!(node = %self.name, "eviction policy unknown (CONFIG GET unavailable)");
        }
        self.evicting.store(
            self.eviction_guard == EvictionGuard::Strict && risk.is_risky(),
            Ordering::Release,
        );
        health.eviction = risk;
    }

    /// The restart guard: compares the run id with the last one seen. A node whose data
    /// demonstrably survived its start ([`data_survived`]: `appendfsync always` and a durability
    /// marker from an earlier run) is neither held out nor repaired.
    fn observe_start(
        &self,
        run_id: String,
        uptime: Duration,
        fsync_always: bool,
        marker: Option<String>,
    ) {
        let mut health = lock(&self.health);
        let meeting = match &health.run_id {
            None => Meeting::First,
            Some(previous) if *previous == run_id => Meeting::Same,
            Some(_) => Meeting::Restarted,
        };
        if meeting == Meeting::Restarted {
            self.incarnation.fetch_add(1, Ordering::AcqRel);
        }
        let durable_before = (meeting == Meeting::Restarted).then_some(health.durable);
        let survived = data_survived(fsync_always, marker.as_deref(), &run_id, durable_before);
        let (hold, repair) = restart_verdict(self.guard, meeting, survived);
        if hold {
            // Counted from now with the youngest age the uptime allows: the latest it can have
            // started.
            let age = youngest_age(uptime);
            let start = nanos(self.epoch.elapsed()).saturating_sub(nanos(age));
            self.started.store(start, Ordering::Release);
            if let Some(remaining) = hold_out_for(uptime, self.max_ttl.get()) {
                self.holding.store(true, Ordering::Relaxed);
                tracing::warn!(
                    node = %self.name,
                    uptime_s = uptime.as_secs(),
                    held_out_for = ?remaining,
                    until = %humantime::format_rfc3339_seconds(std::time::SystemTime::now() + remaining),
                    "node (re)started less than the max ttl ago and may have lost lock keys; \
                     it counts toward no quorum until the max ttl has passed since its start"
                );
            }
        }
        // Seen restarting without proof its data survived: its fencing counters (which never
        // expire) may be gone too; restore them from the other nodes before it counts again.
        if repair {
            health.repair = Repair::Needed;
            health.repair_epoch += 1;
            self.suspect.store(true, Ordering::Release);
        }
        if meeting == Meeting::Restarted && survived {
            tracing::info!(
                node = %self.name,
                "node restarted with its data (appendfsync always, durability marker intact); it counts at once"
            );
        }
        health.durable = fsync_always && marker.is_some();
        health.run_id = Some(run_id);
    }

    fn invalidate(&self, generation: u64) {
        let mut slot = lock(&self.slot);
        if matches!(&*slot, Slot::Ready(_, g) if *g == generation) {
            *slot = Slot::Empty;
            tracing::debug!(node = %self.name, "connection broken; will reconnect");
        }
    }
}

/// The settings read from a node with `CONFIG GET`; `None` where unreadable.
#[derive(Debug, Default)]
struct NodeConfig {
    appendfsync: Option<String>,
    maxmemory: Option<String>,
    policy: Option<String>,
}

/// Reads `appendfsync`, `maxmemory` and `maxmemory-policy` in one round trip. Any error
/// (CONFIG renamed or forbidden, as managed services do) leaves them all unknown: the node is
/// then treated as one that may lose its last writes in a restart, and its eviction risk is
/// reported as unknown; the connect goes on.
async fn read_config(conn: &mut MultiplexedConnection) -> NodeConfig {
    let mut pipe = redis::pipe();
    for name in ["appendfsync", "maxmemory", "maxmemory-policy"] {
        pipe.cmd("CONFIG").arg("GET").arg(name);
    }
    let reply: redis::RedisResult<(Vec<String>, Vec<String>, Vec<String>)> =
        pipe.query_async(conn).await;
    let value = |pair: Vec<String>| match <[String; 2]>::try_from(pair) {
        Ok([_, value]) => Some(value),
        Err(_) => None,
    };
    match reply {
        Ok((fsync, maxmemory, policy)) => NodeConfig {
            appendfsync: value(fsync),
            maxmemory: value(maxmemory),
            policy: value(policy),
        },
        Err(_) => NodeConfig::default(),
    }
}

/// Writes the node's durability marker if it has none (`SET NX`, the current run id: acknowledged
/// only once fsynced under `appendfsync always`) and reads it back. `None` on any error (a node
/// out of memory under `noeviction`, say): the node's data is then not trusted to survive.
async fn durability_marker(conn: &mut MultiplexedConnection, run_id: &str) -> Option<String> {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(MARKER_KEY)
        .arg(run_id)
        .arg("NX")
        .ignore()
        .cmd("GET")
        .arg(MARKER_KEY);
    let reply: redis::RedisResult<(Option<String>,)> = pipe.query_async(conn).await;
    reply.ok().and_then(|(marker,)| marker)
}

/// The youngest a node that reports `uptime` can be: `uptime − 1 s`.
///
/// `uptime_in_seconds` is the difference of two whole-second wall-clock readings (now and the
/// start), so it can read 1 when the node started a few milliseconds ago (started at x.99 s,
/// asked at (x+1).01 s). The node's age is only known to be above `uptime - 1 s`: that is what
/// the hold-out counts from. (Taking `uptime` at face value let a restarted node count up to a
/// second early: with a 1 s ttl, at once, and the chaos suite saw the overlap.)
pub(crate) fn youngest_age(uptime: Duration) -> Duration {
    uptime.saturating_sub(Duration::from_secs(1))
}

/// How much longer a node that reports `uptime` must be held out so that `max_ttl` has passed
/// since its start ([`youngest_age`]), or `None` if it already has.
pub(crate) fn hold_out_for(uptime: Duration, max_ttl: Duration) -> Option<Duration> {
    max_ttl
        .checked_sub(youngest_age(uptime))
        .filter(|d| !d.is_zero())
}

fn parse_info(info: &str) -> Option<(String, Duration)> {
    let mut run_id = None;
    let mut uptime = None;
    for line in info.lines() {
        if let Some(v) = line.strip_prefix("run_id:") {
            run_id = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("uptime_in_seconds:") {
            uptime = v.trim().parse().ok().map(Duration::from_secs);
        }
    }
    Some((run_id?, uptime?))
}

/// A node's display name from its parsed address: scheme, user, host and port (or socket path)
/// and db, never the password.
pub(crate) fn node_name(info: &redis::ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let user = settings
        .username()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = settings.db();
    match info.addr() {
        redis::ConnectionAddr::Unix(path) if db != 0 => {
            format!("unix://{}?db={db}", path.display())
        }
        redis::ConnectionAddr::Unix(path) => format!("unix://{}", path.display()),
        addr => {
            let scheme = if matches!(addr, redis::ConnectionAddr::TcpTls { .. }) {
                "rediss"
            } else {
                "redis"
            };
            let db = if db != 0 {
                format!("/{db}")
            } else {
                String::new()
            };
            format!("{scheme}://{user}{addr}{db}")
        }
    }
}

/// A URL with its password replaced by `***` (in the authority and in `pass=` / `password=`
/// query parameters), for URLs that could not be parsed.
pub(crate) fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = redact_authority(base);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
                _ => p.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

fn redact_authority(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split_once(':').map_or("", |(u, _)| u);
    format!("{}{}:***@{}", &url[..scheme_end + 3], user, &rest[at + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://127.0.0.1:7001"), "redis://127.0.0.1:7001");
        assert_eq!(
            redact("redis://user:secret@h:1/2"),
            "redis://user:***@h:1/2"
        );
        assert_eq!(redact("rediss://:secret@h:1"), "rediss://:***@h:1");
        assert_eq!(redact("unix:///tmp/r.sock"), "unix:///tmp/r.sock");
        assert_eq!(
            redact("unix:///tmp/r.sock?db=2&pass=secret"),
            "unix:///tmp/r.sock?db=2&pass=***"
        );
    }

    #[test]
    fn node_names_never_carry_the_password() {
        for (url, name) in [
            ("redis://127.0.0.1:7001", "redis://127.0.0.1:7001"),
            ("redis://u:pw@h:1/3", "redis://u@h:1/3"),
            ("redis://:pw@h:1", "redis://h:1"),
            ("unix:///tmp/r.sock?pass=pw&db=2", "unix:///tmp/r.sock?db=2"),
        ] {
            let client = redis::Client::open(url).unwrap();
            assert_eq!(node_name(client.get_connection_info()), name, "{url}");
        }
    }

    #[test]
    fn hold_out_counts_from_the_youngest_age_the_uptime_allows() {
        let s = Duration::from_secs;
        // Uptime 1 may mean a few ms old: held out for the whole max ttl.
        assert_eq!(hold_out_for(s(0), s(1)), Some(s(1)));
        assert_eq!(hold_out_for(s(1), s(1)), Some(s(1)));
        assert_eq!(hold_out_for(s(2), s(1)), None);
        assert_eq!(hold_out_for(s(10), s(30)), Some(s(21)));
        assert_eq!(hold_out_for(s(31), s(30)), None);
        assert_eq!(hold_out_for(s(40), s(30)), None);
    }

    #[test]
    fn info_parsing_finds_run_id_and_uptime() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        assert_eq!(
            parse_info(info),
            Some(("abc123".to_owned(), Duration::from_secs(42)))
        );
        assert_eq!(parse_info("garbage"), None);
    }

    #[test]
    fn data_survives_only_with_fsync_always_and_a_marker_from_an_earlier_run() {
        // The marker was written by an earlier run and is still there.
        assert!(data_survived(true, Some("r1"), "r2", None));
        assert!(data_survived(true, Some("r1"), "r2", Some(true)));
        // Written by this run (perhaps by another client after an empty restart): no proof.
        assert!(!data_survived(true, Some("r2"), "r2", None));
        // Gone: the keyspace did not survive.
        assert!(!data_survived(true, None, "r2", Some(true)));
        // Not fsynced on every write now, or not durable in the run this client saw before.
        assert!(!data_survived(false, Some("r1"), "r2", None));
        assert!(!data_survived(true, Some("r1"), "r2", Some(false)));
    }

    #[test]
    fn restart_verdicts() {
        use Meeting::{First, Same};
        use RestartGuard::{Off, Strict};
        let seen = Meeting::Restarted;
        let default = RestartGuard::Restarted;
        for meeting in [First, Same, seen] {
            assert_eq!(restart_verdict(Off, meeting, false), (false, false));
            for guard in [default, Strict] {
                assert_eq!(restart_verdict(guard, meeting, true), (false, false));
            }
        }
        assert_eq!(restart_verdict(default, seen, false), (true, true));
        assert_eq!(restart_verdict(Strict, seen, false), (true, true));
        assert_eq!(restart_verdict(Strict, First, false), (true, false));
        assert_eq!(restart_verdict(default, First, false), (false, false));
        assert_eq!(restart_verdict(Strict, Same, false), (false, false));
    }

    #[test]
    fn twins_share_a_run_id() {
        let ids = |v: &[Option<&str>]| -> Vec<Option<String>> {
            v.iter().map(|r| r.map(str::to_owned)).collect()
        };
        let run_ids = ids(&[Some("a"), Some("b"), Some("a"), None, None]);
        assert_eq!(twin(&run_ids, 0), Some(2));
        assert_eq!(twin(&run_ids, 2), Some(0));
        assert_eq!(twin(&run_ids, 1), None);
        assert_eq!(twin(&run_ids, 3), None, "unknown run ids are nobody's twin");
        assert_eq!(twin(&run_ids, 9), None);

        let peers = Peers::new(["x", "y", "z"].map(str::to_owned));
        assert_eq!(peers.record(0, "r"), None);
        assert_eq!(peers.twin_of(0), None);
        assert_eq!(peers.record(1, "r"), Some(0));
        assert_eq!(peers.twin_of(0), Some(("y", "r".to_owned())));
        assert_eq!(peers.twin_of(1), Some(("x", "r".to_owned())));
        // One of them now reaches another server: the duplication ends for both.
        assert_eq!(peers.record(1, "s"), None);
        assert_eq!(peers.twin_of(0), None);
        assert_eq!(peers.twin_of(1), None);
    }

    #[test]
    fn eviction_risk_from_the_memory_policy() {
        let c = EvictionRisk::classify;
        assert_eq!(c(Some("0"), Some("volatile-lru")), EvictionRisk::None);
        assert_eq!(c(Some("4194304"), Some("noeviction")), EvictionRisk::None);
        assert_eq!(
            c(Some("4194304"), Some("volatile-ttl")),
            EvictionRisk::LockKeys {
                policy: "volatile-ttl".to_owned()
            }
        );
        assert_eq!(
            c(Some("4194304"), Some("allkeys-lru")),
            EvictionRisk::LockKeysAndCounters {
                policy: "allkeys-lru".to_owned()
            }
        );
        assert!(c(Some("1"), Some("some-future-policy")).is_risky());
        assert_eq!(c(None, Some("allkeys-lru")), EvictionRisk::Unknown);
        assert_eq!(c(Some("lots"), Some("allkeys-lru")), EvictionRisk::Unknown);
        assert_eq!(c(Some("1"), None), EvictionRisk::Unknown);
    }

    #[test]
    fn max_ttl_tracks_the_largest_seen_with_a_floor() {
        let m = MaxTtl::new(None);
        assert_eq!(m.get(), Duration::from_secs(1));
        m.observe(Duration::from_secs(30));
        m.observe(Duration::from_secs(5));
        assert_eq!(m.get(), Duration::from_secs(30));
        assert_eq!(
            MaxTtl::new(Some(Duration::from_secs(7))).get(),
            Duration::from_secs(7)
        );
    }
}
