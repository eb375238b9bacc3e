//! One Redis master: a lazily established, self-healing multiplexed connection, per-call
//! deadlines, error classification, and the restart guard's view of the node.
//!
//! Connecting runs in a spawned task bounded by the connect timeout, so a caller whose per-node
//! deadline is short can give up waiting without cancelling the connect for the next caller.
//! A connection is replaced only when it breaks (not on a timeout): while it lives, every call
//! to a node travels in order on it, so a release always reaches the node after the acquire it
//! undoes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::time::Instant;

use crate::config::{RedlockBuilder, RestartGuard};
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
    held_out_until: Option<Instant>,
    repair: Repair,
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
#[derive(Debug, Clone)]
pub(crate) struct RoundGate(Arc<GateState>);

#[derive(Debug)]
struct GateState {
    closed: AtomicBool,
    handed: Box<[AtomicBool]>,
}

impl RoundGate {
    pub(crate) fn new(n: usize) -> Self {
        RoundGate(Arc::new(GateState {
            closed: AtomicBool::new(false),
            handed: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }))
    }

    /// Closes the round: calls still waiting for a connection will not be sent.
    pub(crate) fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
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

/// Whether a call must skip a node that is held out after a restart.
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
    max_ttl: Arc<MaxTtl>,
    generation: AtomicU64,
    slot: Mutex<Slot>,
    health: Mutex<Health>,
    /// True while `health` holds a hold-out or a repair: lets every call skip the mutex in the
    /// common case. Set (under the mutex) before the connect that found a restart completes.
    suspect: AtomicBool,
    /// Whether the last call (or connect) failed: failures are logged at warn on the way down
    /// and at info on the way back, not on every call.
    down: AtomicBool,
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
    ) -> Self {
        Node {
            name,
            client,
            connect_timeout: cfg.connect_timeout,
            guard: cfg.restart_guard,
            max_ttl,
            generation: AtomicU64::new(0),
            slot: Mutex::new(Slot::Empty),
            health: Mutex::new(Health::default()),
            suspect: AtomicBool::new(false),
            down: AtomicBool::new(false),
        }
    }

    /// The node's address, password redacted.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Why this node counts toward no quorum now, if it does not: within the delayed-restart
    /// window, or while its fencing counters are being restored after a restart.
    pub(crate) fn held_out(&self) -> Option<NodeError> {
        if !self.suspect.load(Ordering::Acquire) {
            return None;
        }
        let mut health = lock(&self.health);
        if let Some(until) = health.held_out_until {
            let now = Instant::now();
            if now < until {
                return Some(NodeError::HeldOut {
                    remaining: until - now,
                });
            }
            health.held_out_until = None;
            if health.repair == Repair::Clean {
                tracing::info!(node = %self.name, "restarted node counts toward quorums again");
            }
        }
        self.settle(&health);
        (health.repair != Repair::Clean).then_some(NodeError::Repairing)
    }

    /// Clears the `suspect` hint once nothing holds the node out (called under the mutex).
    fn settle(&self, health: &Health) {
        if health.held_out_until.is_none() && health.repair == Repair::Clean {
            self.suspect.store(false, Ordering::Release);
        }
    }

    /// True while the node's fencing counters may be behind after a restart: it is then no
    /// source for restoring another node's counters.
    pub(crate) fn needs_repair(&self) -> bool {
        lock(&self.health).repair != Repair::Clean
    }

    /// Claims the restoring of this node's counters (true once per needed repair).
    pub(crate) fn claim_repair(&self) -> bool {
        if !self.suspect.load(Ordering::Acquire) {
            return false;
        }
        let mut health = lock(&self.health);
        if health.repair == Repair::Needed {
            health.repair = Repair::Running;
            true
        } else {
            false
        }
    }

    /// Ends a repair: clean on success, to be claimed again on failure.
    pub(crate) fn finish_repair(&self, ok: bool) {
        let mut health = lock(&self.health);
        if health.repair == Repair::Running {
            health.repair = if ok { Repair::Clean } else { Repair::Needed };
        }
        self.settle(&health);
    }

    /// Every fencing counter on this node: `(counter key, value)`, read with `SCAN` + `MGET`.
    pub(crate) async fn fence_counters(
        self: &Arc<Self>,
        deadline: Instant,
    ) -> Result<Vec<(Vec<u8>, u64)>, NodeError> {
        let read = async {
            let (mut conn, generation) = self.connection().await?;
            let mut counters = Vec::new();
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(scripts::FENCE_PATTERN)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?;
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
                if next == 0 {
                    return Ok(counters);
                }
                cursor = next;
            }
        };
        tokio::time::timeout_at(deadline, read)
            .await
            .unwrap_or_else(|_| Err(NodeError::Timeout(self.connect_timeout)))
    }

    /// Raises this node's counters to at least the given values.
    pub(crate) async fn raise_counters(
        self: &Arc<Self>,
        counters: &[(Vec<u8>, u64)],
        deadline: Instant,
    ) -> Result<(), NodeError> {
        let write = async {
            let (mut conn, generation) = self.connection().await?;
            for chunk in counters.chunks(1000) {
                let mut pipe = redis::pipe();
                for (key, value) in chunk {
                    pipe.cmd("EVALSHA")
                        .arg(scripts::RAISE_COUNTER.script().get_hash())
                        .arg(1)
                        .arg(key)
                        .arg(*value)
                        .ignore();
                }
                pipe.query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| self.call_error(e, generation))?;
            }
            Ok(())
        };
        tokio::time::timeout_at(deadline, write)
            .await
            .unwrap_or_else(|_| Err(NodeError::Timeout(self.connect_timeout)))
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
    /// A node held out after a restart is not down: its own warning says why and until when.
    fn failed(&self, op: &'static str, e: &NodeError) {
        metrics::node_error(&self.name, op, e.label());
        tracing::debug!(node = %self.name, op, error = %e, "node call failed");
        if matches!(e, NodeError::HeldOut { .. } | NodeError::Repairing) {
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

    /// Connects, loads every script and reads `run_id` / `uptime_in_seconds` in one round trip.
    async fn connect(&self) -> Result<MultiplexedConnection, NodeError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(QUEUE);
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| self.connect_error(e))?;
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
        let durable = aof && fsync_always(&mut conn).await;
        self.observe_start(run_id, uptime, durable);
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

    /// The restart guard: compares the run id with the last one seen. A `durable` node (an
    /// append-only file with `appendfsync always`) lost nothing in a restart: it is neither held
    /// out nor repaired.
    fn observe_start(&self, run_id: String, uptime: Duration, durable: bool) {
        let mut health = lock(&self.health);
        let restarted = health
            .run_id
            .as_ref()
            .is_some_and(|previous| *previous != run_id);
        let max_ttl = self.max_ttl.get();
        let hold_out = hold_out_for(uptime, max_ttl);
        let young = hold_out.is_some();
        let suspect =
            restarted || (health.run_id.is_none() && self.guard == RestartGuard::Strict && young);
        if self.guard != RestartGuard::Off && suspect && !durable {
            if let Some(remaining) = hold_out {
                let now = Instant::now();
                // Bounded by MAX_TTL (config) and the ttl check, so this cannot overflow; a
                // saturated deadline would only hold the node out longer.
                let until = now.checked_add(remaining).unwrap_or(now + max_ttl);
                health.held_out_until = Some(until);
                self.suspect.store(true, Ordering::Release);
                tracing::warn!(
                    node = %self.name,
                    uptime_s = uptime.as_secs(),
                    held_out_for = ?remaining,
                    until = %humantime::format_rfc3339_seconds(std::time::SystemTime::now() + remaining),
                    "node (re)started less than the max ttl ago and may have lost lock keys; \
                     it counts toward no quorum until the max ttl has passed since its start"
                );
            }
            // Seen restarting: its fencing counters (which never expire) may be gone too;
            // restore them from the other nodes before it counts again. (A node merely young on
            // first contact, under the strict guard, may not have lost anything: time only.)
            if restarted {
                health.repair = Repair::Needed;
                self.suspect.store(true, Ordering::Release);
            }
        }
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

/// Whether the node fsyncs its append-only file on every write (`CONFIG GET appendfsync`).
/// Any error (CONFIG renamed or forbidden, as managed services do) answers no: the node is then
/// treated as one that may lose its last writes in a restart.
async fn fsync_always(conn: &mut MultiplexedConnection) -> bool {
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        .query_async(conn)
        .await;
    matches!(reply.as_deref(), Ok([_, policy]) if policy == "always")
}

/// How much longer a node that reports `uptime` must be held out so that `max_ttl` has passed
/// since its start, or `None` if it already has.
///
/// `uptime_in_seconds` is the difference of two whole-second wall-clock readings (now and the
/// start), so it can read 1 when the node started a few milliseconds ago (started at x.99 s,
/// asked at (x+1).01 s). The node's age is only known to be above `uptime - 1 s`: that is what
/// the hold-out counts from. (Taking `uptime` at face value let a restarted node count up to a
/// second early: with a 1 s ttl, at once, and the chaos suite saw the overlap.)
pub(crate) fn hold_out_for(uptime: Duration, max_ttl: Duration) -> Option<Duration> {
    let age = uptime.saturating_sub(Duration::from_secs(1));
    max_ttl.checked_sub(age).filter(|d| !d.is_zero())
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
