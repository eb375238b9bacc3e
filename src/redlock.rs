//! The lock client: fans each operation out to every node at once and decides as soon as the
//! outcome is certain.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use redis::Value;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::clock::{self, Stamp};
use crate::config::{EvictionRisk, RedlockBuilder};
use crate::error::{ArgumentError, Error, FailureList, LostReason, NodeError, NodeFailure};
use crate::fencing::FencingToken;
use crate::guard::{Lock, LockState};
use crate::lock;
use crate::metrics;
use crate::node::{HoldOut, MaxTtl, Node, RoundGate};
use crate::quorum::{self, Answer, HolderView, Refusal, Tally, Verdict};
use crate::scripts::{self, ScriptCall};

/// A Redlock client over N independent Redis masters. Cheap to clone (one `Arc`); clones share
/// the node connections.
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock::Redlock;
///
/// # async fn run() -> Result<(), quorumlock::Error> {
/// let locks = Redlock::builder([
///     "redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003",
///     "redis://127.0.0.1:7004", "redis://127.0.0.1:7005",
/// ])
/// .build()?;
///
/// match locks.try_acquire("payout-batch-42", Duration::from_secs(10)).await {
///     Ok(lock) => {
///         println!("token {} valid for {:?}", lock.token(), lock.validity());
///         // ... do the work, stamping writes with lock.token() ...
///         if let Err(e) = lock.release().await {
///             // `Lost`: the work outlived the validity (the fencing token guarded its writes);
///             // `NoQuorum`: the keys the release missed expire with the ttl.
///             tracing::warn!("{e}");
///         }
///     }
///     Err(e) if e.is_held() => { /* another instance is doing it: skip quietly */ }
///     Err(e) => tracing::warn!("lock service degraded: {e}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) cfg: RedlockBuilder,
    max_ttl: Arc<MaxTtl>,
    /// Background releases and the unanswered part of releases and extensions, so `flush` can
    /// wait for them. (Repairs run on their own until done: see `repair.rs`.)
    pub(crate) tasks: TaskTracker,
    /// Finished rounds' unanswered calls, kept (unpolled) until their deadline so that the
    /// queued commands are written: much cheaper than a task per round (see `Redlock::settle`).
    parked: Mutex<VecDeque<Tail>>,
    /// Set by an acquisition round that could not reach a quorum for lack of answers, cleared
    /// by one that reached it: the client warns once per outage, not once per round.
    outage: AtomicBool,
}

/// How many finished rounds may be parked at once; beyond, a round's calls get a task of their
/// own. Bounds what parked calls hold (a few KB each) under high throughput or long node
/// timeouts.
const MAX_PARKED: usize = 4096;

/// How many extra rounds an acquisition makes, beyond its retries, to resolve contention:
/// rounds refused although no value stood on a quorum (contenders that started together split
/// the nodes). Each undoes its partial acquisition first, then pauses at random.
const CONTENTION_ROUNDS: u32 = 6;

/// What one node says about a key, from [`Redlock::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The value (owner id) holding the lock there, if any.
    pub value: Option<String>,
    /// The key's remaining time to live there, if held.
    pub ttl: Option<Duration>,
    /// The node's fencing counter for the key.
    pub fence: u64,
}

/// One node's answer in a [`LockStatus`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node's address, password redacted.
    pub node: String,
    /// Its view of the key, or why it could not be read. A node that reaches the same server
    /// as another configured node reads [`NodeError::SameServer`]: it counts toward no quorum.
    pub state: Result<KeyState, NodeError>,
    /// What the node's memory policy can do to lock keys, as read on its last connect
    /// ([`EvictionRisk::Unknown`] before any, or where `CONFIG GET` is unavailable).
    pub eviction: EvictionRisk,
}

/// Every node's view of one key, from [`Redlock::status`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LockStatus {
    /// The user key.
    pub key: String,
    /// One entry per configured node, in configuration order.
    pub nodes: Vec<NodeStatus>,
    /// The quorum.
    pub quorum: usize,
}

impl LockStatus {
    /// How many nodes answered.
    pub fn answered(&self) -> usize {
        self.nodes.iter().filter(|n| n.state.is_ok()).count()
    }

    /// The value held by at least a quorum of nodes: the current owner, if any.
    ///
    /// `None` does not mean nobody holds the key when some nodes did not answer: see
    /// [`holder_view`](Self::holder_view), which tells vacant from unknown.
    pub fn holder(&self) -> Option<&str> {
        match self.holder_view() {
            HolderView::Held(v) => Some(v),
            HolderView::Vacant | HolderView::Unknown => None,
        }
    }

    /// Who holds the key, as far as this read can tell: [`HolderView::Held`] with the value a
    /// quorum of nodes holds; [`HolderView::Vacant`] when nobody does; [`HolderView::Unknown`]
    /// when no value stands on a quorum of the nodes that answered but the nodes that did not
    /// answer could complete one (the holder's key on nodes {0,1,2}, a read that reached
    /// {1,2,3,4}).
    pub fn holder_view(&self) -> HolderView<&str> {
        let values: Vec<Option<&str>> = self
            .nodes
            .iter()
            .filter_map(|n| Some(n.state.as_ref().ok()?.value.as_deref()))
            .collect();
        let unanswered = self.nodes.len() - values.len();
        quorum::holder_view(&values, unanswered, self.quorum)
    }

    /// `Ok` when a quorum of nodes answered; otherwise [`Error::NoQuorum`] naming each node that
    /// did not, and why.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`].
    pub fn require_quorum(&self) -> Result<(), Error> {
        if self.answered() >= self.quorum {
            return Ok(());
        }
        Err(self.unanswered())
    }

    /// [`Error::NoQuorum`] naming each node that did not answer, and why.
    pub(crate) fn unanswered(&self) -> Error {
        let failures = self
            .nodes
            .iter()
            .filter_map(|n| {
                n.state.as_ref().err().map(|cause| NodeFailure {
                    node: n.node.clone(),
                    cause: cause.clone(),
                })
            })
            .collect();
        Error::NoQuorum {
            key: self.key.clone(),
            reached: self.answered(),
            nodes: self.nodes.len(),
            needed: self.quorum,
            failures,
        }
    }

    /// The highest fencing counter any node reports.
    pub fn max_fence(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|n| n.state.as_ref().ok().map(|s| s.fence))
            .max()
            .unwrap_or(0)
    }
}

/// How long an acquisition keeps trying: it gives up once it has made `rounds` attempt rounds
/// *and* the next one would start more than `wait` after the call.
#[derive(Debug, Clone, Copy)]
struct Patience {
    rounds: u32,
    wait: Duration,
}

type NodeFuture = BoxFuture<'static, (usize, Result<Value, NodeError>)>;

/// A round's outcome: the verdict, the yes-answers (node index, integer reply), the values
/// that refused (`None`: a refusal that does not say which value holds the key) and failures
/// (refusals included, as [`NodeError::HeldByAnother`], so a failed round names them all).
struct Round {
    verdict: Verdict,
    tally: Tally,
    yes: Vec<(usize, i64)>,
    refusals: Vec<Option<Vec<u8>>>,
    failures: Vec<NodeFailure>,
    rest: Tail,
}

impl Round {
    /// How a refused acquisition reads (see [`quorum::refusal`]).
    fn refusal(&self) -> Refusal {
        quorum::refusal_of(
            self.tally.n(),
            &self.refusals,
            self.tally.failed(),
            self.tally.pending(),
        )
    }

    /// Nodes holding the most common foreign value seen, or every refusal when values are
    /// unknown: what `Held` reports.
    fn held_by_other(&self) -> usize {
        let (counts, unknown) = quorum::refusal_groups(&self.refusals);
        counts.into_iter().max().unwrap_or(0).max(unknown)
    }
}

/// The calls of a round still unanswered when its verdict was taken.
///
/// They are parked or driven until the round's deadline so that their queued commands reach
/// the nodes (see `Redlock::settle` and `docs/design.md`, "Late answers").
struct Tail {
    calls: FuturesUnordered<NodeFuture>,
    answered: Vec<bool>,
    gate: RoundGate,
    deadline: Instant,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("unanswered", &self.calls.len())
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl Tail {
    /// Whether keeping the calls without polling them is enough: every unanswered call is
    /// queued on its connection (a kept future keeps it from being skipped), or the round is
    /// closed (the others must not be sent).
    fn can_park(&self) -> bool {
        self.gate.is_closed()
            || self
                .answered
                .iter()
                .enumerate()
                .all(|(i, &answered)| answered || self.gate.handed(i))
    }

    /// Drives the unanswered calls to their answer, bounded by the round's deadline.
    async fn drive(self) {
        let mut calls = self.calls;
        let _ = tokio::time::timeout_at(self.deadline, async {
            while calls.next().await.is_some() {}
        })
        .await;
    }
}

impl Redlock {
    /// Starts configuring a client for these node URLs: `redis://[user:pass@]host:port[/db]`,
    /// `rediss://...` (feature `tls`), `unix:///path/to.sock`.
    pub fn builder<I, S>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedlockBuilder::new(urls)
    }

    pub(crate) fn from_parts(
        nodes: Vec<Arc<Node>>,
        cfg: RedlockBuilder,
        max_ttl: Arc<MaxTtl>,
    ) -> Self {
        Redlock {
            inner: Arc::new(Inner {
                nodes,
                cfg,
                max_ttl,
                tasks: TaskTracker::new(),
                parked: Mutex::new(VecDeque::new()),
                outage: AtomicBool::new(false),
            }),
        }
    }

    /// The configured number of nodes.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// The quorum: `nodes / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.inner.nodes.len())
    }

    /// The node addresses (passwords redacted), in configuration order.
    pub fn node_names(&self) -> Vec<String> {
        self.inner
            .nodes
            .iter()
            .map(|n| n.name().to_owned())
            .collect()
    }

    /// Waits until the work this client does in the background has finished: releases of failed,
    /// cancelled or dropped acquisitions, the unanswered part of a release, and calls still in
    /// flight after a won round. Each is bounded by the node timeout. Call it before a
    /// short-lived process exits, so its releases are not cut off.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only waits; the background work goes on.
    pub async fn flush(&self) {
        let parked: Vec<Tail> = lock(&self.inner.parked).drain(..).collect();
        let tasks = &self.inner.tasks;
        tasks.close();
        futures::join!(
            futures::future::join_all(parked.into_iter().map(Tail::drive)),
            tasks.wait()
        );
        tasks.reopen();
    }

    /// Makes sure a finished round's unanswered calls reach their nodes: a dropped call may be
    /// skipped by its connection. `close` (acquire and extend): calls still waiting for their
    /// connection give up instead of being sent late, where they could land after a later
    /// extension or the release. The rest are queued on their connections, in order before
    /// anything sent later; keeping their futures until the round's deadline is enough for
    /// redis-rs to write them, so they are parked (no task, no timer). A release's calls still
    /// waiting for a connection, or a full parking queue, get a task that drives them.
    fn settle(&self, tail: Tail, close: bool) {
        if close {
            tail.gate.close();
        }
        if tail.calls.is_empty() {
            return;
        }
        if tail.can_park() {
            let mut parked = lock(&self.inner.parked);
            let now = Instant::now();
            while parked.front().is_some_and(|t| t.deadline <= now) {
                parked.pop_front();
            }
            if parked.len() < MAX_PARKED {
                parked.push_back(tail);
                return;
            }
        }
        self.inner.tasks.spawn(tail.drive());
    }

    /// One attempt round, no retries: the lock, or why not at once.
    ///
    /// One exception: a round refused although no value can stand on a quorum (contenders that
    /// started at the same moment split the nodes between them, 2/2/1 of 5) is undone and
    /// re-tried after a short random pause, at most 6 times, so that one of them wins. Every
    /// acquisition does this, on top of its configured retries.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] (another owner: the refusals alone rule out a quorum),
    /// [`Error::NoQuorum`] (too few nodes reachable, each failure named, and each refusal when
    /// refusals and failures together ruled out a quorum), [`Error::ValidityExpired`] (the round
    /// took too long), or [`Error::InvalidArgument`] (empty key, ttl not above the drift
    /// allowance).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: if the future is dropped midway, a release of the attempt's value is sent to
    /// every node in the background (when a tokio runtime is still running), after the acquire
    /// on each node's connection. Whatever is missed expires with the ttl.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        let patience = Patience {
            rounds: 1,
            wait: Duration::ZERO,
        };
        self.acquire_with(key, ttl, patience).await
    }

    /// Acquires with the configured retries: up to `1 + retry_count` rounds, a random pause
    /// (`retry_delay + uniform(0, jitter)`) between them.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), from the last round.
    ///
    /// # Cancellation safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_timeout(key, ttl, Duration::ZERO).await
    }

    /// As [`acquire`](Self::acquire), and keeps trying (rounds separated by the configured random
    /// pause) until `wait` has passed since the call, then gives up with the last round's error.
    /// It always makes at least the rounds [`acquire`](Self::acquire) makes, so `wait = 0` is
    /// `acquire`. No round starts after `wait` (rounds resolving contention excepted, see
    /// [`try_acquire`](Self::try_acquire)); the last one may end up to one node timeout later.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), from the last round.
    ///
    /// # Cancellation safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_timeout(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let patience = Patience {
            rounds: self.inner.cfg.retry_count.saturating_add(1),
            wait,
        };
        self.acquire_with(key, ttl, patience).await
    }

    async fn acquire_with(
        &self,
        key: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<Lock, Error> {
        let drift = self.check(key, ttl)?;
        self.inner.max_ttl.observe(ttl);
        let called = Instant::now();
        let lock_key = scripts::lock_key(key);
        let fence_key = scripts::fence_key(key);
        let mut round_no = 0u32;
        let mut contention_rounds = 0u32;
        loop {
            round_no += 1;
            let value = new_value();
            // Armed before the first await: a cancelled or failed round is released everywhere.
            let undo = UndoRelease::arm(self, &lock_key, &fence_key, &value);
            let mut contended = false;
            let round_start = Instant::now();
            let result = self
                .attempt(
                    key,
                    &lock_key,
                    &fence_key,
                    &value,
                    ttl,
                    drift,
                    &mut contended,
                )
                .await;
            let err = match result {
                Ok((token, measured, validity, tail)) => {
                    undo.disarm();
                    metrics::acquire("acquired", called.elapsed());
                    let state = Arc::new(LockState::new(
                        key.to_owned(),
                        lock_key,
                        fence_key,
                        value,
                        token,
                        ttl,
                        measured.saturating_add(validity),
                    ));
                    self.settle(tail, true);
                    return Ok(Lock::new(self.clone(), state));
                }
                Err(e) => e,
            };
            if contended && contention_rounds < CONTENTION_ROUNDS {
                contention_rounds += 1;
                round_no -= 1;
                // Nobody won: undo our part before anyone re-tries (awaited, so it has landed
                // by the time our own pause starts), then pause at random for several round
                // trips, so that one contender re-tries alone and finds the nodes free.
                let round_trip = round_start.elapsed();
                self.release_everywhere(&lock_key, &fence_key, &value, 0)
                    .await;
                undo.disarm();
                let spread = self.inner.cfg.retry_jitter.max(round_trip * 4);
                let delay = quorum::retry_delay(round_trip, spread, rand::random::<f64>());
                tracing::debug!(
                    key,
                    round = contention_rounds,
                    ?delay,
                    "contenders split the nodes; undone, re-trying"
                );
                tokio::time::sleep(delay).await;
                continue;
            }
            drop(undo);
            let delay = quorum::retry_delay(
                self.inner.cfg.retry_delay,
                self.inner.cfg.retry_jitter,
                rand::random::<f64>(),
            );
            let give_up = !err.is_retryable()
                || (round_no >= patience.rounds
                    && called.elapsed().saturating_add(delay) > patience.wait);
            if give_up {
                metrics::acquire(outcome_label(&err), called.elapsed());
                return Err(err);
            }
            tracing::debug!(key, round = round_no, ?delay, error = %err, "retrying acquisition");
            tokio::time::sleep(delay).await;
        }
    }

    fn check(&self, key: &str, ttl: Duration) -> Result<Duration, Error> {
        if key.is_empty() {
            return Err(ArgumentError::InvalidKey {
                key: key.to_owned(),
                reason: "it is empty",
            }
            .into());
        }
        if key.starts_with('}') {
            return Err(ArgumentError::InvalidKey {
                key: key.to_owned(),
                reason: "it starts with '}', which breaks the hash tag shared with its fencing counter",
            }
            .into());
        }
        if ttl > RedlockBuilder::MAX_TTL {
            return Err(ArgumentError::TtlTooLong(ttl).into());
        }
        let drift = quorum::drift(ttl, self.inner.cfg.drift_factor);
        if ttl <= drift || ttl.as_millis() == 0 {
            return Err(ArgumentError::TtlTooShort { ttl, drift }.into());
        }
        Ok(drift)
    }

    /// One attempt round: the acquire script on every node, then (rarely) a raise of the fencing
    /// counters. Returns the token, the instant its validity counts from (the end of the round, on
    /// the deadline clock) and the validity.
    /// `contended` is set when the round was refused but no value can stand on a quorum
    /// (contenders split the nodes).
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        key: &str,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        ttl: Duration,
        drift: Duration,
        contended: &mut bool,
    ) -> Result<(FencingToken, Stamp, Duration, Tail), Error> {
        metrics::attempt();
        let start = Instant::now();
        let started = clock::now();
        // The nodes are told whole milliseconds: the validity counts only what they were told.
        let (ttl_ms, sent) = quorum::sent_ttl(ttl);
        let budget_end = start + quorum::budget(sent, drift);
        let deadline = (start + self.inner.cfg.node_timeout).min(budget_end);
        let ttl_ms = ttl_ms.to_string();
        let fencing = self.inner.cfg.fencing;
        let call = if fencing {
            scripts::ACQUIRE.call(
                &[lock_key.as_bytes(), fence_key.as_bytes()],
                &[value.as_bytes(), ttl_ms.as_bytes()],
            )
        } else {
            let mut set = redis::cmd("SET");
            set.arg(lock_key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(&ttl_ms);
            ScriptCall::plain(set)
        };
        let round = self
            .round(
                Arc::new(call),
                deadline,
                None,
                HoldOut::Respect,
                "acquire",
                positive,
            )
            .await;

        match round.verdict {
            Verdict::Quorum => {}
            Verdict::Refused => {
                *contended = round.refusal() == Refusal::Contended;
                tracing::debug!(
                    key,
                    yes = round.tally.yes(),
                    refused = round.tally.no(),
                    held = round.held_by_other(),
                    failed = round.tally.failed(),
                    contended = *contended,
                    "lock held by another owner"
                );
                return Err(self.held(key, round.held_by_other()));
            }
            Verdict::Unreachable => {
                let failures = FailureList(&round.failures);
                if self.inner.outage.swap(true, Ordering::Relaxed) {
                    tracing::debug!(key, yes = round.tally.yes(), no = round.tally.no(), failed = round.tally.failed(), %failures, "too few nodes reachable to acquire");
                } else {
                    tracing::warn!(key, yes = round.tally.yes(), no = round.tally.no(), failed = round.tally.failed(), %failures, "too few nodes reachable to acquire; further failed rounds are logged at debug level until a quorum answers again");
                }
                return Err(self.no_quorum(key, &round.tally, round.failures));
            }
        }
        if self.inner.outage.swap(false, Ordering::Relaxed) {
            tracing::info!(key, "a quorum of nodes answers again");
        }
        let counters: Vec<u64> = if fencing {
            round.yes.iter().map(|&(_, c)| c.max(0) as u64).collect()
        } else {
            vec![0; round.yes.len()]
        };
        let Some((max, settled)) = quorum::fencing_max(&counters, self.inner.nodes.len()) else {
            return Err(self.no_quorum(key, &round.tally, round.failures));
        };
        if !settled {
            self.raise_fence(key, lock_key, fence_key, value, max, &round.yes, budget_end)
                .await?;
        }
        let now = clock::now();
        let elapsed = now.saturating_duration_since(started);
        match quorum::validity(sent, elapsed, drift) {
            Some(validity) => {
                tracing::debug!(
                    key,
                    token = max,
                    yes = round.tally.yes(),
                    no = round.tally.no(),
                    failed = round.tally.failed(),
                    ?elapsed,
                    ?validity,
                    "lock acquired"
                );
                // Validity counts from now, the end of the round: the deadline is
                // `start + ttl − drift` (counted from the start, elapsed would count twice).
                Ok((FencingToken::new(max), now, validity, round.rest))
            }
            None => {
                tracing::warn!(key, ?elapsed, ?ttl, "quorum reached but no validity left");
                Err(Error::ValidityExpired {
                    key: key.to_owned(),
                    elapsed,
                    ttl,
                })
            }
        }
    }

    /// Brings the counters of the yes-nodes below `max` up to it, so that a quorum stands at the
    /// token (only after different majorities won earlier rounds).
    #[allow(clippy::too_many_arguments)]
    async fn raise_fence(
        &self,
        key: &str,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        max: u64,
        yes: &[(usize, i64)],
        budget_end: Instant,
    ) -> Result<(), Error> {
        let token = max.to_string();
        let call = Arc::new(scripts::RAISE_FENCE.call(
            &[lock_key.as_bytes(), fence_key.as_bytes()],
            &[value.as_bytes(), token.as_bytes()],
        ));
        let deadline = (Instant::now() + self.inner.cfg.node_timeout).min(budget_end);
        let at_max = yes.iter().filter(|&&(_, c)| c.max(0) as u64 == max).count();
        let raises = yes
            .iter()
            .filter(|&&(_, c)| (c.max(0) as u64) < max)
            .map(|&(i, _)| {
                let fut = Arc::clone(&self.inner.nodes[i]).run(
                    Arc::clone(&call),
                    deadline,
                    HoldOut::Respect,
                    "raise",
                );
                async move { (i, fut.await) }
            });
        let mut raised = 0;
        let mut failures = Vec::new();
        for (i, r) in futures::future::join_all(raises).await {
            match r.and_then(int_reply) {
                Ok(1) => raised += 1,
                Ok(_) => {}
                Err(cause) => failures.push(NodeFailure {
                    node: self.inner.nodes[i].name().to_owned(),
                    cause,
                }),
            }
        }
        tracing::debug!(key, token = max, at_max, raised, "raised fencing counters");
        if at_max + raised >= self.quorum() {
            Ok(())
        } else {
            tracing::warn!(
                key,
                token = max,
                at_max,
                raised,
                "could not bring a quorum to the fencing token"
            );
            Err(Error::NoQuorum {
                key: key.to_owned(),
                reached: at_max + raised,
                nodes: self.node_count(),
                needed: self.quorum(),
                failures,
            })
        }
    }

    /// Sends `call` to every node at once, each bounded by `deadline`, and returns as soon as the
    /// verdict is certain. Unanswered calls are handed back in `rest`. With `closes_at`, no
    /// call of the round is sent (nor re-sent as `EVAL`) from that time on the deadline clock.
    async fn round(
        &self,
        call: Arc<ScriptCall>,
        deadline: Instant,
        closes_at: Option<Stamp>,
        hold_out: HoldOut,
        op: &'static str,
        yes: fn(i64) -> bool,
    ) -> Round {
        self.schedule_repairs();
        let round = self
            .fan_out(call, deadline, closes_at, hold_out, op, yes)
            .await;
        // A connection made during the round may have revealed a restart.
        self.schedule_repairs();
        round
    }

    /// `yes` tells which integer replies count as a yes; every other reply is a refusal.
    async fn fan_out(
        &self,
        call: Arc<ScriptCall>,
        deadline: Instant,
        closes_at: Option<Stamp>,
        hold_out: HoldOut,
        op: &'static str,
        yes: fn(i64) -> bool,
    ) -> Round {
        let n = self.inner.nodes.len();
        let start = Instant::now();
        let gate = RoundGate::new(n, closes_at);
        let mut rest: FuturesUnordered<NodeFuture> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let fut =
                    Arc::clone(node).call(Arc::clone(&call), hold_out, op, Some((gate.clone(), i)));
                Box::pin(async move { (i, fut.await) }) as NodeFuture
            })
            .collect();
        let mut tally = Tally::new(n);
        let mut yeses = Vec::with_capacity(n);
        let mut refusals = Vec::new();
        let mut failures = Vec::new();
        let mut answered = vec![false; n];
        // An acquisition refused by a quorum also waits until it is known whether that was
        // contention (see `quorum::refusal`); nothing else does.
        let classify = op == "acquire";
        let decided = tokio::time::timeout_at(deadline, async {
            while let Some((i, reply)) = rest.next().await {
                answered[i] = true;
                // The acquire script refuses with the value that holds the key.
                let reply = match reply {
                    Ok(Value::BulkString(holder)) => {
                        refusals.push(Some(holder));
                        Ok(None)
                    }
                    other => other.and_then(int_reply).map(Some),
                };
                match reply {
                    Ok(Some(v)) if yes(v) => {
                        tally.record(Answer::Yes);
                        yeses.push((i, v));
                    }
                    Ok(refused) => {
                        if refused.is_some() {
                            refusals.push(None);
                        }
                        tally.record(Answer::No);
                        failures.push(NodeFailure {
                            node: self.inner.nodes[i].name().to_owned(),
                            cause: NodeError::HeldByAnother,
                        });
                    }
                    Err(cause) => {
                        tally.record(Answer::Failed);
                        failures.push(NodeFailure {
                            node: self.inner.nodes[i].name().to_owned(),
                            cause,
                        });
                    }
                }
                if let Some(verdict) = tally.verdict() {
                    let undecided = classify
                        && verdict == Verdict::Refused
                        && quorum::refusal_of(n, &refusals, tally.failed(), tally.pending())
                            == Refusal::Undecided;
                    if !undecided {
                        return verdict;
                    }
                }
            }
            tally.final_verdict()
        })
        .await;
        // Without a verdict by the deadline, every pending node is recorded as timed out.
        let timed_out = decided.is_err();
        let verdict = decided.unwrap_or_else(|_| {
            // One timer for the round: whoever has not answered by the deadline failed.
            let waited = deadline.saturating_duration_since(start);
            for (i, node) in self.inner.nodes.iter().enumerate() {
                if !answered[i] {
                    let cause = NodeError::Timeout(waited);
                    node.timed_out(op, &cause);
                    tally.record(Answer::Failed);
                    failures.push(NodeFailure {
                        node: node.name().to_owned(),
                        cause,
                    });
                }
            }
            tally.final_verdict()
        });
        for (i, node) in self.inner.nodes.iter().enumerate() {
            if !answered[i] && !timed_out {
                // Still pending when the outcome was certain: invisible in latency figures
                // otherwise (a node always slower than the quorum).
                metrics::node_abandoned(node.name(), op);
                // A failed round names every node that counts toward no quorum, not just those
                // that had answered: a user who just (re)started a cluster sees them all.
                if verdict != Verdict::Quorum
                    && let Some(cause) = node.held_out()
                {
                    failures.push(NodeFailure {
                        node: node.name().to_owned(),
                        cause,
                    });
                }
            }
        }
        Round {
            verdict,
            tally,
            yes: yeses,
            refusals,
            failures,
            rest: Tail {
                calls: rest,
                answered,
                gate,
                deadline,
            },
        }
    }

    /// Extends a held lock to `ttl` from now on a quorum; returns the new validity.
    ///
    /// Rounds of one lock are serialised with its release: no extension is sent once the
    /// release has begun, so none can re-set a key the release removed.
    ///
    /// The round ends at the lock's deadline at the latest, and its gate closes then: no call
    /// is sent (or re-sent as `EVAL`) after the deadline, and a quorum that has not answered by
    /// then makes the lock lost (`Expired`), never extended. A holder told `Ok` held the lock
    /// without a gap. (Calls sent before the deadline may still land later; the EXTEND script
    /// refuses to re-create a key that someone else may have held since: `scripts::EXTEND`.)
    pub(crate) async fn extend_state(
        &self,
        state: &Arc<LockState>,
        ttl: Duration,
    ) -> Result<Duration, Error> {
        let drift = self.check(state.key(), ttl)?;
        let _serial = state.serial().await;
        if state.is_released() {
            return Err(Error::Lost {
                key: state.key().to_owned(),
                reason: LostReason::Released,
            });
        }
        if state.deadline() <= clock::now() {
            return Err(state.lose(LostReason::Expired));
        }
        self.inner.max_ttl.observe(ttl);
        let start = Instant::now();
        let started = clock::now();
        // The nodes are told whole milliseconds: the validity counts only what they were told.
        let (ttl_ms, sent) = quorum::sent_ttl(ttl);
        let budget = quorum::budget(sent, drift);
        // Whatever this round's outcome, a node that applies it expires the key `ttl` after
        // receiving it, no earlier than `budget` after `started`: a shorter ttl than what is
        // left moves the deadline back now, before anything is sent.
        state.lower_deadline(started.saturating_add(budget));
        let lock_deadline = state.deadline();
        let length = quorum::extend_round(
            self.inner.cfg.node_timeout,
            budget,
            lock_deadline.saturating_duration_since(started),
        );
        let deadline = start + length;
        let ttl_ms = ttl_ms.to_string();
        let token = state.token().get().to_string();
        let call = scripts::EXTEND.call(
            &[state.lock_key().as_bytes(), state.fence_key().as_bytes()],
            &[
                state.value().as_bytes(),
                ttl_ms.as_bytes(),
                token.as_bytes(),
            ],
        );
        let round = self
            .round(
                Arc::new(call),
                deadline,
                Some(lock_deadline),
                HoldOut::Respect,
                "extend",
                positive,
            )
            .await;
        let decided = clock::now();
        // The calls already queued must reach their nodes: dropped, a queued command may be
        // skipped, and a node would keep its old expiry (a later one, for a shorter ttl). Calls
        // still waiting for a connection are not sent at all: sent late, after the release,
        // one could re-set the key.
        self.settle(round.rest, true);
        let key = state.key();
        let elapsed = decided.saturating_duration_since(started);
        let validity = quorum::validity(sent, elapsed, drift);
        match quorum::extension(round.verdict, decided < lock_deadline, validity) {
            quorum::Extension::Extended(validity) => {
                // Validity counts from the verdict, the end of the round (`start + ttl − drift`).
                if !state.set_deadline(decided.saturating_add(validity)) {
                    // Lost meanwhile (the deadline passed since the verdict, or a watcher saw
                    // the lock lost): it stays lost.
                    return Err(Error::Lost {
                        key: key.to_owned(),
                        reason: state.reason().unwrap_or(LostReason::Expired),
                    });
                }
                state.set_ttl(ttl);
                tracing::debug!(key, ?validity, yes = round.tally.yes(), "lock extended");
                Ok(validity)
            }
            quorum::Extension::TooSlow => Err(Error::ValidityExpired {
                key: key.to_owned(),
                elapsed,
                ttl,
            }),
            // Only when the refusals alone rule out a quorum: refusals mixed with failures leave
            // a valid lock held (the caller, or keep-alive, tries again while validity remains).
            quorum::Extension::NotOwner => {
                let reason = LostReason::NotOwner {
                    owned: round.tally.yes(),
                    needed: self.quorum(),
                };
                Err(state.lose(reason))
            }
            quorum::Extension::Expired => {
                tracing::warn!(
                    key,
                    yes = round.tally.yes(),
                    "lock lost: its deadline passed before an extension reached a quorum"
                );
                Err(state.lose(LostReason::Expired))
            }
            quorum::Extension::Unreachable => {
                // The keep-alive task warns once per outage (lease.rs).
                tracing::debug!(key, failures = %FailureList(&round.failures), "extension could not reach a quorum");
                Err(self.no_quorum(key, &round.tally, round.failures))
            }
        }
    }

    /// Releases a held lock on every node; returns once a quorum has answered (the remaining
    /// releases finish in the background). Waits for an extension round in flight, so that no
    /// extension can follow the release on any node.
    pub(crate) async fn release_state(&self, state: &LockState) -> Result<(), Error> {
        let _serial = state.serial().await;
        let expired = state.deadline() <= clock::now();
        // Lost before the release (its signal fired): that is what the release reports.
        let lost = state.reason();
        let token = state.token().get().to_string();
        let call = scripts::RELEASE.call(
            &[state.lock_key().as_bytes(), state.fence_key().as_bytes()],
            &[state.value().as_bytes(), token.as_bytes()],
        );
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        // Deleted (1) or absent (0) both leave nothing of ours; only another owner's value
        // (-1) is a refusal.
        let round = self
            .round(
                Arc::new(call),
                deadline,
                None,
                HoldOut::Ignore,
                "release",
                |v| v >= 0,
            )
            .await;
        // The unanswered releases must reach their nodes: dropped, a queued command may be
        // skipped by its connection, and the key would outlive the release by up to a ttl.
        self.settle(round.rest, false);
        let key = state.key();
        match round.verdict {
            Verdict::Refused => {
                let reason = LostReason::NotOwner {
                    owned: round.yes.iter().filter(|&&(_, v)| v == 1).count(),
                    needed: self.quorum(),
                };
                tracing::debug!(key, %reason, "released a lock that was already lost");
                Err(state.lose(reason))
            }
            // The lost signal had fired: that is what the release reports, whether or not a
            // quorum answered it (the docs promise `Lost` after `lost()`, not `NoQuorum`).
            _ if lost.is_some() => {
                let reason = lost.unwrap_or(LostReason::Expired);
                tracing::debug!(key, %reason, released = round.tally.yes(), "released a lock already lost");
                Err(Error::Lost {
                    key: key.to_owned(),
                    reason,
                })
            }
            // Released where it was still ours, but the holder outlived its validity: the work
            // done under it may have overlapped with another holder's.
            Verdict::Quorum | Verdict::Unreachable if expired => {
                Err(state.lose(LostReason::Expired))
            }
            Verdict::Quorum => {
                tracing::debug!(key, released = round.tally.yes(), "lock released");
                Ok(())
            }
            Verdict::Unreachable => Err(self.no_quorum(key, &round.tally, round.failures)),
        }
    }

    /// Releases a held lock in the background (a dropped guard), after any extension round in
    /// flight.
    pub(crate) fn spawn_release_held(&self, state: Arc<LockState>) {
        let client = self.clone();
        let key = state.lock_key().to_owned();
        self.spawn_release_task(&key, async move {
            let _serial = state.serial().await;
            client
                .release_everywhere(
                    state.lock_key(),
                    state.fence_key(),
                    state.value(),
                    state.token().get(),
                )
                .await;
        });
    }

    /// Sends a release of `value` to every node in the background (failed rounds, cancelled
    /// acquisitions).
    pub(crate) fn spawn_release(&self, lock_key: &str, fence_key: &str, value: &str, token: u64) {
        let release = self.release_everywhere(lock_key, fence_key, value, token);
        self.spawn_release_task(lock_key, release);
    }

    /// Runs a background release on the current tokio runtime; without one, the ttl cleans up.
    fn spawn_release_task(
        &self,
        lock_key: &str,
        release: impl Future<Output = ()> + Send + 'static,
    ) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(
                lock_key,
                "no runtime to release in; the ttl will expire the key"
            );
            return;
        };
        self.inner.tasks.spawn_on(release, &handle);
    }

    /// A release of `value` on every node, each bounded by the node timeout from now. Built
    /// before it is awaited, so the caller's borrows end here.
    fn release_everywhere(
        &self,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        token: u64,
    ) -> impl Future<Output = ()> + Send + 'static {
        let token = token.to_string();
        let call = Arc::new(scripts::RELEASE.call(
            &[lock_key.as_bytes(), fence_key.as_bytes()],
            &[value.as_bytes(), token.as_bytes()],
        ));
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let calls: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .map(|n| Arc::clone(n).run(Arc::clone(&call), deadline, HoldOut::Ignore, "release"))
            .collect();
        calls.for_each(|_| async {})
    }

    /// Every node's view of `key`: value, remaining ttl and fencing counter. Waits for every node
    /// (each bounded by the node timeout).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an invalid key; node failures are reported per node.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<LockStatus, Error> {
        self.check(key, Duration::from_secs(1))?;
        let (lock_key, fence_key) = (scripts::lock_key(key), scripts::fence_key(key));
        let call =
            Arc::new(scripts::STATUS.call(&[lock_key.as_bytes(), fence_key.as_bytes()], &[]));
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let replies =
            futures::future::join_all(self.inner.nodes.iter().map(|n| {
                Arc::clone(n).run(Arc::clone(&call), deadline, HoldOut::Ignore, "status")
            }))
            .await;
        self.schedule_repairs();
        let nodes = self
            .inner
            .nodes
            .iter()
            .zip(replies)
            .map(|(n, r)| NodeStatus {
                node: n.name().to_owned(),
                state: match n.same_server() {
                    Some(twin) => Err(twin),
                    None => r.and_then(parse_status),
                },
                eviction: n.eviction(),
            })
            .collect();
        Ok(LockStatus {
            key: key.to_owned(),
            nodes,
            quorum: self.quorum(),
        })
    }

    fn held(&self, key: &str, held: usize) -> Error {
        Error::Held {
            key: key.to_owned(),
            held,
            nodes: self.node_count(),
            needed: self.quorum(),
        }
    }

    fn no_quorum(&self, key: &str, tally: &Tally, failures: Vec<NodeFailure>) -> Error {
        Error::NoQuorum {
            key: key.to_owned(),
            reached: tally.reached(),
            nodes: self.node_count(),
            needed: self.quorum(),
            failures,
        }
    }
}

/// Releases an attempt's value everywhere when dropped, unless disarmed: covers both a failed
/// round and a caller that drops the acquire future midway.
struct UndoRelease<'a> {
    client: &'a Redlock,
    lock_key: &'a str,
    fence_key: &'a str,
    value: &'a str,
    armed: bool,
}

impl<'a> UndoRelease<'a> {
    fn arm(client: &'a Redlock, lock_key: &'a str, fence_key: &'a str, value: &'a str) -> Self {
        UndoRelease {
            client,
            lock_key,
            fence_key,
            value,
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for UndoRelease<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client
                .spawn_release(self.lock_key, self.fence_key, self.value, 0);
        }
    }
}

/// A yes for acquire and extend: a counter (>= 1), `1` extended or `2` re-set.
fn positive(v: i64) -> bool {
    v > 0
}

/// A fresh 128-bit random owner value, as 32 hex digits.
fn new_value() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A script's integer reply; a plain `SET NX` answers `OK` (yes) or nil (held).
fn int_reply(v: Value) -> Result<i64, NodeError> {
    match v {
        Value::Int(i) => Ok(i),
        Value::Okay => Ok(1),
        Value::Nil => Ok(0),
        other => Err(NodeError::BadReply(format!("{other:?}"))),
    }
}

fn parse_status(v: Value) -> Result<KeyState, NodeError> {
    let bad = |v: &Value| NodeError::BadReply(format!("{v:?}"));
    let Value::Array(items) = &v else {
        return Err(bad(&v));
    };
    let [value, pttl, fence] = items.as_slice() else {
        return Err(bad(&v));
    };
    let value = match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Nil => None,
        _ => return Err(bad(&v)),
    };
    let (Value::Int(pttl), Value::Int(fence)) = (pttl, fence) else {
        return Err(bad(&v));
    };
    Ok(KeyState {
        value,
        ttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        fence: u64::try_from(*fence).unwrap_or(0),
    })
}

fn outcome_label(e: &Error) -> &'static str {
    match e {
        Error::Held { .. } => "held",
        Error::NoQuorum { .. } => "no_quorum",
        Error::ValidityExpired { .. } => "expired",
        _ => "error",
    }
}
