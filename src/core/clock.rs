//! The clock lock deadlines are measured on.
//!
//! `Instant` (std's and tokio's) is `CLOCK_MONOTONIC` on Linux, which stops while the machine or
//! VM is suspended: a holder that resumes after its lock's deadline would still believe the lock
//! valid. Deadlines are therefore read from a clock that counts a suspend where the platform
//! has one:
//!
//! - Linux and Android: `CLOCK_BOOTTIME` (monotonic, and it includes time spent suspended).
//! - Elsewhere: `std::time::Instant`, the platform's monotonic clock. Whether it counts a
//!   suspend depends on the platform (macOS' does not; Windows' counts a sleep); there a
//!   suspend longer than a lock's validity goes unnoticed, as before.
//!
//! Timers still sleep on tokio's clock (which is `Instant`). Anything that sleeps until a
//! deadline sleeps at most [`SLICE`] at a time and re-reads this clock on every wake, so after a
//! resume it notices a deadline that passed during the suspend within [`SLICE`].

use std::time::Duration;

/// The longest a timer waiting for a lock's deadline sleeps before re-reading the deadline
/// clock: how late, after a resume, a lost signal can fire for a deadline that passed during
/// the suspend.
pub(crate) const SLICE: Duration = Duration::from_millis(250);

/// The wall clock, in ms since the Unix epoch (0 before it, saturating far after): the time a
/// lock value records ([`super::value::new_value`]). Never used for a deadline.
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A reading of the deadline clock: the time since its origin (boot, on Linux).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Stamp(Duration);

/// Reads the deadline clock.
pub(crate) fn now() -> Stamp {
    Stamp(read())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn read() -> Duration {
    // CLOCK_BOOTTIME exists on every kernel Rust supports, so this cannot fail in practice. If
    // it did, the reading is "infinitely late": every lock reads as expired (the safe side).
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .unwrap_or(Duration::MAX)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn read() -> Duration {
    static ORIGIN: std::sync::LazyLock<std::time::Instant> =
        std::sync::LazyLock::new(std::time::Instant::now);
    ORIGIN.elapsed()
}

impl Stamp {
    /// This reading plus `d`, saturating (a user-supplied duration never panics).
    pub(crate) fn saturating_add(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_add(d))
    }

    /// How long after `earlier` this reading is; zero if it is not after.
    pub(crate) fn saturating_duration_since(self, earlier: Stamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// The time since the clock's origin (for the testkit's clock readings, the tests, and
    /// the clock-jump check's readings).
    pub(crate) fn since_origin(self) -> Duration {
        self.0
    }

    /// How long until this reading, from now; zero if it has passed.
    pub(crate) fn remaining(self) -> Duration {
        self.saturating_duration_since(now())
    }

    /// The `std::time::Instant` of this reading, as the two clocks stand now (they drift apart
    /// by the time spent suspended, so convert at the moment of use).
    pub(crate) fn to_std(self) -> std::time::Instant {
        let (at, here) = (std::time::Instant::now(), now());
        if self >= here {
            at.checked_add(self.0 - here.0).unwrap_or(at)
        } else {
            at.checked_sub(here.0 - self.0).unwrap_or(at)
        }
    }

    /// When a timer sleeping on tokio's clock must next wake to check this deadline: at the
    /// deadline, or after [`SLICE`] if that is sooner.
    pub(crate) fn next_wake(self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.remaining().min(SLICE)
    }
}

/// `base + d` on tokio's clock, saturating far in the future instead of panicking (for
/// user-supplied durations).
pub(crate) fn tokio_after(base: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    /// About 30 years: later than anything waits, early enough for any platform's `Instant`.
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    base.checked_add(d.min(FAR)).unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_saturate_instead_of_overflowing() {
        let s = Stamp(Duration::from_secs(5));
        assert_eq!(s.saturating_add(Duration::MAX), Stamp(Duration::MAX));
        assert_eq!(
            s.saturating_duration_since(Stamp(Duration::from_secs(7))),
            Duration::ZERO
        );
        assert_eq!(
            Stamp(Duration::from_secs(7)).saturating_duration_since(s),
            Duration::from_secs(2)
        );
        let now = tokio::time::Instant::now();
        assert!(tokio_after(now, Duration::MAX) > now);
    }

    #[test]
    fn the_clock_never_goes_back_and_converts_both_ways() {
        let a = now();
        let b = now();
        assert!(b >= a);
        let later = a.saturating_add(Duration::from_secs(10));
        let std_later = later.to_std();
        let left = std_later.saturating_duration_since(std::time::Instant::now());
        assert!(left <= Duration::from_secs(10), "{left:?}");
        assert!(left >= Duration::from_secs(9), "{left:?}");
        assert!(later.next_wake() <= tokio::time::Instant::now() + SLICE);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn on_linux_it_is_clock_boottime() {
        let boot = Duration::from(
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("boottime"),
        );
        assert!(now().since_origin().abs_diff(boot) < Duration::from_millis(100));
    }
}
