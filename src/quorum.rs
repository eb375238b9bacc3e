//! The pure core of Redlock: quorum size, clock-drift allowance, validity, folding per-node
//! answers into a verdict, and retry delays. No I/O and no clock reads here, so every rule can
//! be tested exhaustively (see the proptests at the bottom).

use std::time::Duration;

/// Drift allowance added to every ttl on top of `ttl * drift_factor`, for the timer resolution
/// of the Redis servers (the Redlock spec's "+ 2 milliseconds").
pub(crate) const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// The majority of `n` configured nodes: `n / 2 + 1`. Always from the configured `n`, never from
/// the nodes that happen to be reachable.
pub(crate) const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Clock-drift allowance for a ttl: `ttl * factor + 2 ms`.
pub(crate) fn drift(ttl: Duration, factor: f64) -> Duration {
    ttl.mul_f64(factor.max(0.0)) + DRIFT_FLOOR
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

/// One node's answer in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The node did what we asked (set, extended, released).
    Yes,
    /// The node answered, and refused: the key holds someone else's value.
    No,
    /// The node failed: timeout, connection error, held out after a restart, bad reply.
    Failed,
}

/// The decision of a round, taken as soon as it is certain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A quorum said yes.
    Quorum,
    /// A quorum can no longer say yes, and refusals were needed to rule it out: contention.
    Refused,
    /// A quorum can no longer say yes because too many nodes failed, whatever the others said.
    Unreachable,
}

/// Running count of a round's answers over `n` configured nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    n: usize,
    yes: usize,
    no: usize,
    failed: usize,
}

impl Tally {
    pub(crate) const fn new(n: usize) -> Self {
        Tally {
            n,
            yes: 0,
            no: 0,
            failed: 0,
        }
    }

    pub(crate) fn record(&mut self, answer: Answer) {
        match answer {
            Answer::Yes => self.yes += 1,
            Answer::No => self.no += 1,
            Answer::Failed => self.failed += 1,
        }
    }

    pub(crate) fn yes(&self) -> usize {
        self.yes
    }

    pub(crate) fn no(&self) -> usize {
        self.no
    }

    pub(crate) fn failed(&self) -> usize {
        self.failed
    }

    /// Nodes that answered at all.
    pub(crate) fn reached(&self) -> usize {
        self.yes + self.no
    }

    pub(crate) fn pending(&self) -> usize {
        self.n.saturating_sub(self.yes + self.no + self.failed)
    }

    /// The verdict, or `None` while the pending nodes could still change it.
    ///
    /// Success is declared the moment `yes` reaches the quorum; failure the moment
    /// `yes + pending` falls below it. A failure is [`Verdict::Unreachable`] when the failed nodes
    /// alone rule out a quorum (`failed > n - quorum`), [`Verdict::Refused`] otherwise.
    pub(crate) fn verdict(&self) -> Option<Verdict> {
        let q = quorum(self.n);
        if self.yes >= q {
            Some(Verdict::Quorum)
        } else if self.yes + self.pending() < q {
            if self.failed > self.n - q {
                Some(Verdict::Unreachable)
            } else {
                Some(Verdict::Refused)
            }
        } else {
            None
        }
    }

    /// The verdict once no more answers will come (the budget ran out): pending nodes count as
    /// failed.
    pub(crate) fn final_verdict(&self) -> Verdict {
        let mut t = *self;
        t.failed += t.pending();
        t.verdict().unwrap_or(Verdict::Unreachable)
    }
}

/// The delay before retry number `attempt` (0-based): `base + jitter * unit`, where `unit` is a
/// uniform random number in `[0, 1)`. Random so that competing clients desynchronise.
pub(crate) fn retry_delay(base: Duration, jitter: Duration, unit: f64) -> Duration {
    base + jitter.mul_f64(unit.clamp(0.0, 1.0))
}

/// The fencing token of a round: the largest counter among the nodes that said yes, and whether
/// a quorum of them already stands at it (if not, the lower ones must be raised).
pub(crate) fn fencing_max(counters: &[u64], n: usize) -> Option<(u64, bool)> {
    let max = *counters.iter().max()?;
    let at_max = counters.iter().filter(|&&c| c == max).count();
    Some((max, at_max >= quorum(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn answers() -> impl Strategy<Value = (usize, Vec<Answer>)> {
        (1usize..=9).prop_flat_map(|n| {
            let answer = prop_oneof![Just(Answer::Yes), Just(Answer::No), Just(Answer::Failed)];
            (Just(n), proptest::collection::vec(answer, 0..=n))
        })
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(9), 5);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let ttl = Duration::from_secs(10);
        let d = drift(ttl, 0.01);
        assert_eq!(d, Duration::from_millis(102));
        assert_eq!(
            validity(ttl, Duration::from_millis(8), d),
            Some(Duration::from_millis(9890))
        );
        assert_eq!(validity(ttl, Duration::from_millis(9898), d), None);
        assert_eq!(validity(ttl, Duration::from_secs(11), d), None);
    }

    #[test]
    fn two_refusals_and_one_failure_of_five_is_contention() {
        let mut t = Tally::new(5);
        t.record(Answer::No);
        t.record(Answer::No);
        assert_eq!(t.verdict(), None);
        t.record(Answer::Failed);
        assert_eq!(t.verdict(), Some(Verdict::Refused));
    }

    #[test]
    fn three_failures_of_five_is_unreachable_even_with_a_refusal() {
        let mut t = Tally::new(5);
        t.record(Answer::No);
        t.record(Answer::Failed);
        t.record(Answer::Failed);
        assert_eq!(t.verdict(), Some(Verdict::Refused));
        let mut t = Tally::new(5);
        for _ in 0..3 {
            t.record(Answer::Failed);
        }
        assert_eq!(t.verdict(), Some(Verdict::Unreachable));
    }

    #[test]
    fn quorum_is_declared_without_waiting_for_the_rest() {
        let mut t = Tally::new(5);
        for _ in 0..3 {
            t.record(Answer::Yes);
        }
        assert_eq!(t.pending(), 2);
        assert_eq!(t.verdict(), Some(Verdict::Quorum));
    }

    proptest! {
        #[test]
        fn validity_never_exceeds_ttl(ttl_ms in 0u64..10_000_000, elapsed_ms in 0u64..10_000_000, factor in 0.0f64..0.5) {
            let ttl = Duration::from_millis(ttl_ms);
            let d = drift(ttl, factor);
            if let Some(v) = validity(ttl, Duration::from_millis(elapsed_ms), d) {
                prop_assert!(v < ttl);
                prop_assert!(v + d + Duration::from_millis(elapsed_ms) == ttl);
            }
        }

        #[test]
        fn quorum_needs_a_majority_of_yes((n, seq) in answers()) {
            let mut t = Tally::new(n);
            for a in seq {
                t.record(a);
                match t.verdict() {
                    Some(Verdict::Quorum) => prop_assert!(2 * t.yes() > n),
                    Some(Verdict::Refused) => {
                        prop_assert!(t.yes() + t.pending() < quorum(n));
                        prop_assert!(t.no() > 0);
                        prop_assert!(t.failed() <= n - quorum(n));
                    }
                    Some(Verdict::Unreachable) => prop_assert!(t.failed() > n - quorum(n)),
                    None => prop_assert!(t.yes() < quorum(n) && t.yes() + t.pending() >= quorum(n)),
                }
            }
        }

        #[test]
        fn a_verdict_never_changes_once_taken((n, seq) in answers()) {
            let mut t = Tally::new(n);
            let mut first = None;
            for a in seq {
                t.record(a);
                if let Some(v) = t.verdict() {
                    let f = *first.get_or_insert(v);
                    // Success can't turn to failure or back; the kind of failure may only be
                    // read from the first decision, which is the one we act on.
                    prop_assert_eq!(f == Verdict::Quorum, v == Verdict::Quorum);
                }
            }
            let fv = t.final_verdict();
            if let Some(f) = first {
                prop_assert_eq!(f == Verdict::Quorum, fv == Verdict::Quorum);
            }
        }

        #[test]
        fn jitter_stays_within_bounds(base_ms in 0u64..10_000, jitter_ms in 0u64..10_000, unit in 0.0f64..1.0) {
            let base = Duration::from_millis(base_ms);
            let jitter = Duration::from_millis(jitter_ms);
            let d = retry_delay(base, jitter, unit);
            prop_assert!(d >= base && d <= base + jitter);
        }

        #[test]
        fn fencing_max_is_the_largest_counter(counters in proptest::collection::vec(0u64..20, 1..9), n in 1usize..=9) {
            let (max, settled) = fencing_max(&counters, n).unwrap();
            prop_assert!(counters.iter().all(|&c| c <= max));
            let at_max = counters.iter().filter(|&&c| c == max).count();
            prop_assert_eq!(settled, at_max >= quorum(n));
        }
    }
}

#[cfg(test)]
mod timing_tests {
    use super::*;

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
}
