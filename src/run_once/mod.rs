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

use crate::client::{SpanOutcome, millis, span_outcome};
use crate::error::{Error, LostReason};
use crate::lock::guard::Lock;
use crate::lock::redlock::Redlock;

mod builder;
mod marker;
mod outcome;
mod report;
mod schedule;
mod tick;

pub use builder::{CatchUp, Overlap, RunOnceBuilder, RunPolicy};
pub use outcome::{Outcome, RanBy, SkipReason, TickContext};
pub use schedule::{Schedule, ScheduledRun};
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
    pub(super) locks: Redlock,
    pub(super) job: String,
    pub(super) ttl: Duration,
    pub(super) ttl_given: bool,
    pub(super) marker_ttl: Option<Duration>,
    pub(super) instance: String,
    pub(super) policy: RunPolicy,
    pub(super) clock_skew: Duration,
    pub(super) overlap: Overlap,
    pub(super) catch_up: CatchUp,
    pub(super) hold_at_least: Duration,
    pub(super) outage: std::sync::Arc<report::Outage>,
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
            .field("overlap", &self.overlap)
            .field("catch_up", &self.catch_up)
            .field("hold_at_least", &self.hold_at_least)
            .finish()
    }
}

/// The job's lock while this instance holds it, and when it was taken (for the minimum hold).
pub(crate) struct Held {
    pub(super) lock: Lock,
    taken: std::time::Instant,
}

/// Whether a job's output says it failed (for the [`RunPolicy`]).
pub(crate) type Failed<T> = fn(&T) -> bool;

impl RunOnce {
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
        if let Ok(done) = &result {
            let failed = matches!(done, Outcome::Ran { output, .. } if failed(output));
            self.report(done, failed, false);
        }
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
        let (held, ctx) = match self.start_tick(&tick, None).await? {
            Ok(started) => started,
            Err(reason) => {
                let tick = tick.name().to_owned();
                return Ok(Outcome::Skipped { tick, reason });
            }
        };
        let tick = tick.name().to_owned();
        let Some(output) = until_lost(&held.lock, job(ctx)).await else {
            return Ok(self.stopped(&held.lock, tick));
        };
        Ok(self.finish(held, tick, output, failed).await)
    }

    /// The outcome of a job stopped by the loss of its lock (the caller drops the lock).
    pub(super) fn stopped<T>(&self, lock: &Lock, tick: String) -> Outcome<T> {
        let token = lock.token();
        let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
        tracing::warn!(job = %self.job, %tick, %token, %reason, "lost the job's lock while running; the job was stopped");
        Outcome::Lost {
            tick,
            token,
            reason,
            output: None,
        }
    }

    /// What comes before the job: the job's lock (kept alive from then on) and the tick's
    /// context, or why the tick is skipped (the lock is then released). The blocking facade
    /// runs the job between this and [`finish`](Self::finish), on the caller's thread. Under
    /// [`Overlap::RunAfter`] a held lock is waited for until `give_up` (one ttl without it).
    pub(crate) async fn start_tick(
        &self,
        tick: &Tick,
        give_up: Option<SystemTime>,
    ) -> Result<Result<(Held, TickContext), SkipReason>, Error> {
        not_before(tick.start()).await;
        let held = match self.take_lock(tick.name(), give_up).await? {
            Ok(held) => held,
            Err(reason) => return Ok(Err(reason)),
        };
        if let Err(reason) = self.check_marker(tick).await {
            self.release(held, tick.name()).await;
            return Ok(Err(reason));
        }
        let ctx = self.context(tick, &held.lock);
        Ok(Ok((held, ctx)))
    }

    /// The context of a run of `tick` under `lock`.
    pub(super) fn context(&self, tick: &Tick, lock: &Lock) -> TickContext {
        let token = lock.token();
        tracing::debug!(job = %self.job, %tick, %token, "running");
        TickContext {
            job: self.job.clone(),
            tick: tick.name().to_owned(),
            token,
            lost: lock.lost_token(),
        }
    }

    /// After the job returned: marks the tick (unless the policy leaves a failed one to
    /// another instance) and releases the lock, unless the lock was lost by then.
    pub(crate) async fn finish<T>(
        &self,
        held: Held,
        tick: String,
        output: T,
        failed: Failed<T>,
    ) -> Outcome<T> {
        match self.record(&held.lock, tick, output, failed).await {
            Ok(ran) => {
                self.release(held, ran.tick()).await;
                ran
            }
            Err(lost) => lost,
        }
    }

    /// Marks a tick whose job returned (unless the policy leaves a failed one to another
    /// instance), keeping the lock: [`Outcome::Ran`], or `Err` with [`Outcome::Lost`] when the
    /// lock was lost by then (the caller then drops it).
    pub(super) async fn record<T>(
        &self,
        lock: &Lock,
        tick: String,
        output: T,
        failed: Failed<T>,
    ) -> Result<Outcome<T>, Outcome<T>> {
        let token = lock.token();
        if lock.is_lost() {
            return Err(self.lost_at_the_end(lock, tick, output, "no tick marker written"));
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
            return Err(self.lost_at_the_end(
                lock,
                tick,
                output,
                "lost while writing the tick marker",
            ));
        }
        tracing::debug!(job = %self.job, %tick, %token, marked, "ran");
        Ok(Outcome::Ran {
            tick,
            token,
            output,
            marked,
        })
    }

    /// The outcome of a job that completed, but whose lock was lost by the time it did (or
    /// while its marker was being written).
    fn lost_at_the_end<T>(&self, lock: &Lock, tick: String, output: T, what: &str) -> Outcome<T> {
        let token = lock.token();
        let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
        tracing::warn!(job = %self.job, %tick, %token, %reason, "the job completed, but its lock was lost by then ({what}); another instance may run this tick too");
        Outcome::Lost {
            tick,
            token,
            reason,
            output: Some(output),
        }
    }

    /// Takes the job's lock (kept alive from then on), or says why this tick is skipped.
    pub(super) async fn take_lock(
        &self,
        tick: &str,
        give_up: Option<SystemTime>,
    ) -> Result<Result<Held, SkipReason>, Error> {
        let taken = std::time::Instant::now();
        let mut attempt = self.try_lock().await;
        if self.overlap == Overlap::RunAfter && attempt.as_ref().is_err_and(Error::is_held) {
            let wait = give_up
                .map_or(Some(self.ttl), |at| {
                    at.duration_since(SystemTime::now()).ok()
                })
                .unwrap_or_default();
            tracing::debug!(job = %self.job, %tick, ?wait, "the previous run is still going; waiting for it");
            attempt = self.locks.acquire_timeout(&self.job, self.ttl, wait).await;
        }
        let skip = match attempt {
            Ok(lock) => {
                lock.keep_alive();
                return Ok(Ok(Held { lock, taken }));
            }
            Err(e) if e.is_held() => {
                tracing::debug!(job = %self.job, %tick, "another instance is running; skipping");
                SkipReason::Running
            }
            Err(e @ Error::NoQuorum { .. }) => {
                tracing::debug!(job = %self.job, %tick, error = %e, "too few lock nodes reachable; skipping this tick");
                SkipReason::Unavailable(e)
            }
            Err(e @ Error::ValidityExpired { .. }) => {
                tracing::debug!(job = %self.job, %tick, error = %e, "the lock nodes answered too slowly to take the job's lock; skipping this tick");
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
        let retries = self.locks.engine().retry_count();
        let mut round = 0;
        loop {
            match self.locks.try_acquire(&self.job, self.ttl).await {
                Err(e) if e.is_held() && round < retries => {
                    match self.locks.status(&self.job).await {
                        Ok(s) if s.holder().is_none() => {}
                        _ => return Err(e),
                    }
                    round += 1;
                    tokio::time::sleep(self.locks.engine().retry_pause()).await;
                }
                other => return other,
            }
        }
    }

    /// Releases the job's lock, or, within the minimum hold
    /// ([`RunOnceBuilder::hold_at_least`]), leaves it to expire at the end of the hold.
    pub(super) async fn release(&self, held: Held, tick: &str) {
        let Held { lock, taken } = held;
        let rest = self.hold_at_least.saturating_sub(taken.elapsed());
        if !rest.is_zero() {
            match lock.extend(rest).await {
                Ok(_) => return lock.forget(),
                Err(e) => {
                    tracing::debug!(job = %self.job, tick, error = %e, "cannot shorten the lock to the minimum hold; releasing it")
                }
            }
        }
        if let Err(e) = lock.release().await {
            tracing::warn!(job = %self.job, tick, error = %e, "release failed; the lock expires with its ttl");
        }
    }
}

/// Waits until the wall clock reaches a tick's start: a tick's marker is never written before
/// its tick began, which lets readers count nodes that lost their data before that.
pub(super) async fn not_before(start: Option<SystemTime>) {
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
pub(super) async fn until_lost<T>(lock: &Lock, work: impl Future<Output = T>) -> Option<T> {
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
