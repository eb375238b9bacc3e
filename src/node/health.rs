//! What the node layer knows of one server's health, and acts on: the restart guard (hold-out
//! after a restart, repair needed), one server reached by two URLs ([`Peers`]), the eviction
//! guard, the max ttl in use, and what a connect reads to decide them (`INFO`, `CONFIG GET`,
//! the durability marker). The decisions themselves are pure, in [`crate::core::health`].

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::server::NodeConfig;
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
    /// The settings the last connect needed and could not read (`CONFIG GET` refused or
    /// renamed).
    unchecked: Vec<&'static str>,
}

/// What the restart and eviction guards know of one node, owned by this file.
///
/// `state` holds the truth; a call reads the atomics instead, so that the common case (nothing
/// held out) takes no lock.
///
/// # Invariants
///
/// - **`suspect` mirrors `state.repair != Clean`, erring on the safe side**: it is set in the
///   same critical section that makes a repair needed, and cleared only under the mutex once
///   the repair is `Clean` (`settle`). So while the mutex is free, a repair pending implies
///   `suspect`; `suspect` may stay set a while after the repair is done (the next check, under
///   the mutex, clears it), never the reverse.
/// - **`evicting` mirrors `state.eviction`**: it is written with it, under the mutex, as
///   "the strict eviction guard and a risky policy"; they never disagree while the mutex is
///   free.
/// - **`incarnation` counts the restarts `state.run_id` saw**: bumped under the mutex when a
///   connect meets another identity; it never decreases.
/// - **`started`, `lost_data` and `holding` mirror nothing**: they are the hold-out's own
///   state, written under the mutex when a connect finds a restart (or a clock jump), and
///   `started` cleared without it once a fixed max ttl has passed (a compare-and-swap, so a
///   newer start is never cleared). `holding` only chooses log lines and may lag.
///
/// # Lock order
///
/// `state` is never held while another lock is taken ([`Peers`]' is taken and let go before
/// it) nor across an `await`.
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
        let unchecked = config.unread.clone();
        let mut health = lock(&self.health.state);
        if !unchecked.is_empty() && health.unchecked != unchecked {
            tracing::info!(
                node = %self.name,
                unchecked = ?unchecked,
                "CONFIG GET unavailable (renamed or refused): an unread appendfsync means the \
                 node is not taken for durable (a restart always holds it out and repairs it), \
                 unread memory settings leave its eviction policy unknown; check these settings \
                 with your provider"
            );
        }
        health.unchecked = unchecked;
    }

    /// The settings the last connect needed and could not read (`CONFIG GET` refused or
    /// renamed), by their Redis names; empty before any connect.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(restart_guard: RestartGuard, eviction_guard: EvictionGuard) -> Node {
        let client = redis::Client::open("redis://127.0.0.1:1/").expect("a valid URL");
        let settings = NodeSettings {
            connect_timeout: Duration::from_millis(50),
            node_timeout: Duration::from_millis(50),
            restart_guard,
            eviction_guard,
            fenced: true,
            drift_factor: 0.01,
            #[cfg(feature = "testkit")]
            force_script: false,
            durability_marker: "m".to_owned(),
        };
        Node::new(
            "n".to_owned(),
            super::super::member::standalone(client).member,
            settings,
            Arc::new(MaxTtl::new(Some(Duration::from_secs(30)))),
            0,
            Arc::new(Peers::new(["n".to_owned()])),
        )
    }

    /// The invariants of [`NodeHealth`] that hold while its mutex is free.
    fn mirrors_hold(node: &Node) {
        let health = lock(&node.health.state);
        if health.repair != Repair::Clean {
            assert!(
                node.health.suspect.load(Ordering::Acquire),
                "a repair pending unflagged"
            );
        }
        assert_eq!(
            node.health.evicting.load(Ordering::Acquire),
            node.health.eviction_guard == EvictionGuard::Strict && health.eviction.is_risky()
        );
    }

    #[test]
    fn the_atomics_mirror_a_repair_through_its_life() {
        let node = node(RestartGuard::Restarted, EvictionGuard::default());
        node.observe_start("a".to_owned(), "a", Duration::from_secs(5), false, None);
        mirrors_hold(&node);
        assert!(node.held_out().is_none());
        node.observe_start("b".to_owned(), "b", Duration::ZERO, false, None);
        mirrors_hold(&node);
        assert_eq!(node.incarnation(), 1);
        assert!(matches!(node.held_out(), Some(NodeError::HeldOut { .. })));
        let epoch = node.claim_repair().expect("a repair to claim");
        mirrors_hold(&node);
        node.finish_repair(epoch, false);
        mirrors_hold(&node);
        let epoch = node
            .claim_repair()
            .expect("a failed repair is claimed again");
        node.finish_repair(epoch, true);
        mirrors_hold(&node);
        assert!(!node.needs_repair());
        node.observe_clock_jump();
        mirrors_hold(&node);
        assert!(node.needs_repair() && node.restart_hold_out().is_some());
    }

    #[test]
    fn evicting_mirrors_the_policy_under_the_strict_guard_only() {
        for guard in [EvictionGuard::Strict, EvictionGuard::default()] {
            let node = node(RestartGuard::Off, guard);
            let risky = EvictionRisk::LockKeys {
                policy: "volatile-lru".to_owned(),
            };
            for risk in [EvictionRisk::default(), risky, EvictionRisk::None] {
                node.observe_eviction(risk);
                mirrors_hold(&node);
            }
        }
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
