//! Run-once scheduling: every instance of a service calls [`RunOnce::run`] for the same named
//! tick; one of them runs the job, the others skip quietly.
//!
//! The job's lock (key `quorumlock:{JOB}`) is taken without waiting for a running job: if
//! another instance holds it, this one skips ("another instance is running", logged at debug).
//! When too few nodes are reachable every instance skips, logged at warn: no job runs until a
//! quorum is back (graceful degradation, never "run anyway"). The lock is kept alive while the
//! job runs, and the job gets the fencing token and the lost signal.
//!
//! A tick marker (`quorumlock:{JOB}:tick:<T>`, with its own expiry, holding `"<token>
//! <instance id>"`) is written on a quorum after the job finished and before the lock is
//! released; an instance that takes the lock later for the same tick finds the marker (read
//! from every node, so it meets the quorum written) and skips. A job whose lock was lost leaves
//! no marker, so a later instance may run that tick again. Markers travel on the lock's own
//! connection to each node, and count like lock votes: a node that counts toward no quorum (a
//! restarted node within its hold-out, a second URL of one server, a node that may evict keys
//! under the strict guard) neither confirms nor denies a marker. A marker's absence needs a
//! quorum of answers from nodes this client has not seen lose their data (a restart or failover
//! without proof the data survived) within the marker's expiry: such a node's counters are
//! repaired, its markers are not (`docs/safety.md`, "Run-once markers across restarts").
//!
//! # A job that fails: the run policy
//!
//! A job run with [`RunOnce::try_run`] returns a `Result`. What an `Err` means for the tick is
//! the builder's [`RunPolicy`]:
//!
//! - [`RunPolicy::AtMostOnce`] (the default): the tick is marked done whatever the job
//!   returned. No instance runs it again, so a job that failed halfway is never repeated.
//! - [`RunPolicy::RetryOnFailure`]: an `Err` leaves no marker, so the next instance that calls
//!   for the same tick runs it again. For jobs that are safe to repeat.
//!
//! [`RunOnce::run`] never looks at what its job returned: the tick is done once the job
//! returns (at most once, whatever the policy).
//!
//! A job that finishes at the moment its lock is lost (its future completed, but the lock's
//! lost signal fired or its validity ran out by the time the helper looks) keeps its output:
//! the outcome is [`Outcome::Lost`] with `output: Some(..)`, because the end of its run was not
//! covered by the lock (another instance may have started the tick meanwhile), and no marker is
//! written.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use tracing::Instrument;
use tracing::field::Empty;

use crate::client::{Redlock, SpanOutcome, millis, span_outcome};
use crate::core::quorum;
use crate::core::token::FencingToken;
use crate::error::{ConfigError, Error, FailureList, LostReason, NodeError, NodeFailure, Setting};
use crate::lock::guard::Lock;
use crate::node::HoldOut;
use crate::node::commands;

mod outcome;
mod tick;

pub use outcome::{Outcome, RanBy, SkipReason, TickContext};
pub use tick::{Tick, tick_of};

/// A job that runs at most once per tick across all instances.
///
/// A job that can fail runs with [`try_run`](Self::try_run); the builder's [`RunPolicy`] says
/// whether its failure marks the tick done ([`RunPolicy::AtMostOnce`], the default) or leaves
/// it to the next instance ([`RunPolicy::RetryOnFailure`]).
///
/// ```no_run
/// use std::time::{Duration, SystemTime};
/// use quorumlock::{Outcome, Redlock, RunOnce, Tick};
///
/// # async fn run(locks: Redlock) -> Result<(), quorumlock::Error> {
/// let job = RunOnce::builder(locks, "refresh-repositories")
///     .ttl(Duration::from_secs(30))
///     .marker_ttl(Duration::from_secs(3600))
///     .build()?;
/// let mut every = tokio::time::interval(Duration::from_secs(600));
/// loop {
///     every.tick().await;
///     let tick = Tick::of(SystemTime::now(), Duration::from_secs(600));
///     match job.run(tick, |ctx| async move {
///         // enqueue the work, stamping it with ctx.token(); stop if ctx.lost() fires
///         ctx.token()
///     }).await? {
///         Outcome::Ran { token, .. } => tracing::info!(%token, "refreshed"),
///         Outcome::Skipped { reason, .. } => tracing::debug!(%reason, "skipped"),
///         Outcome::Lost { reason, .. } => tracing::warn!(%reason, "lost the job's lock"),
///         _ => {}
///     }
/// #   break;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RunOnce {
    locks: Redlock,
    job: String,
    ttl: Duration,
    marker_ttl: Option<Duration>,
    instance: String,
    policy: RunPolicy,
    clock_skew: Duration,
}

impl fmt::Debug for RunOnce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOnce")
            .field("job", &self.job)
            .field("ttl", &self.ttl)
            .field("marker_ttl", &self.marker_ttl)
            .field("instance", &self.instance)
            .field("policy", &self.policy)
            .field("clock_skew", &self.clock_skew)
            .finish()
    }
}

/// What a job's failure ([`RunOnce::try_run`] returning `Err`) means for its tick, set with
/// [`RunOnceBuilder::policy`]. [`RunOnce::run`] never looks at its job's output: for it the
/// tick is done once the job returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RunPolicy {
    /// The tick is marked done whatever the job returned: no instance runs it again. The
    /// default: the library cannot know whether a job that failed halfway is safe to repeat,
    /// and repeating one that is not (mail sent, a payment made) is worse than a missed tick,
    /// which the job's own monitoring sees.
    #[default]
    AtMostOnce,
    /// A job that returned `Err` leaves no marker: the next instance that calls for the same
    /// tick (before the next tick makes it moot) runs it again. For idempotent jobs.
    RetryOnFailure,
}

/// Configures a [`RunOnce`]. Obtained from [`RunOnce::builder`].
///
/// # Defaults
///
/// | setting | default |
/// | --- | --- |
/// | lock ttl | [`DEFAULT_TTL`](Self::DEFAULT_TTL) (30 s), extended every ttl / 3 while the job runs |
/// | tick marker expiry | [`DEFAULT_MARKER_TTL`](Self::DEFAULT_MARKER_TTL) (1 h) |
/// | instance id (stored in markers) | `"<pid>-<4 random hex digits>"` |
/// | what a failed job means | [`RunPolicy::AtMostOnce`]: the tick is done |
/// | clock skew between instances | [`DEFAULT_CLOCK_SKEW`](Self::DEFAULT_CLOCK_SKEW) (1 s) |
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build() is called"]
pub struct RunOnceBuilder {
    locks: Redlock,
    job: String,
    ttl: Duration,
    marker_ttl: Option<Duration>,
    instance: Option<String>,
    policy: RunPolicy,
    clock_skew: Duration,
}

impl RunOnceBuilder {
    /// The default ttl of the job's lock.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// The default expiry of a tick marker.
    pub const DEFAULT_MARKER_TTL: Duration = Duration::from_secs(3600);
    /// The default for how far apart the instances' clocks may be.
    pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);

    /// How far apart the instances' wall clocks may be (default 1 s). A tick whose start is
    /// known ([`Tick::of`], [`Tick::starting`]) counts the answers of a node this client saw
    /// lose its data when the tick began more than this after the loss was seen: an instance
    /// whose clock runs ahead by this much began the tick (and wrote its marker) that much
    /// earlier.
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }

    /// The ttl of the job's lock (extended while the job runs): how long a crashed instance's
    /// run blocks the job.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a tick stays marked as done. Make it longer than the latest an instance may
    /// start a tick (at least the tick period).
    pub fn marker_ttl(mut self, ttl: Duration) -> Self {
        self.marker_ttl = Some(ttl);
        self
    }

    /// No tick markers: only the lock keeps instances apart, so an instance that arrives after
    /// the job finished runs it again for the same tick.
    pub fn without_marker(mut self) -> Self {
        self.marker_ttl = None;
        self
    }

    /// This instance's id, stored in the markers it writes (for operators).
    pub fn instance(mut self, id: impl Into<String>) -> Self {
        self.instance = Some(id.into());
        self
    }

    /// What a job that fails ([`RunOnce::try_run`] returning `Err`) means for its tick: done
    /// ([`RunPolicy::AtMostOnce`], the default) or to be run again by the next instance
    /// ([`RunPolicy::RetryOnFailure`]).
    pub fn policy(mut self, policy: RunPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Builds the helper. No connection is made.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroDuration`] for a zero marker expiry,
    /// [`ConfigError::FencingRequired`] for a lock client with fencing off (runs are told
    /// apart by their tokens). An invalid job name or ttl is reported by the first
    /// [`run`](RunOnce::run) as [`Error::InvalidArgument`].
    pub fn build(self) -> Result<RunOnce, ConfigError> {
        if self.marker_ttl.is_some_and(|t| t.as_millis() == 0) {
            return Err(ConfigError::ZeroDuration(Setting::TickMarkerTtl));
        }
        if !self.locks.fencing() {
            return Err(ConfigError::FencingRequired);
        }
        Ok(RunOnce {
            instance: self
                .instance
                .unwrap_or_else(|| format!("{}-{:04x}", std::process::id(), rand::random::<u16>())),
            locks: self.locks,
            job: self.job,
            ttl: self.ttl,
            marker_ttl: self.marker_ttl,
            policy: self.policy,
            clock_skew: self.clock_skew,
        })
    }
}

enum Marker {
    Absent,
    Present(RanBy),
    Unreadable(Error),
}

/// Whether a job's output says it failed (for the [`RunPolicy`]).
pub(crate) type Failed<T> = fn(&T) -> bool;

impl RunOnce {
    /// Starts configuring the run-once helper for a job over the nodes of `locks`.
    pub fn builder(locks: Redlock, job: impl Into<String>) -> RunOnceBuilder {
        RunOnceBuilder {
            locks,
            job: job.into(),
            ttl: RunOnceBuilder::DEFAULT_TTL,
            marker_ttl: Some(RunOnceBuilder::DEFAULT_MARKER_TTL),
            instance: None,
            policy: RunPolicy::default(),
            clock_skew: RunOnceBuilder::DEFAULT_CLOCK_SKEW,
        }
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The policy for a job that fails ([`RunOnceBuilder::policy`]).
    pub fn policy(&self) -> RunPolicy {
        self.policy
    }

    /// Runs `job` for `tick` if this instance can take the job's lock now and the tick has not
    /// run yet; otherwise skips. The tick is marked done once the job returns, whatever it
    /// returned (for a job that can fail, see [`try_run`](Self::try_run)).
    ///
    /// The lock is not waited for: an attempt that finds it held by a quorum skips with
    /// [`SkipReason::Running`]. (Instances that start together and split the nodes between
    /// them retry a few times with the lock client's random pause, so one of them wins.) While
    /// the job runs its lock is extended every ttl / 3; if it is lost anyway, the job's future
    /// is dropped at its current await and [`Outcome::Lost`] is returned.
    ///
    /// # Errors
    ///
    /// Only [`Error::InvalidArgument`] (the job name or ttl cannot work with the lock client's
    /// configuration). Unreachable nodes are an outcome: [`SkipReason::Unavailable`].
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future drops the job and releases the lock in the background; no marker is
    /// written, so another instance may run the tick.
    pub async fn run<F, Fut, T>(&self, tick: impl Into<Tick>, job: F) -> Result<Outcome<T>, Error>
    where
        F: FnOnce(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_job(tick.into(), job, |_| false).await
    }

    /// As [`run`](Self::run), for a job that can fail: an `Err` from the job marks the tick
    /// done under [`RunPolicy::AtMostOnce`] (the default), and leaves it for the next instance
    /// under [`RunPolicy::RetryOnFailure`] (then the outcome is [`Outcome::Ran`] with the
    /// error as its output and `marked: false`).
    ///
    /// ```no_run
    /// use quorumlock::{Outcome, Redlock, RunOnce, RunPolicy};
    ///
    /// # async fn run(locks: Redlock, tick: u64) -> Result<(), quorumlock::Error> {
    /// let job = RunOnce::builder(locks, "reindex")
    ///     .policy(RunPolicy::RetryOnFailure)
    ///     .build()?;
    /// let outcome = job
    ///     .try_run(tick, |_ctx| async { Err::<(), _>("search cluster unavailable") })
    ///     .await?;
    /// if let Outcome::Ran { output: Err(e), marked: false, .. } = outcome {
    ///     tracing::warn!(error = e, "reindex failed; another instance will retry this tick");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancellation safety
    ///
    /// As [`run`](Self::run).
    pub async fn try_run<F, Fut, T, E>(
        &self,
        tick: impl Into<Tick>,
        job: F,
    ) -> Result<Outcome<Result<T, E>>, Error>
    where
        F: FnOnce(TickContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_job(tick.into(), job, Result::is_err).await
    }

    /// One call, in its `quorumlock.run_once` span (the job's name as `key`, tick, ttl,
    /// outcome, token): the acquisition, the job (its events nest under the span) and the
    /// release.
    async fn run_job<F, Fut, T>(
        &self,
        tick: Tick,
        job: F,
        failed: Failed<T>,
    ) -> Result<Outcome<T>, Error>
    where
        F: FnOnce(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let span = tracing::info_span!(
            "quorumlock.run_once",
            key = self.job.as_str(),
            tick = tick.name(),
            ttl_ms = millis(self.ttl),
            outcome = Empty,
            token = Empty,
        );
        let outcome = SpanOutcome::new(&span);
        let result = self
            .run_tick(tick, job, failed)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(done) => {
                if let Some(token) = done.token() {
                    span.record("token", token.get());
                }
                outcome.word(done.span_word());
            }
            Err(e) => outcome.word(span_outcome(e)),
        }
        result
    }

    async fn run_tick<F, Fut, T>(
        &self,
        tick: Tick,
        job: F,
        failed: Failed<T>,
    ) -> Result<Outcome<T>, Error>
    where
        F: FnOnce(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let (lock, ctx) = match self.start_tick(&tick).await? {
            Ok(started) => started,
            Err(reason) => {
                let tick = tick.name().to_owned();
                return Ok(Outcome::Skipped { tick, reason });
            }
        };
        let tick = tick.name().to_owned();
        let token = lock.token();
        let Some(output) = until_lost(&lock, job(ctx)).await else {
            let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
            tracing::warn!(job = %self.job, %tick, %token, %reason, "lost the job's lock while running; the job was stopped");
            drop(lock);
            let output = None;
            return Ok(Outcome::Lost {
                tick,
                token,
                reason,
                output,
            });
        };
        Ok(self.finish(lock, tick, output, failed).await)
    }

    /// What comes before the job: the job's lock (kept alive from then on) and the tick's
    /// context, or why the tick is skipped (the lock is then released). The blocking facade
    /// runs the job between this and [`finish`](Self::finish), on the caller's thread.
    pub(crate) async fn start_tick(
        &self,
        tick: &Tick,
    ) -> Result<Result<(Lock, TickContext), SkipReason>, Error> {
        not_before(tick.start()).await;
        let lock = match self.take_lock(tick.name()).await? {
            Ok(lock) => lock,
            Err(reason) => return Ok(Err(reason)),
        };
        let token = lock.token();
        if let Err(reason) = self.check_marker(tick).await {
            self.release(lock, tick.name()).await;
            return Ok(Err(reason));
        }
        let ctx = TickContext {
            job: self.job.clone(),
            tick: tick.name().to_owned(),
            token,
            lost: lock.lost_token(),
        };
        tracing::debug!(job = %self.job, %tick, %token, "running");
        Ok(Ok((lock, ctx)))
    }

    /// After the job returned: marks the tick (unless the policy leaves a failed one to
    /// another instance) and releases the lock, unless the lock was lost by then.
    pub(crate) async fn finish<T>(
        &self,
        lock: Lock,
        tick: String,
        output: T,
        failed: Failed<T>,
    ) -> Outcome<T> {
        let token = lock.token();
        if lock.is_lost() {
            return self.lost_at_the_end(lock, tick, output, "no tick marker written");
        }
        let retry = failed(&output) && self.policy == RunPolicy::RetryOnFailure;
        let marked = match self.marker_ttl {
            Some(_) if retry => {
                tracing::info!(job = %self.job, %tick, %token, "the job failed; no tick marker, so the next instance runs this tick again (retry on failure)");
                false
            }
            Some(ttl) => self.write_marker(&tick, token, ttl).await,
            None => false,
        };
        if lock.is_lost() {
            return self.lost_at_the_end(lock, tick, output, "lost while writing the tick marker");
        }
        self.release(lock, &tick).await;
        tracing::debug!(job = %self.job, %tick, %token, marked, "ran");
        Outcome::Ran {
            tick,
            token,
            output,
            marked,
        }
    }

    /// The outcome of a job that completed, but whose lock was lost by the time it did (or
    /// while its marker was being written).
    fn lost_at_the_end<T>(&self, lock: Lock, tick: String, output: T, what: &str) -> Outcome<T> {
        let token = lock.token();
        let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
        tracing::warn!(job = %self.job, %tick, %token, %reason, "the job completed, but its lock was lost by then ({what}); another instance may run this tick too");
        drop(lock);
        Outcome::Lost {
            tick,
            token,
            reason,
            output: Some(output),
        }
    }

    /// Takes the job's lock (kept alive from then on), or says why this tick is skipped.
    async fn take_lock(&self, tick: &str) -> Result<Result<Lock, SkipReason>, Error> {
        let skip = match self.try_lock().await {
            Ok(lock) => {
                lock.keep_alive();
                return Ok(Ok(lock));
            }
            Err(e) if e.is_held() => {
                tracing::debug!(job = %self.job, %tick, "another instance is running; skipping");
                SkipReason::Running
            }
            Err(e @ Error::NoQuorum { .. }) => {
                tracing::warn!(job = %self.job, %tick, error = %e, "too few lock nodes reachable; skipping this tick");
                SkipReason::Unavailable(e)
            }
            Err(e @ Error::ValidityExpired { .. }) => {
                tracing::warn!(job = %self.job, %tick, error = %e, "the lock nodes answered too slowly to take the job's lock; skipping this tick");
                SkipReason::Unavailable(e)
            }
            Err(e) => return Err(e),
        };
        Ok(Err(skip))
    }

    /// One try; while a status read then shows nobody holding the lock, up to the client's
    /// retry count more, after its retry pause. A lock held by a quorum is reported at once.
    ///
    /// Wider than the election's split-vote check (`LockStatus::is_split_vote`): a partial view
    /// ([`HolderView::Unknown`](crate::HolderView::Unknown)) is retried too. A standby that
    /// waits in a partial view campaigns again at its next poll; a run-once call that skips
    /// gets no second chance at its tick, and instances that split the nodes with one node
    /// down (the client cannot prove that split) would all skip it (`t51`).
    async fn try_lock(&self) -> Result<Lock, Error> {
        let retries = self.locks.retry_count();
        let mut round = 0;
        loop {
            match self.locks.try_acquire(&self.job, self.ttl).await {
                Err(e) if e.is_held() && round < retries => {
                    match self.locks.status(&self.job).await {
                        Ok(s) if s.holder().is_none() => {}
                        _ => return Err(e),
                    }
                    round += 1;
                    tokio::time::sleep(self.locks.retry_pause()).await;
                }
                other => return other,
            }
        }
    }

    /// `Err` with the reason to skip when the tick already ran or its marker cannot be read.
    async fn check_marker(&self, tick: &Tick) -> Result<(), SkipReason> {
        if self.marker_ttl.is_none() {
            return Ok(());
        }
        match self.read_marker(tick).await {
            Marker::Absent => Ok(()),
            Marker::Present(by) => {
                tracing::debug!(job = %self.job, %tick, %by, "tick already ran; skipping");
                Err(SkipReason::AlreadyRan { by })
            }
            Marker::Unreadable(e) => {
                tracing::warn!(job = %self.job, %tick, error = %e, "cannot read the tick marker from a quorum; skipping this tick");
                Err(SkipReason::Unavailable(e))
            }
        }
    }

    async fn release(&self, lock: Lock, tick: &str) {
        if let Err(e) = lock.release().await {
            tracing::warn!(job = %self.job, tick, error = %e, "release failed; the lock expires with its ttl");
        }
    }

    fn marker_key(&self, tick: &str) -> String {
        format!("{}:tick:{tick}", self.locks.keys().lock_key(&self.job))
    }

    /// Reads the tick marker from every node: present anywhere means the tick ran (markers are
    /// written on a quorum, and the nodes that answer here are a quorum).
    ///
    /// Absent needs a quorum of answers from nodes this client has not seen lose their data
    /// (restart or failover without proof it survived) within the marker's expiry: such a
    /// node may have lost the marker with the rest (its counters are repaired, its markers are
    /// not), so its "absent" proves nothing until every marker it may have lost has expired
    /// anyway (`docs/safety.md`, "Run-once markers across restarts").
    async fn read_marker(&self, tick: &Tick) -> Marker {
        let key = self.marker_key(tick.name());
        let get = commands::get(&key);
        let replies = self
            .locks
            .on_every_node_to_quorum::<Option<String>>(&get, HoldOut::Respect)
            .await;
        if let Some(by) = replies.answers().flatten().next() {
            return Marker::Present(RanBy::parse(by));
        }
        let expiry = self.marker_ttl.unwrap_or_default();
        let now = SystemTime::now();
        let lost: Vec<Option<Duration>> = self
            .locks
            .nodes()
            .iter()
            .map(|n| {
                n.lost_data_within(expiry).filter(|&ago| {
                    let seen = now
                        .checked_sub(ago)
                        .and_then(|t| t.checked_add(self.clock_skew));
                    seen.is_none_or(|seen| quorum::loss_may_hide_marker(tick.start(), seen))
                })
            })
            .collect();
        let proven = replies.answered_where(|i| lost.get(i).is_some_and(Option::is_none));
        let quorum = self.locks.quorum();
        if quorum::marker_absent(proven, quorum) {
            return Marker::Absent;
        }
        let mut failures = replies.failures();
        for (node, ago) in self.locks.nodes().iter().zip(&lost) {
            if let Some(ago) = *ago
                && !failures.iter().any(|f| f.node == node.name())
            {
                failures.push(NodeFailure {
                    node: node.name().to_owned(),
                    cause: NodeError::LostDataRecently { ago },
                });
            }
        }
        Marker::Unreadable(Error::no_quorum(
            &key,
            proven,
            replies.len(),
            quorum,
            failures,
        ))
    }

    /// Writes the tick marker on every node; true when a quorum has it.
    async fn write_marker(&self, tick: &str, token: FencingToken, ttl: Duration) -> bool {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let set = commands::set_nx_px(
            &self.marker_key(tick),
            &RanBy::encode(token, &self.instance),
            ttl_ms,
        );
        let replies = self
            .locks
            .on_every_node_to_quorum::<Option<String>>(&set, HoldOut::Respect)
            .await;
        // OK (written) and nil (already there) both leave the marker on the node.
        let marked = replies.answered();
        let quorum = self.locks.quorum();
        if marked < quorum {
            tracing::warn!(job = %self.job, tick, marked, needed = quorum, failures = %FailureList(&replies.failures()), "tick marker did not reach a quorum; a late instance may run this tick again");
        }
        marked >= quorum
    }
}

/// Waits until the wall clock reaches a tick's start: a tick's marker is never written before
/// its tick began, which lets readers count nodes that lost their data before that.
async fn not_before(start: Option<SystemTime>) {
    let Some(start) = start else { return };
    while let Ok(early) = start.duration_since(SystemTime::now()) {
        if early.is_zero() {
            return;
        }
        tokio::time::sleep(early).await;
    }
}

/// Runs `work` until it completes or `lock` is lost, whichever comes first: `None` when the
/// loss came first (the work's future is dropped at its current await). The work is polled
/// first, and once more right after the loss, so work that completes at the loss (e.g. on the
/// lost signal itself) keeps its output (the caller still sees the loss on the lock).
async fn until_lost<T>(lock: &Lock, work: impl Future<Output = T>) -> Option<T> {
    let lost = lock.lost();
    let mut work = std::pin::pin!(work);
    tokio::select! {
        biased;
        out = &mut work => Some(out),
        // Whoever noticed the loss first (this future or the lease task) fired the lost
        // signal: work waiting on it can now finish in one more poll, and keeps its output.
        () = lost => futures::FutureExt::now_or_never(work),
    }
}
