//! Time arithmetic of a round: the drift allowance, validity (`ttl - elapsed - drift`), the
//! budget a round may wait, the ttl as the nodes are told it, extension rounds and their
//! outcome, and the random retry pause. Pure: see [`crate::core`].

use std::time::Duration;

use super::quorum::Verdict;

/// The longest ttl a lock (or a max ttl setting) may have: the longest `PX` Redis takes in
/// practice, 49 days.
pub(crate) const MAX_TTL: Duration = Duration::from_millis(u32::MAX as u64);

/// Drift allowance added to every ttl on top of `ttl * drift_factor`, for the timer resolution
/// of the Redis servers (the Redlock spec's "+ 2 milliseconds").
pub(crate) const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Clock-drift allowance for a ttl: `ttl * factor + 2 ms`.
pub(crate) fn drift(ttl: Duration, factor: f64) -> Duration {
    ttl.mul_f64(factor.max(0.0)) + DRIFT_FLOOR
}

/// The least validity a ttl must leave once the drift allowance is taken: one round trip to the
/// nodes (acquire, then extend) with room to spare. A shorter ttl would hand out a lock whose
/// validity is gone before its holder can act on it, or extend it.
pub(crate) const MIN_ROUND_TRIP: Duration = Duration::from_millis(10);

/// The shortest ttl that works with a drift factor: `ttl - drift(ttl) >= MIN_ROUND_TRIP`, in
/// whole milliseconds (13 ms for the default factor 0.01).
pub(crate) fn min_ttl(factor: f64) -> Duration {
    let need = (MIN_ROUND_TRIP + DRIFT_FLOOR).as_secs_f64() / (1.0 - factor.clamp(0.0, 0.5));
    let mut ms = (need * 1000.0).ceil() as u64;
    // Floating point may land a hair short of the rule: the rule decides.
    while Duration::from_millis(ms) < drift(Duration::from_millis(ms), factor) + MIN_ROUND_TRIP {
        ms += 1;
    }
    Duration::from_millis(ms)
}

/// Validity left after an acquisition round: `ttl - elapsed - drift`, or `None` when that is not
/// strictly positive (the lock must then be treated as not acquired).
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// How long a round may keep waiting on nodes: past `ttl - drift` after the round started, a
/// success could no longer leave positive validity.
pub(crate) fn budget(ttl: Duration, drift: Duration) -> Duration {
    ttl.saturating_sub(drift)
}

/// How long an acquisition round may wait for answers, from its start: the node timeout, and
/// never past the budget of the ttl sent (`sent - drift`), after which a quorum could leave no
/// validity.
pub(crate) fn acquire_round(node_timeout: Duration, sent: Duration, drift: Duration) -> Duration {
    node_timeout.min(budget(sent, drift))
}

/// The ttl as the nodes are told it: `PX` in whole milliseconds, rounded down, and the same as
/// a `Duration`. Validity and budgets are computed from this, never from the finer ttl asked
/// for: a node expires the key after what it was sent.
pub(crate) fn sent_ttl(ttl: Duration) -> (u64, Duration) {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    (ms, Duration::from_millis(ms))
}

/// How long an extension round may wait for answers: the node timeout, the budget of the new
/// ttl, and never past the lock's current deadline (`left` from the round's start). An answer
/// after the deadline cannot make the extension gapless, and nothing of the round is sent
/// after it.
pub(crate) fn extend_round(node_timeout: Duration, budget: Duration, left: Duration) -> Duration {
    node_timeout.min(budget).min(left)
}

/// What an extension round amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extension {
    /// A quorum extended it before the deadline: the new validity.
    Extended(Duration),
    /// A quorum extended it before the deadline, but the round left no validity.
    TooSlow,
    /// A quorum no longer holds our value.
    NotOwner,
    /// The deadline passed before a quorum extended it: the lock is lost.
    Expired,
    /// Too few nodes answered, and the lock is still valid.
    Unreachable,
}

/// Decides an extension: `in_time` is whether the verdict was taken before the lock's deadline
/// (as it stood before the round), `validity` the validity a quorum would give. A quorum counts
/// only in time, so a holder told "extended" held the lock without a gap.
pub(crate) fn extension(verdict: Verdict, in_time: bool, validity: Option<Duration>) -> Extension {
    match verdict {
        Verdict::Refused => Extension::NotOwner,
        _ if !in_time => Extension::Expired,
        Verdict::Quorum => validity.map_or(Extension::TooSlow, Extension::Extended),
        Verdict::Unreachable => Extension::Unreachable,
    }
}

/// A pause of `base + jitter * unit`, where `unit` is a uniform random number in `[0, 1)`.
/// Random so that competing clients desynchronise.
pub(crate) fn retry_delay(base: Duration, jitter: Duration, unit: f64) -> Duration {
    base + jitter.mul_f64(unit.clamp(0.0, 1.0))
}

/// The longest the exponential part of [`backoff`] grows to, unless the base is longer.
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(1);

/// The crate's one retry policy: the pause before retry number `attempt` (0-based) is
/// `min(max(base, BACKOFF_CAP), base * 2^attempt) + jitter * unit` (`unit` uniform in
/// `[0, 1)`). Capped exponential, so a retry series that keeps failing (nodes down, notices of
/// release lost) costs ever fewer rounds, with random jitter so that competitors desynchronise.
/// Attempt 0 is the configured pause, `base + jitter * unit`.
pub(crate) fn backoff(base: Duration, jitter: Duration, attempt: u32, unit: f64) -> Duration {
    let cap = base.max(BACKOFF_CAP);
    let grown = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    retry_delay(grown, jitter, unit)
}

/// The longest a waiter refused by a holder sleeps before its next round when no release
/// notice comes (unless the configured retry delay is longer): the retry policy's own cap.
/// It bounds how late a waiter notices a release that published nothing (another Redlock
/// client in compat mode, a Redis Cluster member, a notice lost with every subscription), and
/// it is one round a second per waiting client.
pub(crate) const HOLDER_WAIT_CAP: Duration = BACKOFF_CAP;

/// A waiter whose timer fired reads the holder's key again and sleeps on, without a round,
/// while a quorum will stay held longer than this; closer to the expiry it makes its round
/// (a round trip or so early is cheaper than a second read).
pub(crate) const HOLDER_READ_AGAIN: Duration = Duration::from_millis(2);

/// When a quorum of nodes will be free of the key that refused a waiter, read from each node's
/// `PTTL` of the key (`None`: no answer): `-2` the key is absent (free now), `-1` it never
/// expires, `p >= 0` it expires in `p` ms. The key is free on a quorum once the
/// `quorum - free`-th soonest expiry has passed (plus 1 ms: `PTTL` is whole milliseconds).
/// `Some(ZERO)` when a quorum is free already; `None` when no quorum can become free by
/// expiry alone (too few answers, or keys that never expire).
pub(crate) fn quorum_free_in(pttls: &[Option<i64>], quorum: usize) -> Option<Duration> {
    let free = pttls.iter().filter(|p| **p == Some(-2)).count();
    let Some(need) = quorum.checked_sub(free).filter(|&n| n > 0) else {
        return Some(Duration::ZERO);
    };
    let mut expiring: smallvec::SmallVec<[u64; 8]> = pttls
        .iter()
        .filter_map(|p| p.and_then(|p| u64::try_from(p).ok()))
        .collect();
    expiring.sort_unstable();
    expiring
        .get(need - 1)
        .map(|&ms| Duration::from_millis(ms.saturating_add(1)))
}

/// How long a read of every node (a waiter's `PTTL` reads, its marker, its subscriptions) goes
/// on once a quorum has answered: as long again as the quorum took, and never past `deadline`.
/// The answers still missing then can only refine what the quorum told, so a hung node costs
/// the caller the quorum's own time rather than the node timeout.
pub(crate) fn stragglers_until<T>(start: T, quorum_at: T, deadline: T) -> T
where
    T: Copy + Ord + std::ops::Sub<Output = Duration> + std::ops::Add<Duration, Output = T>,
{
    (quorum_at + (quorum_at - start)).min(deadline)
}

#[cfg(test)]
mod timing_tests {
    use super::*;

    #[test]
    fn the_shortest_ttl_leaves_a_round_trip_after_drift() {
        assert_eq!(min_ttl(0.01), Duration::from_millis(13));
        assert_eq!(min_ttl(0.0), Duration::from_millis(12));
        for factor in [0.0, 0.01, 0.1, 0.25, 0.49] {
            let min = min_ttl(factor);
            assert!(min - drift(min, factor) >= MIN_ROUND_TRIP, "{factor}");
            let less = min - Duration::from_millis(1);
            assert!(less - drift(less, factor) < MIN_ROUND_TRIP, "{factor}");
        }
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_adds_the_jitter() {
        let ms = Duration::from_millis;
        assert_eq!(backoff(ms(50), ms(100), 0, 0.0), ms(50));
        assert_eq!(backoff(ms(50), ms(100), 0, 0.5), ms(100));
        assert_eq!(backoff(ms(50), ms(100), 1, 0.0), ms(100));
        assert_eq!(backoff(ms(50), ms(100), 4, 0.0), ms(800));
        assert_eq!(backoff(ms(50), ms(100), 5, 0.0), BACKOFF_CAP);
        assert_eq!(
            backoff(ms(50), ms(100), u32::MAX, 1.0),
            BACKOFF_CAP + ms(100)
        );
        // A base above the cap is never shortened, never grown.
        let hour = Duration::from_secs(3600);
        assert_eq!(backoff(hour, Duration::ZERO, 9, 0.3), hour);
    }

    #[test]
    fn stragglers_get_as_long_again_as_the_quorum_took_within_the_deadline() {
        let ms = Duration::from_millis;
        assert_eq!(stragglers_until(ms(100), ms(130), ms(1_000)), ms(160));
        assert_eq!(stragglers_until(ms(100), ms(100), ms(1_000)), ms(100));
        assert_eq!(stragglers_until(ms(100), ms(700), ms(1_000)), ms(1_000));
    }

    proptest::proptest! {
        #[test]
        fn the_backoff_never_shrinks_and_stays_bounded(
            base_ms in 0u64..5_000, jitter_ms in 0u64..5_000, attempt in 0u32..64, unit in 0.0f64..1.0,
        ) {
            let (base, jitter) = (Duration::from_millis(base_ms), Duration::from_millis(jitter_ms));
            let d = backoff(base, jitter, attempt, unit);
            let next = backoff(base, jitter, attempt.saturating_add(1), unit);
            proptest::prop_assert!(d >= base && d <= base.max(BACKOFF_CAP) + jitter);
            proptest::prop_assert!(next >= d);
        }
    }

    #[test]
    fn the_sent_ttl_is_whole_milliseconds_rounded_down() {
        assert_eq!(
            sent_ttl(Duration::from_micros(1_000_999)),
            (1000, Duration::from_millis(1000))
        );
        assert_eq!(
            sent_ttl(Duration::from_millis(30_000)),
            (30_000, Duration::from_millis(30_000))
        );
        assert_eq!(sent_ttl(Duration::from_micros(999)), (0, Duration::ZERO));
    }

    #[test]
    fn an_extension_round_never_outlasts_the_lock() {
        let ms = Duration::from_millis;
        assert_eq!(extend_round(ms(300), ms(9_000), ms(5_000)), ms(300));
        assert_eq!(extend_round(ms(8_000), ms(7_900), ms(50)), ms(50));
        assert_eq!(extend_round(ms(300), ms(100), ms(5_000)), ms(100));
        assert_eq!(
            extend_round(ms(300), ms(100), Duration::ZERO),
            Duration::ZERO
        );
    }

    #[test]
    fn a_quorum_after_the_deadline_is_a_loss_not_an_extension() {
        let v = Some(Duration::from_secs(5));
        assert_eq!(
            extension(Verdict::Quorum, true, v),
            Extension::Extended(Duration::from_secs(5))
        );
        assert_eq!(extension(Verdict::Quorum, true, None), Extension::TooSlow);
        assert_eq!(extension(Verdict::Quorum, false, v), Extension::Expired);
        assert_eq!(
            extension(Verdict::Unreachable, false, v),
            Extension::Expired
        );
        assert_eq!(
            extension(Verdict::Unreachable, true, v),
            Extension::Unreachable
        );
        assert_eq!(extension(Verdict::Refused, true, v), Extension::NotOwner);
        assert_eq!(extension(Verdict::Refused, false, v), Extension::NotOwner);
    }

    #[test]
    fn a_quorum_is_free_once_enough_keys_have_expired() {
        let ms = Duration::from_millis;
        // Five nodes, quorum three: two free, the third frees at the soonest expiry.
        let p = [Some(-2), Some(-2), Some(900), Some(300), Some(600)];
        assert_eq!(quorum_free_in(&p, 3), Some(ms(301)));
        // None free: the third soonest.
        let p = [Some(100), Some(500), Some(300), Some(200), Some(400)];
        assert_eq!(quorum_free_in(&p, 3), Some(ms(301)));
        // Already free on a quorum.
        let p = [Some(-2), Some(-2), Some(-2), None, Some(10)];
        assert_eq!(quorum_free_in(&p, 3), Some(Duration::ZERO));
        // Too few answers, or keys that never expire: not by expiry alone.
        let p = [None, None, None, Some(10), Some(20)];
        assert_eq!(quorum_free_in(&p, 3), None);
        let p = [Some(-1), Some(-1), Some(-1), Some(10), Some(20)];
        assert_eq!(quorum_free_in(&p, 3), None);
    }

    proptest::proptest! {
        /// Never before the moment a quorum is free by expiry: at the returned time (less the
        /// millisecond of rounding) at least a quorum of keys is absent or expired, and one
        /// millisecond earlier fewer are (unless free already).
        #[test]
        fn the_quorum_free_time_is_the_first_moment_a_quorum_is_free(
            pttls in proptest::collection::vec(proptest::option::of(-2i64..2_000), 1..8),
        ) {
            let n = pttls.len();
            let quorum = n / 2 + 1;
            let free_at = |t: i64| pttls.iter().filter(|p| match p {
                Some(-2) => true,
                Some(p) if *p >= 0 => *p <= t,
                _ => false,
            }).count();
            match quorum_free_in(&pttls, quorum) {
                Some(d) if d.is_zero() => proptest::prop_assert!(free_at(-1) >= quorum),
                Some(d) => {
                    let t = d.as_millis() as i64 - 1;
                    proptest::prop_assert!(free_at(t) >= quorum);
                    proptest::prop_assert!(free_at(t - 1) < quorum);
                }
                None => proptest::prop_assert!(free_at(i64::MAX) < quorum),
            }
        }
    }
}
