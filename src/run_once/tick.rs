//! A tick: the name of one scheduled run of a job (in its marker's key), and when that run was
//! scheduled to start ([`Tick`]).

use std::fmt;
use std::time::{Duration, SystemTime};

/// One scheduled run of a job: its name, which every instance computes alike (it names the
/// tick's marker), and, when known, the time it was scheduled to start.
///
/// The start lets a tick outlive a node's data loss: a tick's marker is written only after the
/// tick began, so a node that lost its data before that cannot have lost the marker, and its
/// answers count for the tick at once. A tick whose start is unknown (one made from a bare
/// name or number) treats every node that lost its data within the marker's expiry as unable
/// to prove the marker absent, which can skip every tick for that long after a restart: give
/// the start whenever the schedule knows it ([`Tick::of`], [`Tick::starting`]).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use quorumlock::Tick;
///
/// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(3_725);
/// let tick = Tick::of(at, Duration::from_secs(60));
/// assert_eq!(tick.name(), "62");
/// assert_eq!(tick.start(), Some(SystemTime::UNIX_EPOCH + Duration::from_secs(3_720)));
/// assert_eq!(Tick::from(7).name(), "7");
/// assert_eq!(Tick::from("nightly").start(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tick {
    name: String,
    start: Option<SystemTime>,
}

impl Tick {
    /// A tick known by its name alone (its start unknown).
    pub fn new(name: impl fmt::Display) -> Tick {
        Tick {
            name: name.to_string(),
            start: None,
        }
    }

    /// A tick named `name`, scheduled to start at `start`. Every instance must give the same
    /// start for the same name (as computed from a shared schedule).
    pub fn starting(name: impl fmt::Display, start: SystemTime) -> Tick {
        Tick {
            name: name.to_string(),
            start: Some(start),
        }
    }

    /// The tick of a fixed period that `at` falls in: named [`tick_of`] (whole periods since
    /// the Unix epoch), starting at the beginning of its period.
    pub fn of(at: SystemTime, period: Duration) -> Tick {
        let n = tick_of(at, period);
        let period_ms = u64::try_from(period.as_millis().max(1)).unwrap_or(u64::MAX);
        let start = n
            .checked_mul(period_ms)
            .and_then(|ms| SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms)));
        Tick {
            name: n.to_string(),
            start,
        }
    }

    /// The tick's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the tick was scheduled to start, if known.
    pub fn start(&self) -> Option<SystemTime> {
        self.start
    }
}

impl fmt::Display for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

macro_rules! tick_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Tick {
            fn from(name: $t) -> Tick {
                Tick::new(name)
            }
        }
    )*};
}

tick_from!(u64, u32, i64, i32, usize, &str, String, &String);

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
        let tick = Tick::of(at, Duration::from_secs(3_600));
        assert_eq!(tick.name(), "1");
        assert_eq!(
            tick.start(),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(3_600))
        );
    }
}
