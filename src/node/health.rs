//! What the node layer knows of one server's health, and acts on: the restart guard (hold-out
//! after a restart, repair needed), one server reached by two URLs ([`Peers`]), the eviction
//! guard, the max ttl in use, and what a connect reads to decide them (`INFO`, `CONFIG GET`,
//! the durability marker). The decisions themselves are pure, in [`crate::core::health`].

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::{Node, NodeSettings};
use crate::core::health::{
    EvictionGuard, Meeting, RestartGuard, data_survived, hold_out_for, restart_verdict, twin,
    youngest_age,
};
use crate::core::lock;
use crate::error::NodeError;
use crate::eviction::EvictionRisk;

#[derive(Default)]
pub(crate) struct Health {
    /// The identity (run id and replication id) the last connect met.
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
    /// The settings the last connect could not read (`CONFIG GET` refused or renamed).
    unchecked: Vec<&'static str>,
}

/// What the restart and eviction guards know of one node, owned by this file.
pub(super) struct NodeHealth {
    guard: RestartGuard,
    eviction_guard: EvictionGuard,
    max_ttl: Arc<MaxTtl>,
    state: Mutex<Health>,
    /// The reference instant of `started`.
    epoch: Instant,
    /// When the node started (nanoseconds after `epoch`, negative before it) if the restart
    /// guard holds it out until the max ttl has passed since then; [`NOT_STARTED`] otherwise.
    /// The hold-out is computed on every check against the max ttl in use *then*, so a max
    /// ttl that grows after the connect lengthens it.
    started: AtomicI64,
    /// When this client last met the node after a data loss it could not rule out (a restart
    /// or failover without proof its data survived: the ones it repairs), in nanoseconds after
    /// `epoch`; [`NOT_STARTED`] if never. Run-once markers read from the node prove nothing
    /// about absence for their expiry after that (`run_once`).
    lost_data: AtomicI64,
    /// Whether the last check found the node within its restart hold-out (for the log line
    /// when it ends).
    holding: AtomicBool,
    /// True while `state` holds a repair: lets every call skip the mutex in the common case.
    /// Set (under the mutex) before the connect that found a restart completes.
    suspect: AtomicBool,
    /// True while the strict eviction guard holds the node out.
    evicting: AtomicBool,
    /// How many times this client saw the node's run id change: a `SCAN` cursor from one
    /// incarnation means nothing to the next (see `repair.rs`).
    incarnation: AtomicU64,
    /// The key of the restart guard's durability marker.
    durability_marker: String,
}

impl NodeHealth {
    pub(super) fn new(settings: NodeSettings, max_ttl: Arc<MaxTtl>) -> Self {
        NodeHealth {
            guard: settings.restart_guard,
            eviction_guard: settings.eviction_guard,
            max_ttl,
            state: Mutex::new(Health::default()),
            epoch: Instant::now(),
            started: AtomicI64::new(NOT_STARTED),
            lost_data: AtomicI64::new(NOT_STARTED),
            holding: AtomicBool::new(false),
            suspect: AtomicBool::new(false),
            evicting: AtomicBool::new(false),
            incarnation: AtomicU64::new(0),
            durability_marker: settings.durability_marker,
        }
    }

    /// The key of the restart guard's durability marker, under the key prefix.
    pub(super) fn marker_key(&self) -> &str {
        &self.durability_marker
    }
}

/// `NodeHealth::started` when no restart hold-out applies.
pub(crate) const NOT_STARTED: i64 = i64::MIN;

/// A duration in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
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
    pub(crate) names: Vec<String>,
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
    pub(super) fn record(&self, i: usize, run_id: &str) -> Option<usize> {
        let mut run_ids = lock(&self.run_ids);
        if let Some(slot) = run_ids.get_mut(i) {
            *slot = Some(run_id.to_owned());
        }
        let shared = (0..run_ids.len()).any(|j| twin(&run_ids, j).is_some());
        self.shared.store(shared, Ordering::Release);
        twin(&run_ids, i)
    }

    /// Whether node `i` has connected at least once (its run id is known).
    fn known(&self, i: usize) -> bool {
        lock(&self.run_ids).get(i).is_some_and(Option::is_some)
    }

    /// Another node whose latest run id is node `i`'s: its name and the run id.
    pub(super) fn twin_of(&self, i: usize) -> Option<(&str, String)> {
        if !self.shared.load(Ordering::Acquire) {
            return None;
        }
        let run_ids = lock(&self.run_ids);
        let j = twin(&run_ids, i)?;
        Some((self.names.get(j)?.as_str(), run_ids.get(i)?.clone()?))
    }
}

/// Whether a restarted node's fencing counters still have to be restored from the others.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repair {
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
    pub(super) fn is_fixed(&self) -> bool {
        self.fixed.is_some()
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

impl Node {
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
        if self.health.evicting.load(Ordering::Acquire) {
            return Some(NodeError::Evicting(
                lock(&self.health.state).eviction.clone(),
            ));
        }
        if let Some(remaining) = self.restart_hold_out() {
            return Some(NodeError::HeldOut { remaining });
        }
        if !self.health.suspect.load(Ordering::Acquire) {
            return None;
        }
        let health = lock(&self.health.state);
        self.settle(&health);
        (health.repair != Repair::Clean).then_some(NodeError::Repairing)
    }

    /// How long ago this client met the node after a data loss it could not rule out (a
    /// restart or failover it saw, without proof the data survived), when that is less than
    /// `within` ago. A key written with an expiry of `within` before that meeting may have
    /// been lost; one written after it, or before but expired by now, is there or gone for
    /// good: so the node's "absent" for such a key proves absence only once this returns
    /// `None`.
    pub(crate) fn lost_data_within(&self, within: Duration) -> Option<Duration> {
        let at = self.health.lost_data.load(Ordering::Acquire);
        if at == NOT_STARTED {
            return None;
        }
        let ago = nanos(self.health.epoch.elapsed()).saturating_sub(at);
        let ago = Duration::from_nanos(u64::try_from(ago).unwrap_or(0));
        (ago < within).then_some(ago)
    }

    /// How much longer the restart guard holds the node out: until the max ttl in use now has
    /// passed since the node's start.
    pub(crate) fn restart_hold_out(&self) -> Option<Duration> {
        let start = self.health.started.load(Ordering::Acquire);
        if start == NOT_STARTED {
            return None;
        }
        let now = nanos(self.health.epoch.elapsed());
        let until = start.saturating_add(nanos(self.health.max_ttl.get()));
        if now < until {
            if !self.health.holding.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    node = %self.name,
                    max_ttl = ?self.health.max_ttl.get(),
                    "node started less than the max ttl now in use ago; it counts toward no quorum until that has passed"
                );
            }
            return Some(Duration::from_nanos(
                u64::try_from(until - now).unwrap_or(0),
            ));
        }
        if self.health.holding.swap(false, Ordering::Relaxed) {
            tracing::info!(node = %self.name, "restarted node's hold-out is over");
        }
        // A max ttl that can still grow (the largest this client used) could make the node
        // young again: keep its start until a configured max ttl says it never will.
        if self.health.max_ttl.is_fixed() {
            let _ = self.health.started.compare_exchange(
                start,
                NOT_STARTED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        None
    }

    /// Clears the `suspect` hint once no repair holds the node out (called under the mutex).
    pub(super) fn settle(&self, health: &Health) {
        if health.repair == Repair::Clean {
            self.health.suspect.store(false, Ordering::Release);
        }
    }

    /// Records which settings the connect could not read, logged once per change at info (the
    /// user sees them in `Redlock::status`): unread `appendfsync` means the node is never
    /// taken for durable (every restart holds it out and repairs it); unread `maxmemory` /
    /// `maxmemory-policy` leave its eviction risk unknown.
    pub(super) fn observe_config(&self, config: &NodeConfig) {
        let unchecked: Vec<&'static str> = [
            ("appendfsync", config.appendfsync.is_none()),
            ("maxmemory", config.maxmemory.is_none()),
            ("maxmemory-policy", config.policy.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, unread)| unread.then_some(name))
        .collect();
        let mut health = lock(&self.health.state);
        if !unchecked.is_empty() && health.unchecked != unchecked {
            tracing::info!(
                node = %self.name,
                unchecked = ?unchecked,
                "CONFIG GET unavailable (renamed or refused): the node is not taken for durable \
                 (a restart always holds it out and repairs it) and its eviction policy is \
                 unknown; check these settings with your provider"
            );
        }
        health.unchecked = unchecked;
    }

    /// The settings the last connect could not read (`CONFIG GET` refused or renamed), by
    /// their Redis names; empty before any connect.
    pub(crate) fn unchecked(&self) -> Vec<&'static str> {
        lock(&self.health.state).unchecked.clone()
    }

    /// The node's memory policy risk as last read on connect.
    pub(crate) fn eviction(&self) -> EvictionRisk {
        lock(&self.health.state).eviction.clone()
    }

    /// Whether the server this node reaches is known (it has connected at least once): until
    /// then it may be the same server as another node.
    pub(crate) fn identity_known(&self) -> bool {
        self.peers.known(self.index)
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
        lock(&self.health.state).repair != Repair::Clean
    }

    /// Claims the restoring of this node's counters (once per needed repair): the repair's
    /// epoch, which [`finish_repair`](Self::finish_repair) must present.
    pub(crate) fn claim_repair(&self) -> Option<u64> {
        if !self.health.suspect.load(Ordering::Acquire) {
            return None;
        }
        let mut health = lock(&self.health.state);
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
        let health = lock(&self.health.state);
        health.repair == Repair::Running && health.repair_epoch == epoch
    }

    /// Ends the repair claimed with `epoch`: clean on success, to be claimed again on failure.
    /// Ignored when the node restarted again since the claim (that restart needs a repair of
    /// its own).
    pub(crate) fn finish_repair(&self, epoch: u64, ok: bool) {
        let mut health = lock(&self.health.state);
        if health.repair == Repair::Running && health.repair_epoch == epoch {
            health.repair = if ok { Repair::Clean } else { Repair::Needed };
        }
        self.settle(&health);
    }

    /// How many restarts (run id changes) of this node this client has seen.
    pub(crate) fn incarnation(&self) -> u64 {
        self.health.incarnation.load(Ordering::Acquire)
    }

    /// Records the node's memory policy: a warning when it turns risky (once per node and
    /// policy), and the strict eviction guard's hold-out.
    pub(super) fn observe_eviction(&self, risk: EvictionRisk) {
        let mut health = lock(&self.health.state);
        if risk.is_risky() && health.eviction != risk {
            tracing::warn!(
                node = %self.name,
                risk = %risk,
                guard = ?self.health.eviction_guard,
                "node may evict lock keys under memory pressure, without any restart: set \
                 maxmemory-policy noeviction (or maxmemory 0) on lock nodes"
            );
        }
        self.health.evicting.store(
            self.health.eviction_guard == EvictionGuard::Strict && risk.is_risky(),
            Ordering::Release,
        );
        health.eviction = risk;
    }

    /// The restart guard: compares the server's identity (`identity`: its run id and
    /// replication id, see [`server_identity`]) with the last one seen. `uptime` is its age
    /// (zero for a server promoted during its current process); `run_id` is what its
    /// durability marker is compared with. A node whose data demonstrably survived its start
    /// ([`data_survived`]: `appendfsync always` and a durability marker from an earlier run) is
    /// neither held out nor repaired.
    pub(super) fn observe_start(
        &self,
        identity: String,
        run_id: &str,
        uptime: Duration,
        fsync_always: bool,
        marker: Option<String>,
    ) {
        let mut health = lock(&self.health.state);
        let meeting = match &health.run_id {
            None => Meeting::First,
            Some(previous) if *previous == identity => Meeting::Same,
            Some(_) => Meeting::Restarted,
        };
        if meeting == Meeting::Restarted {
            self.health.incarnation.fetch_add(1, Ordering::AcqRel);
        }
        let durable_before = (meeting == Meeting::Restarted).then_some(health.durable);
        let survived = data_survived(fsync_always, marker.as_deref(), run_id, durable_before);
        let (hold, repair) = restart_verdict(self.health.guard, meeting, survived);
        if hold {
            // Counted from now with the youngest age the uptime allows: the latest it can have
            // started.
            let age = youngest_age(uptime);
            let start = nanos(self.health.epoch.elapsed()).saturating_sub(nanos(age));
            self.health.started.store(start, Ordering::Release);
            if let Some(remaining) = hold_out_for(uptime, self.health.max_ttl.get()) {
                self.health.holding.store(true, Ordering::Relaxed);
                tracing::warn!(
                    node = %self.name,
                    uptime_s = uptime.as_secs(),
                    held_out_for = ?remaining,
                    until_unix_s = (std::time::SystemTime::now() + remaining)
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                    "node (re)started less than the max ttl ago and may have lost lock keys; \
                     it counts toward no quorum until the max ttl has passed since its start"
                );
            }
        }
        // Seen restarting without proof its data survived: its fencing counters (which never
        // expire) may be gone too; restore them from the other nodes before it counts again.
        if repair {
            self.health
                .lost_data
                .store(nanos(self.health.epoch.elapsed()), Ordering::Release);
            health.repair = Repair::Needed;
            health.repair_epoch += 1;
            self.health.suspect.store(true, Ordering::Release);
        }
        if meeting == Meeting::Restarted && survived {
            tracing::info!(
                node = %self.name,
                "node restarted with its data (appendfsync always, durability marker intact); it counts at once"
            );
        }
        health.durable = fsync_always && marker.is_some();
        health.run_id = Some(identity);
    }
}

impl Node {
    /// Whether the last connect met the server of this identity (run id and replication id).
    pub(super) fn met_before(&self, identity: &str) -> bool {
        lock(&self.health.state).run_id.as_deref() == Some(identity)
    }

    /// The clock-jump check's verdict (`wallclock.rs`): the node may have expired lock keys
    /// early, as a restart without its data may have lost them. Held out for the max ttl from
    /// now and repaired, unless the restart guard is off.
    pub(super) fn observe_clock_jump(&self) {
        if self.health.guard == RestartGuard::Off {
            return;
        }
        let mut health = lock(&self.health.state);
        let now = nanos(self.health.epoch.elapsed());
        self.health.started.store(now, Ordering::Release);
        self.health.holding.store(true, Ordering::Relaxed);
        self.health.lost_data.store(now, Ordering::Release);
        health.repair = Repair::Needed;
        health.repair_epoch += 1;
        self.health.suspect.store(true, Ordering::Release);
    }
}

/// The settings read from a node with `CONFIG GET`; `None` where unreadable.
#[derive(Debug, Default)]
pub(crate) struct NodeConfig {
    pub(super) appendfsync: Option<String>,
    pub(super) maxmemory: Option<String>,
    pub(super) policy: Option<String>,
}

/// The settings a connect reads with `CONFIG GET`.
const SETTINGS: [&str; 3] = ["appendfsync", "maxmemory", "maxmemory-policy"];

/// Reads what a connect needs in one round trip on Redis ≥ 7: the `INFO` sections the guards
/// and the fenced acquire read (server, persistence, replication; one reply) and `appendfsync`,
/// `maxmemory` and `maxmemory-policy` (one `CONFIG GET`). An older server takes one section and
/// one setting per command and refuses both: it then gets its default `INFO` (which holds those
/// sections) and one `CONFIG GET` per setting, in a second round trip. A refused `INFO` is an
/// error (the connect fails). A refused `CONFIG GET` (renamed or forbidden, as managed services
/// do) leaves every setting unknown: the node is then treated as one that may lose its last
/// writes in a restart, and its eviction risk is reported as unknown; the connect goes on.
///
/// The same round trip asks the server to run a script (`EVAL "return 1" 0`): its reply is
/// returned as it came, for the connect to tell a server that cannot run scripts.
pub(crate) async fn read_settings(
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<(String, NodeConfig, Option<redis::Value>)> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("INFO")
        .arg("server")
        .arg("persistence")
        .arg("replication");
    pipe.cmd("CONFIG").arg("GET").arg(&SETTINGS[..]);
    pipe.cmd("EVAL").arg("return 1").arg(0);
    let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    let mut replies = replies.into_iter();
    let (info, config, eval) = (replies.next(), replies.next(), replies.next());
    if let Some(Ok(info)) = info.map(redis::Value::extract_error) {
        let config = config.map_or_else(NodeConfig::default, NodeConfig::from_reply);
        return Ok((redis::from_redis_value(info)?, config, eval));
    }
    let info: String = redis::cmd("INFO").query_async(conn).await?;
    let mut pipe = redis::pipe();
    for name in SETTINGS {
        pipe.cmd("CONFIG").arg("GET").arg(name);
    }
    let replies: redis::RedisResult<Vec<redis::Value>> = pipe.query_async(conn).await;
    let config = match replies {
        Ok(replies) => {
            let pairs = replies.into_iter().filter_map(config_pairs).flatten();
            NodeConfig::from_pairs(pairs.collect())
        }
        Err(_) => NodeConfig::default(),
    };
    Ok((info, config, eval))
}

impl NodeConfig {
    /// The settings in a `CONFIG GET` reply; all unknown if it is an error.
    fn from_reply(reply: redis::Value) -> Self {
        config_pairs(reply).map_or_else(NodeConfig::default, NodeConfig::from_pairs)
    }

    fn from_pairs(pairs: Vec<(String, String)>) -> Self {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        NodeConfig {
            appendfsync: get(SETTINGS[0]),
            maxmemory: get(SETTINGS[1]),
            policy: get(SETTINGS[2]),
        }
    }
}

/// The `(name, value)` pairs of a `CONFIG GET` reply: a flat list `[name, value, ...]` (RESP2)
/// or a map `{name: value}` (RESP3, a `?protocol=resp3` URL or a user's RESP3 client); `None`
/// for any other shape (an error).
pub(crate) fn config_pairs(reply: redis::Value) -> Option<Vec<(String, String)>> {
    let text = |v: redis::Value| redis::from_redis_value::<String>(v).ok();
    match reply {
        redis::Value::Array(flat) => {
            let mut items = flat.into_iter();
            let mut pairs = Vec::new();
            while let (Some(name), Some(value)) = (items.next(), items.next()) {
                pairs.push((text(name)?, text(value)?));
            }
            Some(pairs)
        }
        redis::Value::Map(map) => map
            .into_iter()
            .map(|(name, value)| Some((text(name)?, text(value)?)))
            .collect(),
        _ => None,
    }
}

/// Writes the node's durability marker (`key`: `P:durability-marker`) if it has none (`SET NX`,
/// the current run id: acknowledged only once fsynced under `appendfsync always`) and reads it
/// back. Written once on a node that runs with `appendfsync always`, holding the run id of the
/// server it was written to; found after a restart holding an earlier run id, it shows the
/// keyspace survived the restart. `None` on any error (a node out of memory under `noeviction`,
/// a user whose ACL refuses the key, say): the node's data is then not trusted to survive.
pub(crate) async fn durability_marker(
    conn: &mut MultiplexedConnection,
    key: &str,
    run_id: &str,
) -> Option<String> {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(key)
        .arg(run_id)
        .arg("NX")
        .ignore()
        .cmd("GET")
        .arg(key);
    let reply: redis::RedisResult<(Option<String>,)> = pipe.query_async(conn).await;
    reply.ok().and_then(|(marker,)| marker)
}

pub(crate) fn parse_info(info: &str) -> Option<(String, Duration)> {
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

/// The identity the restart guard compares across connects for a server that may change role
/// (a Sentinel member's primary, a Cluster master): its run id and its replication id
/// (`master_replid` in `INFO replication`). A restart changes the run id; a promotion, even of a
/// server demoted and promoted back within one process (a failback), gives it a new
/// replication id while the run id stays. An unreadable replication id reads as `?` (a later
/// readable one then differs: the conservative direction).
pub(crate) fn server_identity(run_id: &str, info_replication: &str) -> String {
    let replid = info_replication
        .lines()
        .find_map(|l| l.strip_prefix("master_replid:"))
        .map_or("?", str::trim);
    format!("{run_id}/{replid}")
}

/// Whether an `INFO replication` reply shows a server promoted from a replica during its
/// current process: Redis keeps its replication id from before the promotion as
/// `master_replid2`, and `second_repl_offset` is then the offset where it took over (`-1` on a
/// server that was never a replica since it started). An unreadable reply counts as promoted
/// (the conservative reading: the server is held out as if it had just started).
pub(crate) fn promoted(info_replication: &str) -> bool {
    info_replication
        .lines()
        .find_map(|l| l.strip_prefix("second_repl_offset:"))
        .is_none_or(|v| v.trim() != "-1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_get_replies_are_read_in_both_protocols() {
        use redis::Value;
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("maxmemory"),
            bulk("0"),
            bulk("maxmemory-policy"),
            bulk("volatile-lru"),
        ]);
        let resp3 = Value::Map(vec![
            (bulk("maxmemory-policy"), bulk("volatile-lru")),
            (bulk("maxmemory"), bulk("0")),
        ]);
        for reply in [resp2, resp3] {
            let config = NodeConfig::from_reply(reply);
            assert_eq!(config.policy.as_deref(), Some("volatile-lru"));
            assert_eq!(config.maxmemory.as_deref(), Some("0"));
            assert_eq!(config.appendfsync, None);
        }
        assert_eq!(config_pairs(Value::Array(vec![])), Some(vec![]));
        assert_eq!(config_pairs(Value::Map(vec![])), Some(vec![]));
        assert_eq!(config_pairs(Value::Nil), None);
        assert_eq!(NodeConfig::from_reply(Value::Nil).policy, None);
    }

    #[test]
    fn the_identity_of_a_server_that_may_change_role_carries_its_replication_id() {
        let info = "# Replication\r\nrole:master\r\nmaster_replid:abc\r\nmaster_replid2:000\r\n";
        assert_eq!(server_identity("run1", info), "run1/abc");
        assert_eq!(server_identity("run1", "# Replication\r\n"), "run1/?");
    }

    #[test]
    fn a_promotion_shows_in_info_replication() {
        let never = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:ab\r\n\
                     master_replid2:0000000000000000000000000000000000000000\r\n\
                     master_repl_offset:0\r\nsecond_repl_offset:-1\r\n";
        assert!(!promoted(never));
        let after = never.replace("second_repl_offset:-1", "second_repl_offset:1234");
        assert!(promoted(&after));
        assert!(promoted("# Replication\r\nrole:master\r\n"));
    }

    #[test]
    pub(super) fn info_parsing_finds_run_id_and_uptime() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        assert_eq!(
            parse_info(info),
            Some(("abc123".to_owned(), Duration::from_secs(42)))
        );
        assert_eq!(parse_info("garbage"), None);
    }

    #[test]
    pub(super) fn max_ttl_tracks_the_largest_seen_with_a_floor() {
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
