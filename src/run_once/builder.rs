//! Configuring a [`RunOnce`]: its builder, and the policies a scheduler needs (what a failed
//! job means, overlapping runs, catching up missed ticks, a minimum hold).

use std::time::Duration;

use super::RunOnce;
use crate::error::{ConfigError, Setting};
use crate::lock::redlock::Redlock;

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
/// | lock ttl | [`DEFAULT_TTL`](Self::DEFAULT_TTL) (30 s); on a [`Schedule`](super::Schedule), a third of its period (1 s to 30 s); extended every ttl / 3 while the job runs |
/// | tick marker expiry | [`DEFAULT_MARKER_TTL`](Self::DEFAULT_MARKER_TTL) (1 h) |
/// | instance id (stored in markers) | `"<pid>-<4 random hex digits>"` |
/// | what a failed job means | [`RunPolicy::AtMostOnce`]: the tick is done |
/// | clock skew between instances | [`DEFAULT_CLOCK_SKEW`](Self::DEFAULT_CLOCK_SKEW) (1 s) |
/// | a tick while the previous run goes on | [`Overlap::Skip`] |
/// | missed ticks (with a [`Schedule`](super::Schedule)) | [`CatchUp::Latest`]: the previous tick, if it never ran |
/// | minimum hold | none: the lock is released when the run is over |
///
/// # What the ttl costs a crashed run
///
/// The lock is extended while the job runs, so its ttl matters only when an instance dies
/// mid-run: the job then stays locked for up to one ttl, and every tick that begins meanwhile
/// is skipped as [`SkipReason::Running`](super::SkipReason::Running). The crashed tick and
/// those are caught up only as the [`CatchUp`] policy says ([`CatchUp::Latest`]: the one
/// before the first tick that runs again). Choose a ttl well below the period (a third of it,
/// say, for short jobs): then a crash costs no tick beyond the one caught up.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build() is called"]
pub struct RunOnceBuilder {
    locks: Redlock,
    job: String,
    ttl: Option<Duration>,
    marker_ttl: Option<Duration>,
    instance: Option<String>,
    policy: RunPolicy,
    clock_skew: Duration,
    overlap: Overlap,
    catch_up: CatchUp,
    hold_at_least: Duration,
}

impl RunOnce {
    /// Starts configuring the run-once helper for a job over the nodes of `locks`.
    pub fn builder(locks: Redlock, job: impl Into<String>) -> RunOnceBuilder {
        RunOnceBuilder {
            locks,
            job: job.into(),
            ttl: None,
            marker_ttl: Some(RunOnceBuilder::DEFAULT_MARKER_TTL),
            instance: None,
            policy: RunPolicy::default(),
            clock_skew: RunOnceBuilder::DEFAULT_CLOCK_SKEW,
            overlap: Overlap::default(),
            catch_up: CatchUp::default(),
            hold_at_least: Duration::ZERO,
        }
    }
}

/// What a tick does when the job's previous run is still going (its lock held), set with
/// [`RunOnceBuilder::overlap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlap {
    /// Skip the tick ([`SkipReason::Running`](super::SkipReason::Running)); the default. With a
    /// [`CatchUp`] policy the skipped tick may be caught up later.
    #[default]
    Skip,
    /// Wait for the previous run to end (woken by its release notice, or its lock's expiry),
    /// then run the tick if it has not run; give up when the next tick of the
    /// [`Schedule`](super::Schedule) begins, or after one lock ttl without a schedule.
    RunAfter,
}

/// Which missed ticks of a [`Schedule`](super::Schedule) are run late, set with
/// [`RunOnceBuilder::catch_up`]. A missed tick is one without a marker: nobody ran it (a
/// crashed run, a tick skipped while that run held the lock, an outage), or its run failed
/// under [`RunPolicy::RetryOnFailure`]. Catching up happens after the current tick ran, by
/// the instance that ran it, under the same lock: it never makes another instance skip the
/// current tick, and it stops when the next tick begins. Each tick still runs at most once
/// (its marker), and only ticks whose markers cannot have expired yet are candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CatchUp {
    /// Never run a tick late.
    Never,
    /// Run the tick just before the current one, if it never ran: for jobs where only the
    /// latest run matters (a report, a cache refresh). The default.
    #[default]
    Latest,
    /// Run every tick that began within this long before the current one and never ran,
    /// oldest first: for jobs where each tick's work matters (a daily export).
    Within(Duration),
}

impl RunOnceBuilder {
    /// The default ttl of the job's lock.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// The default expiry of a tick marker.
    pub const DEFAULT_MARKER_TTL: Duration = Duration::from_secs(3600);
    /// The default for how far apart the instances' clocks may be.
    pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);

    /// How far apart the instances' wall clocks may be (default 1 s). A tick whose start is
    /// known ([`Tick::of`](super::Tick::of), [`Tick::starting`](super::Tick::starting)) counts the answers of a node this client saw
    /// lose its data when the tick began more than this after the loss was seen: an instance
    /// whose clock runs ahead by this much began the tick (and wrote its marker) that much
    /// earlier.
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }

    /// The ttl of the job's lock (extended while the job runs): how long a crashed instance's
    /// run blocks the job. Without it: [`DEFAULT_TTL`](Self::DEFAULT_TTL), or on a
    /// [`Schedule`](super::Schedule) a third of the period (at least 1 s, at most 30 s), so that
    /// a crash blocks no tick after its own.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
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

    /// What a tick does when the previous run still holds the job's lock: skip
    /// ([`Overlap::Skip`], the default) or run once that run is over ([`Overlap::RunAfter`]).
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }

    /// Which missed ticks (never run: skipped while a crashed run held the lock, or while too
    /// few nodes answered) the instance that runs a tick of a [`Schedule`](super::Schedule)
    /// runs next, each at most once ([`CatchUp::Latest`] by default). Needs tick markers.
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Keeps the job's lock at least this long after it was taken, however fast the job
    /// (ShedLock's `lockAtLeastFor`): the lock is left to expire then instead of released.
    /// Instances whose clocks are behind then find the job held rather than run it again, even
    /// without tick markers. Default: none.
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = hold;
        self
    }

    /// Builds the helper. No connection is made.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroDuration`] for a zero marker expiry,
    /// [`ConfigError::FencingRequired`] for a lock client with fencing off (runs are told
    /// apart by their tokens). An invalid job name or ttl is reported by the first
    /// [`run`](RunOnce::run) as [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    pub fn build(self) -> Result<RunOnce, ConfigError> {
        if self.marker_ttl.is_some_and(|t| t.as_millis() == 0) {
            return Err(ConfigError::ZeroDuration(Setting::TickMarkerTtl));
        }
        if !self.locks.engine().fencing() {
            return Err(ConfigError::FencingRequired);
        }
        Ok(RunOnce {
            instance: self
                .instance
                .unwrap_or_else(|| format!("{}-{:04x}", std::process::id(), rand::random::<u16>())),
            locks: self.locks,
            job: self.job,
            ttl: self.ttl.unwrap_or(RunOnceBuilder::DEFAULT_TTL),
            ttl_given: self.ttl.is_some(),
            marker_ttl: self.marker_ttl,
            policy: self.policy,
            clock_skew: self.clock_skew,
            overlap: self.overlap,
            catch_up: self.catch_up,
            hold_at_least: self.hold_at_least,
            outage: std::sync::Arc::default(),
        })
    }
}
