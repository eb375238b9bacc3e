//! The client engine: the nodes, the configuration as plain validated values ([`config`]), the
//! fan-out round that decides as soon as the outcome is certain ([`round`]), and the operations
//! built on it: acquisition ([`acquire`], one round's vote in [`vote`], its grant in [`grant`], with its waiting between rounds in [`waiter`]), extension ([`extend`]), release ([`release`]),
//! status ([`status`]) and the repair of restarted nodes ([`repair`]). A round's late answers
//! are [`tail`]. The state of a held lock is [`state`]; the public guard around it lives in
//! `crate::lock`.

pub(crate) mod acquire;
pub(crate) mod assemble;
pub(crate) mod check;
pub(crate) mod config;
mod extend;
mod grant;
pub(crate) mod inventory;
pub(crate) mod io_thread;
mod patience;
mod queue;
mod release;
mod repair;
pub(crate) mod revoke;
pub(crate) mod round;
pub(crate) mod side;
pub(crate) mod state;
pub(crate) mod status;
pub(crate) mod tail;
mod undo;
mod vote;
pub(crate) mod wait;
mod waiter;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use self::config::Config;
use crate::core::keys::check_key;
use crate::core::quorum::{self, Tally};
use crate::core::timing::{self, MAX_TTL};
use crate::error::{ArgumentError, Error, NodeFailure};
use crate::node::{MaxTtl, Node};

/// The engine behind the public [`Redlock`](crate::Redlock): its nodes, configuration,
/// background work and waiters, and every operation that fans out to the nodes. Cheap to
/// clone (one `Arc`).
#[derive(Clone, Debug)]
pub(crate) struct Engine {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) cfg: Config,
    pub(crate) max_ttl: Arc<MaxTtl>,
    /// Background releases and the unanswered part of releases and extensions, so `flush` can
    /// wait for them. (Repairs run on their own until done: see `repair.rs`.)
    pub(crate) tasks: TaskTracker,
    /// Held by a `flush` from the tracker's close to its reopening: flushes run one at a time
    /// (a reopening under another flush's wait left that one waiting for ever).
    flushing: tokio::sync::Mutex<()>,
    /// Finished rounds' unanswered calls, parked (`tail.rs`).
    pub(crate) parked: tail::Parked,
    /// Set by an acquisition round that could not reach a quorum for lack of answers, cleared
    /// by one that reached it: the client warns once per outage, not once per round.
    pub(crate) outage: AtomicBool,
    /// Release calls given up since the last `flush` (their node failed, or it was still
    /// answering this client's earlier calls when the key's own expiry came): what the next
    /// `flush` reports.
    undelivered: AtomicU64,
    /// Waiters for held locks and the subscriptions that wake them (`wait.rs`).
    pub(crate) waiting: wait::Waiting,
    /// The I/O thread, once started (`io_thread.rs`); dropped last, so the tasks above it stop
    /// before its runtime does.
    pub(crate) io_thread: io_thread::IoThreadSlot,
}

impl Engine {
    pub(crate) fn from_parts(nodes: Vec<Arc<Node>>, cfg: Config, max_ttl: Arc<MaxTtl>) -> Self {
        crate::metrics::describe();
        // Up until a call fails: the gauge moves on each change (`node/liveness.rs`).
        for node in &nodes {
            crate::metrics::node_up(node.name(), true);
        }
        Engine {
            inner: Arc::new(Inner {
                nodes,
                cfg,
                max_ttl,
                tasks: TaskTracker::new(),
                flushing: tokio::sync::Mutex::new(()),
                parked: tail::Parked::default(),
                outage: AtomicBool::new(false),
                undelivered: AtomicU64::new(0),
                waiting: wait::Waiting::default(),
                io_thread: io_thread::IoThreadSlot::default(),
            }),
        }
    }

    /// The engine side of [`Redlock::node_count`](crate::Redlock::node_count).
    pub(crate) fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// The engine side of [`Redlock::quorum`](crate::Redlock::quorum).
    pub(crate) fn quorum(&self) -> usize {
        quorum::quorum(self.inner.nodes.len())
    }

    /// The engine side of [`Redlock::owner`](crate::Redlock::owner).
    pub(crate) fn owner(&self) -> Option<&str> {
        self.inner.cfg.owner.as_deref()
    }

    /// The engine side of [`Redlock::node_names`](crate::Redlock::node_names).
    pub(crate) fn node_names(&self) -> Vec<String> {
        self.inner
            .nodes
            .iter()
            .map(|n| n.name().to_owned())
            .collect()
    }

    /// Whether acquisitions hand out fencing tokens
    /// ([`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing)): the election and run-once
    /// need them.
    pub(crate) fn fencing(&self) -> bool {
        self.inner.cfg.fencing
    }

    /// The configured retry count
    /// ([`RedlockBuilder::retry_count`](crate::RedlockBuilder::retry_count)).
    pub(crate) fn retry_count(&self) -> u32 {
        self.inner.cfg.retry_count
    }

    /// Whether this client has waiters queued for `lock_key` (`wait.rs`).
    pub(crate) fn has_waiters(&self, lock_key: &str) -> bool {
        self.inner.waiting.queued(lock_key).is_some()
    }

    /// The engine side of [`Redlock::flush`](crate::Redlock::flush): the release calls given
    /// up since the previous flush are in its report.
    pub(crate) async fn flush(&self) -> FlushReport {
        let _one_at_a_time = self.inner.flushing.lock().await;
        let parked = self.inner.parked.take_all();
        let tasks = &self.inner.tasks;
        tasks.close();
        futures::join!(
            futures::future::join_all(parked.into_iter().map(|tail| tail.drive(self.clone()))),
            tasks.wait()
        );
        tasks.reopen();
        FlushReport {
            undelivered: self.inner.undelivered.swap(0, Ordering::Relaxed),
        }
    }

    /// The `lock` label of a per-lock metric: the key, when the client opted in.
    pub(crate) fn metrics_lock<'k>(&self, key: &'k str) -> Option<&'k str> {
        self.inner.cfg.metrics_lock_label.then_some(key)
    }

    /// Counts a finished acquisition of `key` and its wait (`quorumlock_acquire_total`).
    pub(crate) fn count_acquire(&self, outcome: &'static str, wait: Duration, key: &str) {
        crate::metrics::acquire(outcome, wait, self.metrics_lock(key));
    }

    /// A held lock's shared state, its metrics labelled as this client's configuration says.
    pub(crate) fn held_state(&self, state: state::LockState) -> Arc<state::LockState> {
        Arc::new(state.metrics_labelled(self.inner.cfg.metrics_lock_label))
    }

    /// Where this client's keys live (prefix, compat mode).
    pub(crate) fn keys(&self) -> &crate::core::keys::KeyLayout {
        &self.inner.cfg.keys
    }

    /// Checks a key and a ttl before any round; returns the ttl's drift allowance.
    pub(crate) fn check(&self, key: &str, ttl: Duration) -> Result<Duration, Error> {
        check_key(key)?;
        if ttl > MAX_TTL {
            return Err(ArgumentError::TtlTooLong(ttl).into());
        }
        let drift = timing::drift(ttl, self.inner.cfg.drift_factor);
        let min = timing::min_ttl(self.inner.cfg.drift_factor);
        if ttl < min {
            return Err(ArgumentError::TtlTooShort { ttl, drift, min }.into());
        }
        Ok(drift)
    }

    /// The pause before another round, for every retry in the crate (acquisitions, extensions
    /// that could not reach a quorum, contending elections and run-once jobs): the first pause
    /// of [`retry_pause_after`](Self::retry_pause_after).
    pub(crate) fn retry_pause(&self) -> Duration {
        self.retry_pause_after(0)
    }

    /// The crate's one retry policy: the pause before retry number `attempt` (0-based) of a
    /// series, capped exponential with jitter (`core::timing::backoff`): the configured retry
    /// delay doubled per attempt up to 1 s (or the delay itself when longer), plus a uniform
    /// random part up to the configured jitter, so that competitors desynchronise.
    pub(crate) fn retry_pause_after(&self, attempt: u32) -> Duration {
        timing::backoff(
            self.inner.cfg.retry_delay,
            self.inner.cfg.retry_jitter,
            attempt,
            rand::random::<f64>(),
        )
    }

    pub(crate) fn held(&self, key: &str, held: usize) -> Error {
        Error::Held {
            key: key.to_owned(),
            held,
            nodes: self.node_count(),
            needed: self.quorum(),
        }
    }

    /// [`Error::NoQuorum`], or [`Error::PermissionDenied`] when ACL refusals alone rule out a
    /// quorum.
    pub(crate) fn no_quorum(&self, key: &str, tally: &Tally, failures: Vec<NodeFailure>) -> Error {
        Error::no_quorum(
            key,
            tally.reached(),
            self.node_count(),
            self.quorum(),
            failures,
        )
    }
}

/// What [`Redlock::flush`](crate::Redlock::flush) could not do: the release calls it gave up
/// since the previous flush. Each was to a node that failed or answered nothing for a whole
/// node timeout (or was still answering this client's earlier calls when the key had expired
/// on its own); the key it was to delete there expires with its ttl.
///
/// ```
/// # async fn run(locks: quorumlock::Redlock) {
/// let report = locks.flush().await;
/// println!("{report}"); // "every release delivered", or how many were not
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushReport {
    undelivered: u64,
}

impl FlushReport {
    /// How many release calls (one per lock and node) were given up since the previous flush.
    pub fn undelivered(&self) -> u64 {
        self.undelivered
    }

    /// True when every release call was delivered.
    pub fn is_complete(&self) -> bool {
        self.undelivered == 0
    }
}

impl std::fmt::Display for FlushReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.undelivered == 0 {
            f.write_str("every release delivered")
        } else {
            write!(
                f,
                "{} release calls not delivered (their nodes failed or did not answer); those keys expire with their ttl",
                self.undelivered
            )
        }
    }
}

/// The metrics label of a failed acquisition (`quorumlock_acquire_total`'s `outcome`), also the
/// `outcome` of a failed operation's span (see [`span_outcome`]).
pub(crate) fn outcome_label(e: &Error) -> &'static str {
    match e {
        Error::Held { .. } => "held",
        Error::NoQuorum { .. } => "no_quorum",
        Error::ValidityExpired { .. } => "expired",
        Error::PermissionDenied { .. } => "denied",
        Error::Overloaded { .. } => "overloaded",
        _ => "error",
    }
}

/// The `outcome` a failed operation records on its span: the metrics label
/// ([`outcome_label`]), with the two words metrics never see for an acquisition, `lost` and
/// `invalid` (a key or ttl refused before any round).
pub(crate) fn span_outcome(e: &Error) -> &'static str {
    match e {
        Error::Lost { .. } => "lost",
        Error::InvalidArgument(_) => "invalid",
        _ => outcome_label(e),
    }
}

/// A duration as a span field: whole milliseconds (saturating), a number rather than a
/// formatted string.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Records an operation's `outcome` on its span: the word [`finish`](Self::finish) is given,
/// or `cancelled` when the operation's future is dropped before it ends. The span stays open
/// while this holds it, so the word lands before it closes.
#[derive(Debug)]
pub(crate) struct SpanOutcome {
    span: tracing::Span,
    done: bool,
}

impl SpanOutcome {
    pub(crate) fn new(span: &tracing::Span) -> Self {
        SpanOutcome {
            span: span.clone(),
            done: false,
        }
    }

    /// Records `ok` for an `Ok` result, the error's [`span_outcome`] otherwise.
    pub(crate) fn finish<T>(self, result: &Result<T, Error>, ok: &'static str) {
        self.word(match result {
            Ok(_) => ok,
            Err(e) => span_outcome(e),
        });
    }

    /// Records `word` as the outcome.
    pub(crate) fn word(mut self, word: &'static str) {
        self.done = true;
        self.span.record("outcome", word);
    }
}

impl Drop for SpanOutcome {
    fn drop(&mut self) {
        if !self.done {
            self.span.record("outcome", "cancelled");
        }
    }
}
