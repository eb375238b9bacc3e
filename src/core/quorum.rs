//! Quorums and verdicts: the majority of N, folding per-node answers into a verdict as soon as
//! it is certain, what a refused acquisition means (held or contended), and who a partial read
//! shows as the holder. Pure: see [`crate::core`].

/// The majority of `n` configured nodes: `n / 2 + 1`. Always from the configured `n`, never from
/// the nodes that happen to be reachable.
pub(crate) const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Whether a release's answers so far tell if our value stood on a quorum, whatever the nodes
/// still unanswered say: `deleted` nodes held it, `absent` nodes no longer did (a node that lost
/// its data, or a key deleted behind our back). A release that cannot tell yet waits for more
/// answers rather than report a lock that did not stand as released.
pub(crate) const fn release_told(n: usize, deleted: usize, absent: usize) -> bool {
    absent == 0 || deleted >= quorum(n) || absent > n - quorum(n)
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

/// The decision of a round, taken as soon as it is certain (its kind included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A quorum said yes.
    Quorum,
    /// The refusals alone rule out a quorum (`no > n - quorum`): the key is held elsewhere
    /// (`Held`, `Lost(NotOwner)`), whatever the other nodes said or would say.
    Refused,
    /// A quorum can no longer say yes, and the refusals alone would not have ruled it out:
    /// nodes failed (`NoQuorum`). A few refusals among failures are an outage, not a holder.
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

    /// A yes that no longer counts (its node turned out to reach the same server as another):
    /// a failure instead.
    pub(crate) fn revoke_yes(&mut self) {
        if self.yes > 0 {
            self.yes -= 1;
            self.failed += 1;
        }
    }

    /// The configured number of nodes.
    pub(crate) fn n(&self) -> usize {
        self.n
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

    /// The verdict, or `None` while the pending nodes could still change it, or change its
    /// kind.
    ///
    /// - [`Verdict::Quorum`] the moment `yes` reaches the quorum (a hung node never delays a
    ///   success);
    /// - [`Verdict::Refused`] the moment the refusals alone exceed `n - quorum`;
    /// - [`Verdict::Unreachable`] once `yes + pending` is below the quorum *and* the refusals
    ///   could not exceed `n - quorum` even if every pending node refused. While they still
    ///   could, the round waits for the pending answers (bounded by its deadline, after which
    ///   they count as failed): the failure is certain, but whether it is an outage or a holder
    ///   is not, and `Held` must never answer an outage (nor `NoQuorum` a holder).
    pub(crate) fn verdict(&self) -> Option<Verdict> {
        let q = quorum(self.n);
        let spare = self.n - q;
        if self.yes >= q {
            Some(Verdict::Quorum)
        } else if self.no > spare {
            Some(Verdict::Refused)
        } else if self.yes + self.pending() < q && self.no + self.pending() <= spare {
            Some(Verdict::Unreachable)
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

/// What a [`Verdict::Refused`] acquisition round means, from the values that refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Some other value holds, or may hold, a quorum: the lock is held.
    Held,
    /// No value can stand on a quorum, even counting every node whose value is unknown for it:
    /// contenders that started together split the nodes. Undo and re-try.
    Contended,
    /// Not yet known: the pending nodes' answers could still make it [`Refusal::Contended`].
    Undecided,
}

/// Classifies a refused acquisition round over `n` nodes. `counts` holds, for each distinct
/// foreign value seen, how many nodes refused with it; `unknown` counts refusals whose value is
/// unknown (plain `SET NX` with fencing off), `failed` and `pending` the nodes without an answer.
///
/// Contention is declared only when it is certain: the largest group plus every node whose
/// value is unknown stays below the quorum. The pending nodes are worth waiting for only when
/// their answers could still make it certain.
pub(crate) fn refusal(
    n: usize,
    counts: &[usize],
    unknown: usize,
    failed: usize,
    pending: usize,
) -> Refusal {
    let q = quorum(n);
    let top = counts.iter().copied().max().unwrap_or(0);
    if top + unknown + failed + pending < q {
        Refusal::Contended
    } else if pending > 0 && top + unknown + failed < q {
        Refusal::Undecided
    } else {
        Refusal::Held
    }
}

/// The refusals of a round grouped by value: each distinct value's count, and how many refusals
/// did not say which value holds the key (`None`).
pub(crate) fn refusal_groups<T: PartialEq>(refusals: &[Option<T>]) -> (Vec<usize>, usize) {
    let mut groups: Vec<(&T, usize)> = Vec::new();
    let mut unknown = 0;
    for r in refusals {
        match r {
            Some(v) => match groups.iter_mut().find(|(w, _)| *w == v) {
                Some((_, c)) => *c += 1,
                None => groups.push((v, 1)),
            },
            None => unknown += 1,
        }
    }
    (groups.into_iter().map(|(_, c)| c).collect(), unknown)
}

/// [`refusal`] from the refusals themselves (the values they named, `None` where unnamed).
pub(crate) fn refusal_of<T: PartialEq>(
    n: usize,
    refusals: &[Option<T>],
    failed: usize,
    pending: usize,
) -> Refusal {
    let (counts, unknown) = refusal_groups(refusals);
    refusal(n, &counts, unknown, failed, pending)
}

/// What an acquisition round amounts to, from its verdict (and, when refused, what the refusals
/// say: [`refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquisition {
    /// A quorum said yes: the lock is ours if validity is left.
    Won,
    /// Refused: held by another owner, or (`contended`) split between contenders that started
    /// together, in which case the attempt is undone and re-tried after a random pause.
    Held { contended: bool },
    /// Too few nodes answered: `NoQuorum`.
    Unreachable,
}

/// Whether the undo of a failed acquisition attempt announces itself to waiters (a release
/// notice, when the waiters marker exists): only when the attempt's value had stood on a
/// quorum (its round won, then failed), holding others off. An undo of a round that did not
/// win releases nothing anyone waits for, and its notice woke every waiter, its own client's
/// included, which tried again at once, failed, undid and woke itself again for as long as the
/// holder's key was missing on some node (`model/waiting.rs` checks the bound and catches
/// that mutant).
pub(crate) const fn undo_announces(stood_on_quorum: bool) -> bool {
    stood_on_quorum
}

/// Whether a run-once tick marker reads as absent, when no node answered with it: the
/// answers from nodes this client has not seen lose their data within the marker's expiry
/// (`clean`) make a quorum. A node that lost its data may have lost the marker with it (its
/// counters are repaired, its markers are not), so its "absent" proves nothing
/// (`docs/safety.md`, "Run-once markers across restarts"; `model/markers.rs` checks it and
/// catches the rule that counted every answer).
pub(crate) const fn marker_absent(clean: usize, quorum: usize) -> bool {
    clean >= quorum
}

/// Whether a node that this client saw lose its data at `loss_seen` (plus the clock skew
/// allowed between instances) may have lost the marker of a tick scheduled to start at
/// `tick_start`: when the start is unknown, or the tick began no later than that. A marker is
/// written only after its tick began (on the writer's clock), so a node that lost its data
/// before then never held it, and its "absent" counts (`model/markers.rs` checks it and
/// catches the rule that held out a tick starting at the very time of the loss too little).
pub(crate) fn loss_may_hide_marker<T: Ord>(tick_start: Option<T>, loss_seen: T) -> bool {
    tick_start.is_none_or(|start| start <= loss_seen)
}

/// Decides an acquisition round. `refusal` is asked only for a refused round (it classifies
/// the refusals: see [`refusal_of`]).
pub(crate) fn acquisition(verdict: Verdict, refusal: impl FnOnce() -> Refusal) -> Acquisition {
    match verdict {
        Verdict::Quorum => Acquisition::Won,
        Verdict::Refused => Acquisition::Held {
            contended: refusal() == Refusal::Contended,
        },
        Verdict::Unreachable => Acquisition::Unreachable,
    }
}

/// What a read of every node says about who holds a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderView<T> {
    /// This value stands on a quorum of the nodes that answered: the current holder.
    Held(T),
    /// Nobody holds the key: no value stands on a quorum, and the nodes that did not answer
    /// could not complete one for any value.
    Vacant,
    /// Cannot tell: no value stands on a quorum of the nodes that answered, but the nodes that
    /// did not answer could complete one (for a value seen, or one not seen at all).
    Unknown,
}

/// The holder a partial read shows: `values` has one entry per node that answered (its value,
/// if any), `unanswered` counts the nodes that did not, `q` is the quorum.
pub(crate) fn holder_view<'a>(
    values: &[Option<&'a str>],
    unanswered: usize,
    q: usize,
) -> HolderView<&'a str> {
    let count = |v: &str| values.iter().filter(|w| **w == Some(v)).count();
    let mut top = 0;
    for v in values.iter().flatten() {
        let c = count(v);
        if c >= q {
            return HolderView::Held(v);
        }
        top = top.max(c);
    }
    if top + unanswered >= q {
        HolderView::Unknown
    } else {
        HolderView::Vacant
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_tells_once_its_value_stood_or_not_on_a_quorum() {
        // Three nodes: one absence is spared, two are not.
        assert!(release_told(3, 0, 0));
        assert!(!release_told(3, 1, 1), "the third answer decides");
        assert!(release_told(3, 2, 1), "stood on two of three");
        assert!(release_told(3, 0, 2), "gone from two of three");
        assert!(!release_told(5, 2, 2));
        assert!(release_told(5, 3, 2));
        assert!(release_told(5, 1, 3));
    }

    use crate::core::timing::{drift, retry_delay, validity};
    use crate::core::token::{FencingToken, fencing_max};
    use proptest::prelude::*;
    use std::time::Duration;

    fn answers() -> impl Strategy<Value = (usize, Vec<Answer>)> {
        (1usize..=9).prop_flat_map(|n| {
            let answer = prop_oneof![Just(Answer::Yes), Just(Answer::No), Just(Answer::Failed)];
            (Just(n), proptest::collection::vec(answer, 0..=n))
        })
    }

    #[test]
    fn refusals_group_by_value_and_count_unnamed_apart() {
        let refusals = [Some("a"), None, Some("b"), Some("a"), None];
        assert_eq!(refusal_groups(&refusals), (vec![2, 1], 2));
        assert_eq!(refusal_groups::<&str>(&[]), (vec![], 0));
        // 2/2/1 of 5 with nothing failed or pending: contention.
        assert_eq!(
            refusal_of(5, &[Some("a"), Some("a"), Some("b"), Some("b")], 0, 0),
            Refusal::Contended
        );
        // The same with one node pending could still be a quorum for "a": undecided.
        assert_eq!(
            refusal_of(5, &[Some("a"), Some("a"), Some("b")], 0, 1),
            Refusal::Undecided
        );
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
    fn three_refusals_of_five_are_held_whatever_else_happens() {
        let mut t = Tally::new(5);
        t.record(Answer::No);
        t.record(Answer::No);
        assert_eq!(t.verdict(), None);
        t.record(Answer::No);
        assert_eq!(t.verdict(), Some(Verdict::Refused));
    }

    /// A refusal among failures: nodes 3 and 4 down, a stale foreign key on node 2.
    #[test]
    fn one_refusal_and_two_failures_of_five_is_unreachable_not_refused() {
        let mut t = Tally::new(5);
        t.record(Answer::Yes);
        t.record(Answer::Yes);
        t.record(Answer::No);
        t.record(Answer::Failed);
        assert_eq!(t.verdict(), None);
        t.record(Answer::Failed);
        assert_eq!(t.verdict(), Some(Verdict::Unreachable));
        // Two refusals and one failure: still an outage, not a holder.
        let mut t = Tally::new(5);
        t.record(Answer::No);
        t.record(Answer::No);
        t.record(Answer::Failed);
        assert_eq!(
            t.verdict(),
            None,
            "the pending two could still make it held"
        );
        t.record(Answer::Yes);
        assert_eq!(t.verdict(), None, "the last one could still refuse");
        assert_eq!(t.final_verdict(), Verdict::Unreachable);
        t.record(Answer::Failed);
        assert_eq!(t.verdict(), Some(Verdict::Unreachable));
    }

    #[test]
    fn three_failures_of_five_is_unreachable() {
        let mut t = Tally::new(5);
        for _ in 0..3 {
            t.record(Answer::Failed);
        }
        assert_eq!(t.verdict(), Some(Verdict::Unreachable));
    }

    #[test]
    fn a_two_two_one_split_is_contention_and_a_quorum_elsewhere_is_held() {
        assert_eq!(refusal(5, &[2, 1], 0, 0, 0), Refusal::Contended);
        assert_eq!(refusal(5, &[1, 1, 1], 0, 0, 0), Refusal::Contended);
        assert_eq!(refusal(5, &[3], 0, 0, 0), Refusal::Held);
        // Two seen, one pending: it could be the third.
        assert_eq!(refusal(5, &[2, 1], 0, 0, 1), Refusal::Undecided);
        assert_eq!(refusal(5, &[2, 1], 0, 1, 0), Refusal::Held);
        // Values unknown (fencing off): never contention.
        assert_eq!(refusal(5, &[], 3, 0, 0), Refusal::Held);
    }

    /// A partial view: the leader's key on {0,1,2}, an observer reaching {1,2,3,4}.
    #[test]
    fn a_partial_view_that_misses_a_holder_is_unknown() {
        let v = Some("leader");
        assert_eq!(holder_view(&[v, v, None, None], 1, 3), HolderView::Unknown);
        assert_eq!(
            holder_view(&[v, v, v, None], 1, 3),
            HolderView::Held("leader")
        );
        assert_eq!(
            holder_view(&[None, None, None, None], 1, 3),
            HolderView::Vacant
        );
        assert_eq!(
            holder_view(&[v, Some("b"), None, None], 1, 3),
            HolderView::Vacant
        );
        assert_eq!(holder_view(&[None, None], 3, 3), HolderView::Unknown);
        assert_eq!(
            holder_view(&[v, v, None, None, None], 0, 3),
            HolderView::Vacant
        );
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
                        // The refusals alone rule a quorum out.
                        prop_assert!(t.no() > n - quorum(n));
                    }
                    Some(Verdict::Unreachable) => {
                        prop_assert!(t.yes() + t.pending() < quorum(n));
                        // Even if every pending node refused, the refusals alone would not.
                        prop_assert!(t.no() + t.pending() <= n - quorum(n));
                    }
                    None => prop_assert!(
                        t.yes() < quorum(n)
                            && (t.yes() + t.pending() >= quorum(n)
                                || t.no() + t.pending() > n - quorum(n))
                    ),
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
                    // Kind included: the first decision is the one we act on.
                    let f = *first.get_or_insert(v);
                    prop_assert_eq!(f, v);
                }
            }
            let fv = t.final_verdict();
            if let Some(f) = first {
                prop_assert_eq!(f, fv);
            }
        }

        #[test]
        fn contention_is_declared_only_when_no_value_can_hold_a_quorum(
            n in 1usize..=9,
            counts in proptest::collection::vec(1usize..5, 0..5),
            unknown in 0usize..3, failed in 0usize..3, pending in 0usize..3,
        ) {
            let q = quorum(n);
            let top = counts.iter().copied().max().unwrap_or(0);
            match refusal(n, &counts, unknown, failed, pending) {
                // Wherever the unknown nodes' values go, no value reaches the quorum.
                Refusal::Contended => prop_assert!(top + unknown + failed + pending < q),
                Refusal::Undecided => prop_assert!(pending > 0),
                Refusal::Held => prop_assert!(top + unknown + failed >= q || (pending == 0 && top + unknown + failed + pending >= q)),
            }
        }

        #[test]
        fn vacant_only_when_no_value_could_stand_on_a_quorum(
            values in proptest::collection::vec(proptest::option::of(0u8..3), 0..9),
            unanswered in 0usize..9,
        ) {
            let n = values.len() + unanswered;
            prop_assume!(n > 0);
            let q = quorum(n);
            let names: Vec<String> = values.iter().map(|v| v.map(|x| x.to_string()).unwrap_or_default()).collect();
            let vals: Vec<Option<&str>> = values.iter().zip(&names).map(|(v, s)| v.map(|_| s.as_str())).collect();
            let count = |x: &str| vals.iter().filter(|w| **w == Some(x)).count();
            let top = vals.iter().flatten().map(|x| count(x)).max().unwrap_or(0);
            match holder_view(&vals, unanswered, q) {
                HolderView::Held(v) => prop_assert!(count(v) >= q),
                // Every value, and a value not seen, stays below the quorum with all the
                // unanswered nodes on its side.
                HolderView::Vacant => prop_assert!(top + unanswered < q),
                HolderView::Unknown => prop_assert!(top < q && top + unanswered >= q),
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
            let tokens: Vec<FencingToken> = counters.iter().map(|&c| FencingToken::new(c)).collect();
            let (max, settled) = fencing_max(&tokens, n).unwrap();
            let max = max.get();
            prop_assert!(counters.iter().all(|&c| c <= max));
            let at_max = counters.iter().filter(|&&c| c == max).count();
            prop_assert_eq!(settled, at_max >= quorum(n));
        }
    }
}
