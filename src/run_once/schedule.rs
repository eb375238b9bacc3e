//! A job on a schedule: the ticks of a [`Schedule`], one scheduled run with its catch-up
//! ([`RunOnce::run_scheduled`]), and the loop that runs a job on every tick until told to stop
//! ([`RunOnce::run_every`]).

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::{CatchUp, Marker, Outcome, RunOnce, Tick, TickContext, not_before, until_lost};
use crate::error::{ConfigError, Error, Setting};

/// The most missed ticks one scheduled run looks back at ([`CatchUp::Within`]).
const MAX_CATCH_UP: usize = 1000;

/// When a job's ticks begin: every fixed period, counted from the Unix epoch (so instances
/// whose clocks agree compute the same ticks).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use quorumlock::Schedule;
///
/// let every = Schedule::every(Duration::from_secs(60)).unwrap();
/// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(3_725);
/// assert_eq!(every.tick_at(at).name(), "62");
/// assert_eq!(every.next_after(at).name(), "63");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    period: Duration,
}

impl Schedule {
    /// A tick every `period`, named by [`tick_of`](super::tick_of): whole periods since the
    /// Unix epoch.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroDuration`] for a period under a millisecond.
    pub fn every(period: Duration) -> Result<Schedule, ConfigError> {
        if period.as_millis() == 0 {
            return Err(ConfigError::ZeroDuration(Setting::SchedulePeriod));
        }
        Ok(Schedule { period })
    }

    /// The tick `at` falls in: the latest that began at or before it.
    pub fn tick_at(&self, at: SystemTime) -> Tick {
        Tick::of(at, self.period)
    }

    /// The first tick that begins after `at`.
    pub fn next_after(&self, at: SystemTime) -> Tick {
        let current = self.tick_at(at);
        match current.start().and_then(|s| s.checked_add(self.period)) {
            Some(next) => Tick::of(next, self.period),
            None => current,
        }
    }

    /// The tick before `tick`, if `tick` has a start.
    pub fn before(&self, tick: &Tick) -> Option<Tick> {
        let start = tick.start()?.checked_sub(self.period)?;
        Some(Tick::of(start, self.period))
    }

    /// The job's lock ttl when none is given: a third of the period, at least 1 s, at most
    /// the default 30 s.
    fn lock_ttl(&self) -> Duration {
        (self.period / 3).clamp(Duration::from_secs(1), super::RunOnceBuilder::DEFAULT_TTL)
    }

    /// The tick after `tick`, if `tick` has a start.
    pub fn after(&self, tick: &Tick) -> Option<Tick> {
        let start = tick.start()?.checked_add(self.period)?;
        Some(Tick::of(start, self.period))
    }
}

/// What one scheduled run did ([`RunOnce::run_scheduled`]): the tick's own outcome, and the
/// missed ticks it caught up.
#[derive(Debug)]
#[non_exhaustive]
pub struct ScheduledRun<T> {
    /// The tick's outcome.
    pub outcome: Outcome<T>,
    /// Each missed tick run after it, under the [`CatchUp`] policy.
    pub caught_up: Vec<Outcome<T>>,
}

impl RunOnce {
    /// Runs `job` for `tick` of `schedule` as [`run`](Self::run) does, then, if it ran, the
    /// missed ticks the [`CatchUp`] policy names, each at most once (its marker), under the
    /// same lock: other instances find the current tick done, never skipped on account of a
    /// catch-up. Catching up stops when the next tick begins or the lock is lost.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancellation safety
    ///
    /// As [`run`](Self::run).
    pub async fn run_scheduled<F, Fut, T>(
        &self,
        schedule: &Schedule,
        tick: Tick,
        job: &mut F,
    ) -> Result<ScheduledRun<T>, Error>
    where
        F: FnMut(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let done = self.scheduled(schedule, tick, job, None).await?;
        self.report_scheduled(&done);
        Ok(done)
    }

    fn report_scheduled<T>(&self, done: &ScheduledRun<T>) {
        self.report(&done.outcome, false, false);
        for caught in &done.caught_up {
            self.report(caught, false, true);
        }
    }

    /// Runs `job` on every tick of `schedule` from the next one on ([`run_scheduled`]), until
    /// `stop` is cancelled: a run in progress is finished first (its tick marked, the lock
    /// released), then the loop returns. Each tick's outcome is logged (and counted with the
    /// `metrics` feature).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use quorumlock::{CancellationToken, Redlock, RunOnce, Schedule};
    ///
    /// # async fn run(locks: Redlock) -> Result<(), Box<dyn std::error::Error>> {
    /// let job = RunOnce::builder(locks, "refresh-report")
    ///     .ttl(Duration::from_secs(20))
    ///     .build()?;
    /// let stop = CancellationToken::new();
    /// // e.g. cancelled on SIGTERM
    /// job.run_every(&Schedule::every(Duration::from_secs(60))?, stop, |ctx| async move {
    ///     tracing::info!(tick = ctx.tick(), token = %ctx.token(), "refreshing");
    /// })
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`run_scheduled`]: Self::run_scheduled
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub async fn run_every<F, Fut, T>(
        &self,
        schedule: &Schedule,
        stop: CancellationToken,
        mut job: F,
    ) -> Result<(), Error>
    where
        F: FnMut(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut tick = schedule.next_after(SystemTime::now());
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(()),
                () = not_before(tick.start()) => {}
            }
            let next = schedule.after(&tick);
            let done = self
                .scheduled(schedule, tick, &mut job, Some(&stop))
                .await?;
            self.report_scheduled(&done);
            if stop.is_cancelled() {
                return Ok(());
            }
            // A tick that began while this one ran is skipped: the next scheduled run catches
            // it up if the policy says so.
            let upcoming = schedule.next_after(SystemTime::now());
            tick = match next {
                Some(next) if next.start() > upcoming.start() => next,
                _ => upcoming,
            };
        }
    }

    async fn scheduled<F, Fut, T>(
        &self,
        schedule: &Schedule,
        tick: Tick,
        job: &mut F,
        stop: Option<&CancellationToken>,
    ) -> Result<ScheduledRun<T>, Error>
    where
        F: FnMut(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        if !self.ttl_given {
            let mut this = self.clone();
            this.ttl = schedule.lock_ttl();
            this.ttl_given = true;
            return Box::pin(this.scheduled(schedule, tick, job, stop)).await;
        }
        let next_start = schedule.after(&tick).and_then(|t| t.start());
        let name = tick.name().to_owned();
        let (held, ctx) = match self.start_tick(&tick, next_start).await? {
            Ok(started) => started,
            Err(reason) => {
                let outcome = Outcome::Skipped { tick: name, reason };
                return Ok(ScheduledRun {
                    outcome,
                    caught_up: Vec::new(),
                });
            }
        };
        let Some(output) = until_lost(&held.lock, job(ctx)).await else {
            let outcome = self.stopped(&held.lock, name);
            return Ok(ScheduledRun {
                outcome,
                caught_up: Vec::new(),
            });
        };
        let outcome = match self
            .record(&held.lock, name.clone(), output, |_| false)
            .await
        {
            Ok(ran) => ran,
            Err(lost) => {
                return Ok(ScheduledRun {
                    outcome: lost,
                    caught_up: Vec::new(),
                });
            }
        };
        let mut caught_up = Vec::new();
        for missed in self.missed(schedule, &tick) {
            let over = next_start.is_some_and(|n| SystemTime::now() >= n);
            if over || held.lock.is_lost() || stop.is_some_and(CancellationToken::is_cancelled) {
                break;
            }
            match self.read_marker(&missed).await {
                Marker::Absent => {}
                Marker::Present(_) => continue,
                Marker::Unreadable(_) => break,
            }
            tracing::info!(job = %self.job, tick = %missed, "catching up a missed tick");
            let ctx = self.context(&missed, &held.lock);
            let missed = missed.name().to_owned();
            let Some(output) = until_lost(&held.lock, job(ctx)).await else {
                caught_up.push(self.stopped(&held.lock, missed));
                break;
            };
            match self.record(&held.lock, missed, output, |_| false).await {
                Ok(ran) => caught_up.push(ran),
                Err(lost) => {
                    caught_up.push(lost);
                    break;
                }
            }
        }
        if !held.lock.is_lost() {
            self.release(held, &name).await;
        }
        Ok(ScheduledRun { outcome, caught_up })
    }

    /// The ticks before `tick` that the catch-up policy names, oldest first: only those whose
    /// markers, had they been written, cannot have expired yet (begun less than the marker
    /// expiry, less the clock skew and one lock ttl, ago).
    fn missed(&self, schedule: &Schedule, tick: &Tick) -> Vec<Tick> {
        let Some(marker_ttl) = self.marker_ttl else {
            return Vec::new();
        };
        let now = SystemTime::now();
        let margin = self.clock_skew.saturating_add(self.ttl);
        let fresh = |t: &Tick| {
            t.start()
                .and_then(|s| s.checked_add(marker_ttl))
                .is_some_and(|end| now.checked_add(margin).is_some_and(|late| late < end))
        };
        let window = match self.catch_up {
            CatchUp::Never => return Vec::new(),
            CatchUp::Latest => None,
            CatchUp::Within(window) => Some(window),
        };
        let Some(from) = tick.start() else {
            return Vec::new();
        };
        let mut missed = Vec::new();
        let mut at = tick.clone();
        while let Some(before) = schedule.before(&at) {
            let within = match window {
                None => missed.is_empty(),
                Some(w) => before
                    .start()
                    .is_some_and(|s| from.duration_since(s).unwrap_or(Duration::MAX) <= w),
            };
            if !within || !fresh(&before) || missed.len() >= MAX_CATCH_UP {
                break;
            }
            missed.push(before.clone());
            at = before;
        }
        missed.reverse();
        missed
    }
}
