//! Run-once scheduling: every instance of a service calls [`RunOnce::run`] for the same named
//! tick; one of them runs the job, the others skip quietly.
//!
//! The job's lock (key `quorumlock:{JOB}`) is taken without waiting for a running job: if
//! another instance holds it, this one skips ("another instance is running", logged at debug).
//! When too few nodes are reachable every instance skips, logged at warn: no job runs until a
//! quorum is back (graceful degradation, never "run anyway"). The lock is kept alive while the
//! job runs, and the job gets the fencing token and the lost signal.
//!
//! A tick marker (`quorumlock:{JOB}:tick:<T>`, with its own expiry) is written on a quorum
//! after the job finished and before the lock is released; an instance that takes the lock
//! later for the same tick finds the marker (read from every node, so it meets the quorum
//! written) and skips. A job whose lock was lost leaves no marker, so a later instance may run
//! that tick again.
//!
//! A job that finishes at the moment its lock is lost (its future completed, but the lock's
//! lost signal fired or its validity ran out by the time the helper looks) keeps its output:
//! the outcome is [`Outcome::Lost`] with `output: Some(..)`, because the end of its run was not
//! covered by the lock (another instance may have started the tick meanwhile), and no marker is
//! written.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::client::Redlock;
use crate::core::keys;
use crate::core::token::FencingToken;
use crate::election::{Sidecar, contention_pause};
use crate::error::{ConfigError, Error, FailureList, LostReason};
use crate::lock::guard::Lock;

/// A job that runs at most once per tick across all instances.
///
/// ```no_run
/// use std::time::{Duration, SystemTime};
/// use quorumlock::{Outcome, Redlock, RunOnce, tick_of};
///
/// # async fn run(locks: Redlock) -> Result<(), quorumlock::Error> {
/// let job = RunOnce::builder(locks, "refresh-repositories")
///     .ttl(Duration::from_secs(30))
///     .marker_ttl(Duration::from_secs(3600))
///     .build()?;
/// let mut every = tokio::time::interval(Duration::from_secs(600));
/// loop {
///     every.tick().await;
///     let tick = tick_of(SystemTime::now(), Duration::from_secs(600));
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
    sidecar: Arc<Sidecar>,
}

impl fmt::Debug for RunOnce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOnce")
            .field("job", &self.job)
            .field("ttl", &self.ttl)
            .field("marker_ttl", &self.marker_ttl)
            .field("instance", &self.instance)
            .finish()
    }
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
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build() is called"]
pub struct RunOnceBuilder {
    locks: Redlock,
    job: String,
    ttl: Duration,
    marker_ttl: Option<Duration>,
    instance: Option<String>,
}

impl RunOnceBuilder {
    /// The default ttl of the job's lock.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// The default expiry of a tick marker.
    pub const DEFAULT_MARKER_TTL: Duration = Duration::from_secs(3600);

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

    /// Builds the helper. No connection is made.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a zero marker expiry. An invalid job name or ttl is reported by
    /// the first [`run`](RunOnce::run) as [`Error::InvalidArgument`].
    pub fn build(self) -> Result<RunOnce, Error> {
        if self.marker_ttl.is_some_and(|t| t.as_millis() == 0) {
            return Err(ConfigError::ZeroDuration("tick marker ttl").into());
        }
        let sidecar = Arc::new(Sidecar::new(&self.locks)?);
        Ok(RunOnce {
            instance: self
                .instance
                .unwrap_or_else(|| format!("{}-{:04x}", std::process::id(), rand::random::<u16>())),
            locks: self.locks,
            job: self.job,
            ttl: self.ttl,
            marker_ttl: self.marker_ttl,
            sidecar,
        })
    }
}

/// What a job run by [`RunOnce::run`] knows about its run.
#[derive(Debug, Clone)]
pub struct TickContext {
    job: String,
    tick: String,
    token: FencingToken,
    lost: CancellationToken,
}

impl TickContext {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The tick being run.
    pub fn tick(&self) -> &str {
        &self.tick
    }

    /// The fencing token of this run: stamp every write with it.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Cancelled when the job's lock is lost (the job's future is then dropped too).
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }
}

/// What [`RunOnce::run`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// This instance ran the job for the tick.
    Ran {
        /// The tick.
        tick: String,
        /// The run's fencing token.
        token: FencingToken,
        /// What the job returned.
        output: T,
        /// Whether the tick marker reached a quorum (if not, a late instance may run the tick
        /// again; logged at warn). Always false without markers.
        marked: bool,
    },
    /// This instance did not run the job.
    Skipped {
        /// The tick.
        tick: String,
        /// Why.
        reason: SkipReason,
    },
    /// The job's lock was lost before the run was over: another instance may have run the
    /// tick too (writes stamped with the token let the resource refuse this run's late ones).
    /// No marker was written (unless the loss came while it was being written), so a later
    /// instance may run the tick again.
    Lost {
        /// The tick.
        tick: String,
        /// The run's fencing token.
        token: FencingToken,
        /// Why the lock was lost.
        reason: LostReason,
        /// `None` when the loss stopped the job (its future was dropped at its current await);
        /// what the job returned when it had completed by the time the loss was seen.
        output: Option<T>,
    },
}

impl<T> Outcome<T> {
    /// True for [`Outcome::Ran`].
    pub fn ran(&self) -> bool {
        matches!(self, Outcome::Ran { .. })
    }

    /// The job's output, if it ran to completion: always for [`Outcome::Ran`], and for an
    /// [`Outcome::Lost`] whose job completed as its lock was lost.
    pub fn output(self) -> Option<T> {
        match self {
            Outcome::Ran { output, .. } => Some(output),
            Outcome::Lost { output, .. } => output,
            Outcome::Skipped { .. } => None,
        }
    }

    /// Why the job was skipped, if it was.
    pub fn skip_reason(&self) -> Option<&SkipReason> {
        match self {
            Outcome::Skipped { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// Why [`RunOnce::run`] skipped a tick.
#[derive(Debug)]
#[non_exhaustive]
pub enum SkipReason {
    /// Another instance holds the job's lock: it is running the job (this tick or an earlier
    /// one that is still going).
    Running,
    /// The tick's marker says it already ran.
    AlreadyRan {
        /// The marker's content: `"<token> <instance id>"` of the run that wrote it.
        by: String,
    },
    /// Too few nodes answered to take the lock or to read the tick marker
    /// ([`Error::NoQuorum`]), or they answered so slowly that the lock had no validity left
    /// ([`Error::ValidityExpired`]).
    Unavailable(Error),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Running => f.write_str("another instance is running"),
            SkipReason::AlreadyRan { by } => {
                write!(f, "the tick already ran (token, instance: {by})")
            }
            SkipReason::Unavailable(e) => write!(f, "lock service unavailable: {e}"),
        }
    }
}

/// The tick a time falls in, for a period: whole periods since the Unix epoch. Instances whose
/// clocks agree to within their scheduling jitter compute the same tick.
pub fn tick_of(at: SystemTime, period: Duration) -> u64 {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let period = period.as_millis().max(1);
    u64::try_from(since / period).unwrap_or(u64::MAX)
}

enum Marker {
    Absent,
    Present(String),
    Unreadable(Error),
}

impl RunOnce {
    /// Starts configuring the run-once helper for a job over the nodes of `locks`.
    pub fn builder(locks: Redlock, job: impl Into<String>) -> RunOnceBuilder {
        RunOnceBuilder {
            locks,
            job: job.into(),
            ttl: RunOnceBuilder::DEFAULT_TTL,
            marker_ttl: Some(RunOnceBuilder::DEFAULT_MARKER_TTL),
            instance: None,
        }
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Runs `job` for `tick` if this instance can take the job's lock now and the tick has not
    /// run yet; otherwise skips.
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
    pub async fn run<F, Fut, T>(&self, tick: impl fmt::Display, job: F) -> Result<Outcome<T>, Error>
    where
        F: FnOnce(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let tick = tick.to_string();
        let skip = |reason| {
            Ok(Outcome::Skipped {
                tick: tick.clone(),
                reason,
            })
        };
        // The side connections (tick markers) connect while the lock is taken: a first connect
        // (a TLS handshake) may take longer than the node timeout a marker read waits.
        self.sidecar.warm_up();
        let lock = match self.take_lock().await {
            Ok(lock) => lock,
            Err(e) if e.is_held() => {
                tracing::debug!(job = %self.job, %tick, "another instance is running; skipping");
                return skip(SkipReason::Running);
            }
            Err(e @ Error::NoQuorum { .. }) => {
                tracing::warn!(job = %self.job, %tick, error = %e, "too few lock nodes reachable; skipping this tick");
                return skip(SkipReason::Unavailable(e));
            }
            Err(e @ Error::ValidityExpired { .. }) => {
                tracing::warn!(job = %self.job, %tick, error = %e, "the lock nodes answered too slowly to take the job's lock; skipping this tick");
                return skip(SkipReason::Unavailable(e));
            }
            Err(e) => return Err(e),
        };
        lock.keep_alive();
        let token = lock.token();
        if self.marker_ttl.is_some() {
            match self.read_marker(&tick).await {
                Marker::Absent => {}
                Marker::Present(by) => {
                    tracing::debug!(job = %self.job, %tick, %by, "tick already ran; skipping");
                    self.release(lock, &tick).await;
                    return skip(SkipReason::AlreadyRan { by });
                }
                Marker::Unreadable(e) => {
                    tracing::warn!(job = %self.job, %tick, error = %e, "cannot read the tick marker from a quorum; skipping this tick");
                    self.release(lock, &tick).await;
                    return skip(SkipReason::Unavailable(e));
                }
            }
        }
        let ctx = TickContext {
            job: self.job.clone(),
            tick: tick.clone(),
            token,
            lost: lock.lost_token(),
        };
        let lost = ctx.lost.clone();
        tracing::debug!(job = %self.job, %tick, %token, "running");
        // The job first: one that completed in the same poll as the loss keeps its output (the
        // loss is reported all the same, below).
        let output = tokio::select! {
            biased;
            out = job(ctx) => Some(out),
            _ = lost.cancelled() => None,
        };
        let Some(output) = output else {
            let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
            tracing::warn!(job = %self.job, %tick, %token, %reason, "lost the job's lock while running; the job was stopped");
            drop(lock);
            return Ok(Outcome::Lost {
                tick,
                token,
                reason,
                output: None,
            });
        };
        if lock.is_lost() {
            return Ok(self.lost_at_the_end(lock, tick, token, output, "no tick marker written"));
        }
        let marked = match self.marker_ttl {
            Some(ttl) => self.write_marker(&tick, token, ttl).await,
            None => false,
        };
        if lock.is_lost() {
            return Ok(self.lost_at_the_end(
                lock,
                tick,
                token,
                output,
                "lost while writing the tick marker",
            ));
        }
        self.release(lock, &tick).await;
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
    fn lost_at_the_end<T>(
        &self,
        lock: Lock,
        tick: String,
        token: FencingToken,
        output: T,
        what: &str,
    ) -> Outcome<T> {
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

    /// One try, retried only while nobody holds a quorum (instances that started together split
    /// the nodes): a lock held by a quorum is reported at once.
    async fn take_lock(&self) -> Result<Lock, Error> {
        let retries = self.locks.inner.cfg.retry_count;
        let mut round = 0;
        loop {
            match self.locks.try_acquire(&self.job, self.ttl).await {
                Err(e) if e.is_held() && round < retries => {
                    match self.locks.status(&self.job).await {
                        Ok(s) if s.holder().is_none() => {}
                        _ => return Err(e),
                    }
                    round += 1;
                    tokio::time::sleep(contention_pause(&self.locks)).await;
                }
                other => return other,
            }
        }
    }

    async fn release(&self, lock: Lock, tick: &str) {
        if let Err(e) = lock.release().await {
            tracing::warn!(job = %self.job, tick, error = %e, "release failed; the lock expires with its ttl");
        }
    }

    fn marker_key(&self, tick: &str) -> String {
        format!("{}:tick:{tick}", keys::lock_key(&self.job))
    }

    /// Reads the tick marker from every node: present anywhere means the tick ran (markers are
    /// written on a quorum, and the nodes that answer here are a quorum).
    async fn read_marker(&self, tick: &str) -> Marker {
        let key = &self.marker_key(tick);
        let replies = self
            .sidecar
            .all(move |mut c| async move {
                redis::cmd("GET")
                    .arg(key)
                    .query_async::<Option<String>>(&mut c)
                    .await
            })
            .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if let Some(by) = replies
            .iter()
            .find_map(|r| r.as_ref().ok().cloned().flatten())
        {
            return Marker::Present(by);
        }
        let quorum = self.locks.quorum();
        if answered >= quorum {
            return Marker::Absent;
        }
        Marker::Unreadable(Error::NoQuorum {
            key: key.clone(),
            reached: answered,
            nodes: replies.len(),
            needed: quorum,
            failures: self.sidecar.failures(&replies),
        })
    }

    /// Writes the tick marker on every node; true when a quorum has it.
    async fn write_marker(&self, tick: &str, token: FencingToken, ttl: Duration) -> bool {
        let key = &self.marker_key(tick);
        let value = &format!("{token} {}", self.instance);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let replies = self
            .sidecar
            .all(move |mut c| async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async::<Option<String>>(&mut c)
                    .await
            })
            .await;
        // OK (written) and nil (already there) both leave the marker on the node.
        let marked = replies.iter().filter(|r| r.is_ok()).count();
        let quorum = self.locks.quorum();
        if marked < quorum {
            tracing::warn!(job = %self.job, tick, marked, needed = quorum, failures = %FailureList(&self.sidecar.failures(&replies)), "tick marker did not reach a quorum; a late instance may run this tick again");
        }
        marked >= quorum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_whole_periods_since_the_epoch() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(3_725);
        assert_eq!(tick_of(at, Duration::from_secs(60)), 62);
        assert_eq!(tick_of(at, Duration::from_secs(3_600)), 1);
        assert_eq!(tick_of(at, Duration::ZERO), 3_725_000);
        assert_eq!(tick_of(SystemTime::UNIX_EPOCH, Duration::from_secs(5)), 0);
    }
}
