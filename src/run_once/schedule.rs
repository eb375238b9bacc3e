//! A job on a schedule: the ticks of a [`Schedule`], one scheduled run with its catch-up
//! ([`RunOnce::run_scheduled`]), and the loop that runs a job on every tick until told to stop
//! ([`RunOnce::run_every`]).

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::marker::Marker;
use super::{CatchUp, Outcome, RunOnce, Tick, TickContext, not_before, until_lost};
use crate::error::{ConfigError, Error, Setting};

/// The most missed ticks one scheduled run looks back at ([`CatchUp::Within`]).
const MAX_CATCH_UP: usize = 1000;

/// When a job's ticks begin: every fixed period counted from the Unix epoch
/// ([`every`](Self::every)), or at the times a cron expression names, in UTC
/// (`Schedule::cron`, feature `cron`). Instances whose clocks agree compute the same ticks.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use quorumlock::Schedule;
///
/// let every = Schedule::every(Duration::from_secs(60)).unwrap();
/// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(3_725);
/// assert_eq!(every.tick_at(at).unwrap().name(), "62");
/// assert_eq!(every.next_after(at).unwrap().name(), "63");
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Every(Duration),
    #[cfg(feature = "cron")]
    Cron(Box<croner::Cron>),
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
        Ok(Schedule {
            kind: Kind::Every(period),
        })
    }

    /// A tick at every time a cron expression names, in UTC: five fields (minute, hour, day of
    /// month, month, day of week) or six (seconds first), with the extensions of the `croner`
    /// crate (`L`, `W`, `#`, nicknames such as `@daily`). A tick is named by its start, in
    /// seconds since the Unix epoch.
    ///
    /// ```
    /// # #[cfg(feature = "cron")] {
    /// use std::time::{Duration, SystemTime};
    /// use quorumlock::Schedule;
    ///
    /// let nightly = Schedule::cron("30 2 * * *").unwrap();
    /// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(86_400 + 3_600);
    /// let next = nightly.next_after(at).unwrap();
    /// assert_eq!(next.name(), (86_400 + 9_000).to_string());
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::Cron`] for an expression that does not parse.
    #[cfg(feature = "cron")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
    pub fn cron(expression: &str) -> Result<Schedule, ConfigError> {
        let cron = croner::parser::CronParser::new()
            .parse(expression)
            .map_err(|e| ConfigError::Cron {
                expression: expression.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Schedule {
            kind: Kind::Cron(Box::new(cron)),
        })
    }

    /// The tick `at` falls in: the latest that began at or before it (`None` when the schedule
    /// has none).
    pub fn tick_at(&self, at: SystemTime) -> Option<Tick> {
        match &self.kind {
            Kind::Every(period) => Some(Tick::of(at, *period)),
            #[cfg(feature = "cron")]
            Kind::Cron(cron) => cron_tick(cron.find_previous_occurrence(&utc(at), true)),
        }
    }

    /// The first tick that begins after `at` (`None` when the schedule has none).
    pub fn next_after(&self, at: SystemTime) -> Option<Tick> {
        match &self.kind {
            Kind::Every(period) => {
                let next = Tick::of(at, *period).start()?.checked_add(*period)?;
                Some(Tick::of(next, *period))
            }
            #[cfg(feature = "cron")]
            Kind::Cron(cron) => cron_tick(cron.find_next_occurrence(&utc(at), false)),
        }
    }

    /// The tick before `tick`, if `tick` has a start and the schedule one before it.
    pub fn before(&self, tick: &Tick) -> Option<Tick> {
        let start = tick.start()?;
        match &self.kind {
            Kind::Every(period) => Some(Tick::of(start.checked_sub(*period)?, *period)),
            #[cfg(feature = "cron")]
            Kind::Cron(cron) => cron_tick(cron.find_previous_occurrence(&utc(start), false)),
        }
    }

    /// The tick after `tick`, if `tick` has a start and the schedule one after it.
    pub fn after(&self, tick: &Tick) -> Option<Tick> {
        self.next_after(tick.start()?)
    }

    /// The job's lock ttl when none is given: a third of the period (of the gap between the
    /// first two ticks from now, for a cron schedule), at least 1 s, at most the default 30 s.
    fn lock_ttl(&self) -> Duration {
        let gap = match &self.kind {
            Kind::Every(period) => *period,
            #[cfg(feature = "cron")]
            Kind::Cron(_) => {
                let first = self.next_after(SystemTime::now());
                let second = first.as_ref().and_then(|t| self.after(t));
                match (
                    first.and_then(|t| t.start()),
                    second.and_then(|t| t.start()),
                ) {
                    (Some(a), Some(b)) => b.duration_since(a).unwrap_or_default(),
                    _ => super::RunOnceBuilder::DEFAULT_TTL,
                }
            }
        };
        (gap / 3).clamp(Duration::from_secs(1), super::RunOnceBuilder::DEFAULT_TTL)
    }
}

#[cfg(feature = "cron")]
fn utc(at: SystemTime) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::<chrono::Utc>::from(at)
}

/// A cron occurrence as a tick, named by its start in seconds since the Unix epoch.
#[cfg(feature = "cron")]
fn cron_tick(
    occurrence: Result<chrono::DateTime<chrono::Utc>, croner::errors::CronError>,
) -> Option<Tick> {
    let start = SystemTime::from(occurrence.ok()?);
    let secs = start.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    Some(Tick::starting(secs, start))
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
    /// catch-up. A catch-up yields to the next tick: it starts only if a run as long as the
    /// longest of this call would end before the next tick begins (a deferred tick is left to
    /// the next run, within the policy), and catching up stops when the lock is lost.
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
    /// job.run_every(Schedule::every(Duration::from_secs(60))?, stop, |ctx| async move {
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
        schedule: Schedule,
        stop: CancellationToken,
        mut job: F,
    ) -> Result<(), Error>
    where
        F: FnMut(TickContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut next = schedule.next_after(SystemTime::now());
        // A schedule without another tick ends the loop.
        while let Some(tick) = next {
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(()),
                () = not_before(tick.start()) => {}
            }
            let following = schedule.after(&tick);
            let done = self
                .scheduled(&schedule, tick, &mut job, Some(&stop))
                .await?;
            self.report_scheduled(&done);
            if stop.is_cancelled() {
                return Ok(());
            }
            // A tick that began while this one ran is skipped: the next scheduled run catches
            // it up if the policy says so.
            let upcoming = schedule.next_after(SystemTime::now());
            next = match (following, upcoming) {
                (Some(f), Some(u)) if f.start() > u.start() => Some(f),
                (_, upcoming) => upcoming,
            };
        }
        Ok(())
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
        let began = std::time::Instant::now();
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
        // The longest run so far: a catch-up starts only if one that long would end before
        // the next tick begins, so that it does not hold the lock into the next tick (whose
        // instances would skip it as running). A deferred tick is the next run's to catch up.
        let mut longest = began.elapsed();
        let mut caught_up = Vec::new();
        for missed in self.missed(schedule, &tick) {
            let late = SystemTime::now().checked_add(longest);
            let over = next_start.is_some_and(|n| late.is_none_or(|end| end >= n));
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
            let began = std::time::Instant::now();
            let Some(output) = until_lost(&held.lock, job(ctx)).await else {
                caught_up.push(self.stopped(&held.lock, missed));
                break;
            };
            longest = longest.max(began.elapsed());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn an_interval_steps_by_its_period() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        let tick = every.tick_at(at(3_725)).unwrap();
        assert_eq!((tick.name(), tick.start()), ("62", Some(at(3_720))));
        assert_eq!(every.before(&tick).unwrap().name(), "61");
        assert_eq!(every.after(&tick).unwrap().start(), Some(at(3_780)));
        assert_eq!(every.lock_ttl(), Duration::from_secs(20));
        assert!(Schedule::every(Duration::ZERO).is_err());
    }

    #[cfg(feature = "cron")]
    #[test]
    fn a_cron_expression_names_its_ticks_by_their_start() {
        // Every 15 minutes.
        let cron = Schedule::cron("*/15 * * * *").unwrap();
        let tick = cron.tick_at(at(3_725)).unwrap();
        assert_eq!((tick.name(), tick.start()), ("3600", Some(at(3_600))));
        // A tick's own start is its tick.
        assert_eq!(cron.tick_at(at(3_600)).unwrap(), tick);
        assert_eq!(cron.before(&tick).unwrap().start(), Some(at(2_700)));
        assert_eq!(cron.after(&tick).unwrap().start(), Some(at(4_500)));
        assert_eq!(cron.next_after(at(3_600)).unwrap().start(), Some(at(4_500)));
        assert_eq!(cron.lock_ttl(), Duration::from_secs(30));
        // Seconds first, when six fields are given.
        let fast = Schedule::cron("*/3 * * * * *").unwrap();
        assert_eq!(fast.lock_ttl(), Duration::from_secs(1));
        let e = Schedule::cron("61 * * * *").unwrap_err();
        assert!(e.to_string().contains("invalid cron expression"), "{e}");
    }
}
