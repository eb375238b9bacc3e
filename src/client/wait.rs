//! Waiting for a held lock: released locks wake their waiters instead of leaving them to poll.
//!
//! # How a waiter learns of a release
//!
//! - **Pub/sub, across clients.** While some client waits for `K`, the *waiters marker*
//!   `quorumlock:{K}:waiters` (a set of the waiting clients' ids) and beside it the *waiters
//!   count* `quorumlock:{K}:waiters:n` (a string: the set's size) exist on the nodes (set by
//!   the waiting client in one script call with a 10 s expiry, refreshed every 3 s while it
//!   waits; `node/lua.rs`, `MARK_WAITING`). The release script reads the lock key and the
//!   count in one `MGET`, deletes the lock and, only if the count exists, publishes the
//!   released value on the marker's channel (`node/lua.rs`, `RELEASE`). An uncontended release
//!   runs the same commands as a plain compare-and-delete (`MGET`, `DEL`), and publishes
//!   nothing. Each client that waits holds one pub/sub
//!   connection per node ([`Node::open_pubsub`]), subscribed to the channel of every key it
//!   waits for, re-established with the crate's backoff when it breaks or stops answering a
//!   `PING`; after every (re)subscription all its waiters try again (notices may have been
//!   missed).
//! - **No local shortcut.** A release by this client reaches this client's own waiters by the
//!   same notices: woken earlier, they would win nearly every time and starve the waiters of
//!   other clients (measured: one client of three took 46 of 60 acquisitions).
//! - **The holder's expiry, the fallback.** A waiter refused by a holder also retries when its
//!   timer fires: it reads the key's `PTTL` on every node (one command each; decided once a
//!   quorum has answered, so a hung node costs no timeout) and sleeps until the key has
//!   expired on a quorum, at most 1 s (`core::timing::HOLDER_WAIT_CAP`, or the
//!   configured retry delay when longer; `Engine::holder_pause`); when it wakes it reads the
//!   key again and makes a round only once a quorum may be free (or the nodes cannot tell, or
//!   its wait is over). A holder that crashed (an
//!   expiry publishes nothing) is so taken over within a round trip of its key's expiry; one
//!   that keeps its lock alive costs each waiting client one `PTTL` per node a second and no
//!   round; a release
//!   that published nothing (another Redlock client in compat mode, a Redis Cluster member, a
//!   notice lost on every node) is noticed within that second. A round that failed for another
//!   reason (too few nodes) retries after the crate's one retry policy
//!   (`core::timing::backoff`: the configured delay, doubling up to 1 s, plus jitter).
//!
//! Only a release of a lock that stood on a quorum announces itself. The undo of a failed
//! attempt (a round refused, or split between contenders) publishes nothing
//! (`Engine::release_on`): it releases nothing anyone waits for, and its notice woke every
//! waiter, its own client's included, which then tried at once, failed, undid and woke itself
//! again, for as long as the holder's key was missing on some node. A fresh client's
//! first wait also awaits its subscriptions (at most the connect timeout; compat mode makes
//! none and awaits nothing) before its next round:
//! each node's subscription wakes the waiters once it stands, which would otherwise cost one
//! round per node.
//!
//! The copies of one notice (one per node) are counted once: a notice carries the released
//! value, and the last few values are remembered.
//!
//! A client's id stays in the marker until its expiry (at most 10 s after its last waiter
//! left): releases meanwhile publish a notice nobody needs, and the client count in it is one
//! too high (a woken head may defer up to [`DEFER`](super::queue::DEFER) for nothing). Removing the id when a
//! client's queue empties would race with the `SADD` of its next wait (another task, so not
//! ordered with it), and a marker removed under a waiter loses its notices.
//!
//! # Fairness
//!
//! The waiters of one client for one key form a FIFO queue: only the oldest makes attempt
//! rounds; the others wait for their turn, so they neither collide with it (split votes) nor
//! overtake it. A new waiter queues behind the existing ones instead of trying first
//! (`try_acquire`, which never waits, may still overtake). When the head wins, the next waiter
//! waits for the release of that lock before its first round; a notice of another release
//! meanwhile makes it read the key's `PTTL`, and it takes its turn once a quorum is free (that
//! lock ended without a notice: forgotten, expired, lost, or released after the marker
//! lapsed). Between clients there is no queue:
//! on a release, the head waiter of each client tries, and a split vote is resolved by the
//! random pauses of `client/acquire.rs`; each contender has the same chance at every release.
//! A FIFO across clients would need a queue that a quorum agrees on, kept alive through node
//! failures and waiter crashes (Redisson's fair lock keeps it on one server): not offered.
//!
//! None of this bears on safety: a waiter woken for nothing makes a round that is refused,
//! and a lost notice only delays it until its timer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::PubSubSink;
use smallvec::SmallVec;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::Engine;
use super::queue::{KeyWait, ReleaseNotice, Ticket};
use super::side::until_quorum;
use crate::core::keys::{WAITERS_SUFFIX, waiters_key_of};
use crate::core::lock;
use crate::core::timing;
use crate::error::NodeError;
use crate::node::member::cluster_serves_locks_only;
use crate::node::pubsub::{Subscriber, keep_subscribed};

/// How long a waiters marker lives unless refreshed.
const MARKER_TTL: Duration = Duration::from_secs(10);
/// How often a waiting client refreshes its marker.
pub(super) const MARKER_REFRESH: Duration = Duration::from_secs(3);
/// Beyond this many keys waited on, keys nobody waits for any longer are forgotten (and
/// unsubscribed) on the next registration.
const MAX_IDLE_KEYS: usize = 1024;

impl Default for Hub {
    fn default() -> Self {
        Hub {
            id: crate::core::value::new_value(),
            keys: Mutex::default(),
            any: AtomicBool::default(),
            sinks: Mutex::default(),
            first_tries: AtomicUsize::default(),
            tried: Notify::new(),
        }
    }
}

/// The waiting side of a client: its subscriptions and its waiters, per key.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    hub: Arc<Hub>,
    /// One subscription task per node, started at the first wait.
    tasks: OnceLock<Vec<AbortOnDropHandle<()>>>,
}

#[derive(Debug)]
struct Hub {
    /// This client's id in the waiters markers.
    id: String,
    /// By lock key.
    keys: Mutex<HashMap<String, Arc<KeyWait>>>,
    /// Whether any key is waited on: a release skips the map when none is.
    any: AtomicBool,
    /// The sink of each node's pub/sub connection, while it is up.
    sinks: Mutex<Vec<Option<PubSubSink>>>,
    /// How many nodes' subscription tasks have ended their first attempt (subscribed and woken
    /// the waiters, or failed).
    first_tries: AtomicUsize,
    /// Notified at each end of a first attempt.
    tried: Notify,
}

impl Waiting {
    /// Remembers that this client released `value` of `lock_key` (if it waits for the key):
    /// its own waiters then yield to other clients' at the notice.
    pub(crate) fn released_by_us(&self, lock_key: &str, value: &str) {
        if !self.hub.any.load(Ordering::Relaxed) {
            return;
        }
        if let Some(kw) = lock(&self.hub.keys).get(lock_key) {
            kw.ours(value);
        }
    }

    /// Whether this client has waited for `lock_key` (and not forgotten it since: keys nobody
    /// waits for are forgotten past [`MAX_IDLE_KEYS`]).
    pub(crate) fn has_waited(&self, lock_key: &str) -> bool {
        self.hub.any.load(Ordering::Relaxed) && lock(&self.hub.keys).contains_key(lock_key)
    }

    /// The release notices counted so far for `lock_key` (0 when this client never waited for
    /// it).
    pub(crate) fn epoch(&self, lock_key: &str) -> u64 {
        if !self.hub.any.load(Ordering::Relaxed) {
            return 0;
        }
        lock(&self.hub.keys)
            .get(lock_key)
            .map_or(0, |kw| kw.epoch())
    }

    /// Whether this client has waiters queued for `lock_key`.
    pub(crate) fn has_queue(&self, lock_key: &str) -> bool {
        self.hub.any.load(Ordering::Relaxed)
            && lock(&self.hub.keys)
                .get(lock_key)
                .is_some_and(|kw| kw.has_queue())
    }
}

impl Engine {
    /// Registers a waiter for `lock_keys` (a lock's key, or every permit's of a semaphore) and
    /// queues it behind this client's waiters for the first: subscribes on every node and sets
    /// each key's waiters marker there (both awaited for at most the node timeout), so that a
    /// release from now on publishes a notice. The caller then reads the holders' keys: a lock
    /// may have been released before the marker stood. Returns the keys' waiters, in order, and
    /// the waiter's place in the first key's queue.
    pub(super) async fn wait_for(
        &self,
        lock_keys: &[&str],
    ) -> (SmallVec<[Arc<KeyWait>; 1]>, Ticket) {
        let hub = &self.inner.waiting.hub;
        self.start_subscriptions();
        let mut kws: SmallVec<[Arc<KeyWait>; 1]> = SmallVec::with_capacity(lock_keys.len());
        let mut fresh: SmallVec<[bool; 1]> = SmallVec::with_capacity(lock_keys.len());
        {
            let mut keys = lock(&hub.keys);
            for &lock_key in lock_keys {
                if keys.len() >= MAX_IDLE_KEYS {
                    self.forget_idle(&mut keys);
                }
                fresh.push(!keys.contains_key(lock_key));
                let kw = keys
                    .entry(lock_key.to_owned())
                    .or_insert_with(|| Arc::new(KeyWait::new(waiters_key_of(lock_key))));
                kws.push(Arc::clone(kw));
            }
            hub.any.store(true, Ordering::Relaxed);
        }
        // The queue is joined before any await: the waiter's place is the call's order.
        let ticket = KeyWait::join(&kws[0]);
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let register = kws
            .iter()
            .zip(&fresh)
            .map(|(kw, &fresh)| self.register(kw, fresh, deadline));
        futures::join!(
            futures::future::join_all(register),
            self.first_subscriptions()
        );
        (kws, ticket)
    }

    /// Subscribes to `kw`'s channel on every node where the subscription is up (when `fresh`:
    /// the key was not waited on before) and sets its waiters marker, each until a quorum has
    /// answered (or `deadline`).
    async fn register(&self, kw: &KeyWait, fresh: bool, deadline: Instant) {
        let hub = &self.inner.waiting.hub;
        let subscribe = async {
            if !fresh {
                return;
            }
            // Sinks present now; a node whose connection is not up subscribes to every key
            // when it connects (it reads the keys after storing its sink).
            let sinks: Vec<PubSubSink> = lock(&hub.sinks).iter().flatten().cloned().collect();
            let subs = sinks.into_iter().map(|mut sink| {
                let channel = kw.channel().to_owned();
                async move { sink.subscribe(channel).await }
            });
            until_quorum(subs, self.quorum(), deadline).await;
        };
        futures::join!(subscribe, self.set_marker(kw, true));
    }

    /// A fresh client's subscriptions wake every waiter once they stand (notices may have
    /// been missed before): awaited at registration, so that the round that follows starts
    /// after those wake-ups and is not repeated for them, five times on five nodes.
    async fn first_subscriptions(&self) {
        let hub = &self.inner.waiting.hub;
        // Compat mode subscribes nowhere (`start_subscriptions`): nothing to await.
        if self.inner.cfg.keys.is_compat() {
            return;
        }
        let n = self.inner.nodes.len();
        let start = Instant::now();
        let mut until = start + self.inner.cfg.connect_timeout;
        let mut graced = false;
        loop {
            let tried = hub.tried.notified();
            tokio::pin!(tried);
            tried.as_mut().enable();
            let stood = hub.first_tries.load(Ordering::Acquire);
            if stood >= n {
                return;
            }
            // Once a quorum's subscriptions stand, a hung node's may take as long again.
            if stood >= self.quorum() && !std::mem::replace(&mut graced, true) {
                until = timing::stragglers_until(start, Instant::now(), until);
            }
            if tokio::time::timeout_at(until, tried).await.is_err() {
                return;
            }
        }
    }

    /// Sets (or refreshes, when due) the waiters marker on every node. Awaited (bounded by the
    /// node timeout) when `wait`, otherwise sent in the background.
    pub(super) async fn set_marker(&self, kw: &KeyWait, wait: bool) {
        if self.inner.cfg.keys.is_compat() {
            return;
        }
        let now = Instant::now();
        if !kw.marker_due(now, now + MARKER_TTL - MARKER_REFRESH * 2) {
            return;
        }
        let channel = kw.channel();
        let deadline = now + self.inner.cfg.node_timeout;
        // A Cluster member serves lock rounds only: no marker there, so its releases publish
        // nothing and its waiters hear of them from the other members (or their poll timer).
        let sets = self
            .inner
            .nodes
            .iter()
            .filter(|n| !n.is_cluster())
            .map(|node| {
                let node = Arc::clone(node);
                let channel = channel.to_owned();
                let id = self.inner.waiting.hub.id.clone();
                async move { node.mark_waiting(&channel, &id, MARKER_TTL, deadline).await }
            })
            .collect::<Vec<_>>();
        if wait {
            // Once the marker stands on a quorum, a release there announces itself; a hung
            // node's marker is left to the refresh rather than costing the node timeout.
            until_quorum(sets, self.quorum(), deadline).await;
        } else if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(futures::future::join_all(sets));
        }
    }

    /// How long a waiter refused by a holder sleeps before its next round unless a notice
    /// wakes it: until the holder's key has expired on a quorum (its `PTTL` read on every
    /// node, one command each), at most [`timing::HOLDER_WAIT_CAP`] (or the configured retry
    /// delay, when longer). A holder that extends its lock meanwhile refuses the next round,
    /// and the pause is read again; one that crashed is followed within a round trip of its
    /// key's expiry.
    /// `None` when the nodes cannot tell (too few answers, keys that never expire).
    pub(crate) async fn holder_pause(&self, lock_key: &str) -> Option<Duration> {
        let cap = self.inner.cfg.retry_delay.max(timing::HOLDER_WAIT_CAP);
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let reads = self.inner.nodes.iter().map(|node| {
            let node = Arc::clone(node);
            async move {
                // A Cluster member serves lock rounds only.
                if node.is_cluster() {
                    return Err(NodeError::Redis(cluster_serves_locks_only()));
                }
                node.pttl(lock_key, deadline).await
            }
        });
        // A missing answer counts as "never free" in `quorum_free_in`, so the answers a hung
        // node owes could only shorten the figure.
        let pttls: Vec<Option<i64>> = until_quorum(reads, self.quorum(), deadline)
            .await
            .into_iter()
            .map(|answer| answer.and_then(Result::ok))
            .collect();
        let free_in = timing::quorum_free_in(&pttls, self.quorum());
        tracing::trace!(lock_key, ?pttls, ?free_in, "holder's key read");
        free_in.map(|d| d.min(cap))
    }

    /// Forgets keys nobody waits for (only the map holds them), unsubscribing their channels.
    fn forget_idle(&self, keys: &mut HashMap<String, Arc<KeyWait>>) {
        let idle: Vec<String> = keys
            .iter()
            .filter(|(_, kw)| Arc::strong_count(kw) == 1)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &idle {
            keys.remove(k);
        }
        let sinks: Vec<PubSubSink> = lock(&self.inner.waiting.hub.sinks)
            .iter()
            .flatten()
            .cloned()
            .collect();
        let channels: Vec<String> = idle.iter().map(|k| waiters_key_of(k)).collect();
        if channels.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let deadline = Instant::now() + self.inner.cfg.node_timeout;
            for mut sink in sinks {
                let channels = channels.clone();
                handle.spawn(async move {
                    let _ = tokio::time::timeout_at(deadline, sink.unsubscribe(channels)).await;
                });
            }
        }
    }

    /// Starts one subscription task per node, once per client (on the current runtime).
    fn start_subscriptions(&self) {
        // Compat mode: no waiters marker nor notices (its calls name the resource key only);
        // its waiters poll.
        if self.inner.cfg.keys.is_compat() {
            return;
        }
        let waiting = &self.inner.waiting;
        if waiting.tasks.get().is_some() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut sinks = lock(&waiting.hub.sinks);
            if sinks.is_empty() {
                sinks.resize(self.inner.nodes.len(), None);
            }
        }
        let _ = waiting.tasks.set(
            self.inner
                .nodes
                .iter()
                .enumerate()
                .map(|(i, node)| {
                    let waiters = NodeWaiters {
                        hub: Arc::clone(&waiting.hub),
                        i,
                        quorum: self.quorum(),
                        node: node.name().to_owned(),
                        first: true,
                    };
                    AbortOnDropHandle::new(handle.spawn(keep_subscribed(Arc::clone(node), waiters)))
                })
                .collect(),
        );
    }
}

/// The waiters' subscription on one node, kept up by the node layer's pub/sub loop
/// (`node::pubsub::keep_subscribed`) for as long as the client lives: subscribed to the channel
/// of every key waited on; after each (re)subscription it wakes every waiter (notices may have
/// been missed meanwhile).
struct NodeWaiters {
    hub: Arc<Hub>,
    /// The node's place among the client's nodes.
    i: usize,
    /// The client's quorum: a release announced by this many nodes stands freed on a quorum.
    quorum: usize,
    /// The node's name, for log lines.
    node: String,
    /// Whether this subscription has yet to count its first try (`Hub::first_tries`).
    first: bool,
}

impl NodeWaiters {
    /// Counts the first try of this node's subscription, made or failed (once).
    fn first_tried(&mut self) {
        if std::mem::take(&mut self.first) {
            self.hub.first_tries.fetch_add(1, Ordering::AcqRel);
            self.hub.tried.notify_waiters();
        }
    }
}

impl Subscriber for NodeWaiters {
    async fn subscribe(&mut self, sink: &mut PubSubSink, timeout: Duration) -> Result<(), String> {
        // Stored before the keys are read: a waiter registering meanwhile either is in the
        // list read below or finds the sink and subscribes itself.
        lock(&self.hub.sinks)[self.i] = Some(sink.clone());
        let channels: Vec<String> = lock(&self.hub.keys)
            .keys()
            .map(|k| waiters_key_of(k))
            .collect();
        let subscribed = channels.is_empty()
            || matches!(
                tokio::time::timeout(timeout, sink.subscribe(&channels)).await,
                Ok(Ok(()))
            );
        if !subscribed {
            return Err("subscribe failed".to_owned());
        }
        tracing::debug!(node = %self.node, keys = channels.len(), "waiters subscribed");
        self.hub.wake_all();
        self.first_tried();
        Ok(())
    }

    /// Passes a release notice on to its key's waiters.
    fn message(&mut self, msg: redis::Msg) {
        let channel = msg.get_channel_name();
        let Some(lock_key) = channel.strip_suffix(WAITERS_SUFFIX) else {
            return;
        };
        let payload: String = msg.get_payload().unwrap_or_default();
        let (value, clients) = payload.split_once(' ').unwrap_or((&payload, "1"));
        let clients = clients.parse().unwrap_or(1);
        let kw = lock(&self.hub.keys).get(lock_key).cloned();
        let i = self.i;
        tracing::trace!(lock_key, node = i, value, "release notice");
        if let Some(kw) = kw {
            kw.released(Some(ReleaseNotice {
                value,
                clients,
                node: i,
                quorum: self.quorum,
            }));
        }
    }

    fn lost(&mut self, why: &str) {
        lock(&self.hub.sinks)[self.i] = None;
        self.first_tried();
        tracing::debug!(node = %self.node, reason = %why, "waiters' subscription lost; resubscribing");
    }
}

impl Hub {
    fn wake_all(&self) {
        let keys: Vec<Arc<KeyWait>> = lock(&self.keys).values().cloned().collect();
        for kw in keys {
            kw.released(None);
        }
    }
}
