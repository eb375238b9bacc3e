//! The judge: pure functions over a [`History`], no I/O and no clock. Unit-tested on hand-made
//! histories in `t10_checker.rs`, including histories with each kind of violation.
//!
//! What it reports:
//! - **overlaps**: two critical sections (`[acquired, release-or-validity-end]`) that intersect:
//!   mutual exclusion broken;
//! - **token regressions**: a section whose token is not above every token handed out before it
//!   was acquired;
//! - **past-validity writes**: a write to the resource started after its lock's validity ended
//!   (the client could not know: it was paused, or its validity was cut short);
//! - **hung operations**: a call that took longer than its bound (time its process was frozen by
//!   SIGSTOP does not count);
//! - **uncaught**: what fencing did not stop: the resource accepted a lower token after a higher
//!   one, or two sessions with the same token both wrote while their activity overlapped (the
//!   resource cannot tell them apart);
//! - **caught**: stale writes rejected that came from a session that overlapped another or wrote
//!   past its validity: the violations fencing made harmless;
//! - **liveness**: after each fault healed, how long until the lock was acquired again (before
//!   the next fault; the nemesis waits for that, up to the bound, before its next fault, so a
//!   slow recovery is seen after every heal), and the worst gap with no section at all;
//! - **starved**: a fault that left some client a healthy majority, long enough that the lock
//!   should have been acquired during it (see
//!   [`available_after`](crate::history::Fault::available_after)), in which nobody acquired it
//!   and no attempt was even refused by a quorum holding it. Refusals are contention: clients
//!   that each hold part of the nodes (a round that waits for an unanswering node keeps its
//!   partial keys for the node timeout) can keep one another out for a while, which Redlock
//!   does not promise to avoid; a window with neither shows the fault took more than it should
//!   have, or the clients stopped trying. Only a fault that no other fault overlaps is judged:
//!   two faults that each leave a majority can together leave none;
//! - **misreported held**: an acquisition that ended as `held` inside a window where the refusals
//!   alone could not rule out a quorum (a foreign key on a minority, other nodes failed): an
//!   outage reported as a holder, which callers skip quietly (issue 12 item 6);
//! - **harness trouble**: child lines that did not parse, writes whose outcome is unknown, and
//!   incidents (a client that did not stop, a child that had to be killed). Each fails a run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use crate::history::{History, Mono, OpKind, Section, SessionId, Write};

/// A fault during which the lock must stay available has to last this much longer than its
/// `available_after` before a lack of acquisitions counts as starvation.
pub const STARVE_MIN: Duration = Duration::from_secs(1);

/// Fencing did not make a violation harmless.
#[derive(Debug, Clone, PartialEq)]
pub enum Uncaught {
    /// Write `later` (lower token) was accepted after write `earlier` (higher token) had been.
    OrderBroken { earlier: usize, later: usize },
    /// Two sessions with the same token both had writes accepted while both were active.
    SharedToken {
        a: SessionId,
        b: SessionId,
        token: u64,
    },
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub sections: usize,
    pub writes: usize,
    pub ops: usize,
    pub overlaps: Vec<(SessionId, SessionId)>,
    /// (session that held the highest token so far, later session whose token was not above it)
    pub token_regressions: Vec<(SessionId, SessionId)>,
    /// Indices into `History::writes`.
    pub past_validity: Vec<usize>,
    /// Indices into `History::ops`.
    pub hung: Vec<usize>,
    pub uncaught: Vec<Uncaught>,
    pub stale_rejected: usize,
    /// Rejected writes from sessions that overlapped another or wrote past their validity.
    pub caught: usize,
    /// Per fault (same order as `History::faults`): time from its heal to the next acquisition
    /// before the next fault (None: none in that window).
    pub reacquired: Vec<Option<Duration>>,
    /// Faults after which the lock was not acquired again within the bound (a window cut short
    /// by the next fault before the bound does not count).
    pub slow_recoveries: Vec<usize>,
    /// The longest time with no critical section at all (from the start of the history to its
    /// end, so a lock that never came back counts until the run stopped).
    pub worst_gap: Duration,
    /// Per fault: acquisitions from its injection to its heal.
    pub during: Vec<usize>,
    /// Faults long enough for their `available_after` promise to be judged.
    pub judged: Vec<usize>,
    /// Judged faults with no acquisition during them, but attempts refused by a quorum that
    /// held the lock: contention, not unavailability (not a violation; printed).
    pub contended: Vec<usize>,
    /// Faults that should have seen an acquisition during them (see
    /// [`available_after`](crate::history::Fault::available_after)) and saw none.
    pub starved: Vec<usize>,
    /// Clock jumps made, and how many of them expired a bare-majority holder's key.
    pub clock_jumps: usize,
    pub jumps_fired: usize,
    /// Acquisitions (indices into `History::ops`) that ended inside a `held_impossible` window.
    pub held_judged: Vec<usize>,
    /// Those of them that ended as `held`.
    pub misreported_held: Vec<usize>,
    pub malformed: usize,
    pub unfinished_writes: usize,
    pub incidents: usize,
}

impl Report {
    /// Every violation of safety or liveness found.
    pub fn violations(&self) -> usize {
        self.overlaps.len()
            + self.token_regressions.len()
            + self.past_validity.len()
            + self.hung.len()
            + self.uncaught.len()
            + self.slow_recoveries.len()
            + self.starved.len()
            + self.misreported_held.len()
            + self.harness_trouble()
    }

    /// Child lines that did not parse, writes with unknown outcome, incidents.
    pub fn harness_trouble(&self) -> usize {
        self.malformed + self.unfinished_writes + self.incidents
    }

    /// The longest heal-to-acquisition time seen (None when no fault was followed by one).
    pub fn worst_reacquire(&self) -> Option<Duration> {
        self.reacquired.iter().flatten().max().copied()
    }
}

/// Judges `h`; the lock must be acquired again within `reacquire_bound` of every heal.
pub fn check(h: &History, reacquire_bound: Duration) -> Report {
    let mut order: Vec<usize> = (0..h.sections.len()).collect();
    order.sort_by_key(|&i| (h.sections[i].acquired, h.sections[i].session));
    let sections: Vec<&Section> = order.iter().map(|&i| &h.sections[i]).collect();

    let overlaps = overlaps(&sections);
    let token_regressions = token_regressions(&sections);
    let past_validity = past_validity(h, &sections);
    let hung = hung(h);

    let mut uncaught = order_broken(&h.writes);
    uncaught.extend(shared_tokens(h));

    let suspect: HashSet<SessionId> = overlaps.iter().flat_map(|&(a, b)| [a, b]).collect();
    let past: HashSet<usize> = past_validity.iter().copied().collect();
    let rejected = || h.writes.iter().enumerate().filter(|(_, w)| !w.accepted);
    let stale_rejected = rejected().count();
    let caught = rejected()
        .filter(|(i, w)| suspect.contains(&w.session) || past.contains(i))
        .count();

    let (reacquired, slow_recoveries) = recoveries(h, &sections, reacquire_bound);
    let starvation = starvation(h, &sections);
    let (held_judged, misreported_held) = held_misreports(h);

    Report {
        sections: h.sections.len(),
        writes: h.writes.len(),
        ops: h.ops.len(),
        overlaps,
        token_regressions,
        past_validity,
        hung,
        uncaught,
        stale_rejected,
        caught,
        reacquired,
        slow_recoveries,
        worst_gap: worst_gap(h, &sections),
        during: starvation.during,
        judged: starvation.judged,
        contended: starvation.contended,
        starved: starvation.starved,
        clock_jumps: h.clock_jumps.len(),
        jumps_fired: h.clock_jumps.iter().filter(|j| j.fired()).count(),
        held_judged,
        misreported_held,
        malformed: h.malformed.len(),
        unfinished_writes: h.unfinished_writes.len(),
        incidents: h.incidents.len(),
    }
}

/// Pairs of sections that overlap in time: a sweep in acquisition order.
fn overlaps(sections: &[&Section]) -> Vec<(SessionId, SessionId)> {
    let mut overlaps = Vec::new();
    for (i, a) in sections.iter().enumerate() {
        for b in &sections[i + 1..] {
            if b.acquired >= a.end() {
                break;
            }
            overlaps.push((a.session, b.session));
        }
    }
    overlaps
}

/// Sections whose token did not grow with acquisition order, each with the holder of the
/// highest token before it.
fn token_regressions(sections: &[&Section]) -> Vec<(SessionId, SessionId)> {
    let mut token_regressions = Vec::new();
    let mut highest: Option<(u64, SessionId)> = None;
    for s in sections {
        match highest {
            Some((t, holder)) if s.token <= t => token_regressions.push((holder, s.session)),
            _ => highest = Some((s.token, s.session)),
        }
    }
    token_regressions
}

/// Writes started after their section's validity ended.
fn past_validity(h: &History, sections: &[&Section]) -> Vec<usize> {
    let by_session: HashMap<SessionId, _> = sections.iter().map(|s| (s.session, *s)).collect();
    let past_validity: Vec<usize> = h
        .writes
        .iter()
        .enumerate()
        .filter(|(_, w)| {
            by_session
                .get(&w.session)
                .is_some_and(|s| w.start > s.valid_until)
        })
        .map(|(i, _)| i)
        .collect();
    past_validity
}

/// Operations that ran longer than their bound, less the time their client was frozen.
fn hung(h: &History) -> Vec<usize> {
    h.ops
        .iter()
        .enumerate()
        .filter(|(_, op)| {
            let frozen: Duration = h
                .pauses
                .iter()
                .filter(|p| p.client == op.client)
                .map(|p| intersection(op.start, op.end, p.start, p.end))
                .sum();
            op.end.since(op.start).saturating_sub(frozen) > op.bound
        })
        .map(|(i, _)| i)
        .collect()
}

/// For each fault, how long after its heal the lock was acquired again (within the window up
/// to the next fault), and the faults recovered from too slowly.
fn recoveries(
    h: &History,
    sections: &[&Section],
    reacquire_bound: Duration,
) -> (Vec<Option<Duration>>, Vec<usize>) {
    // Each fault's recovery window runs from its heal to the next fault (or the end).
    let windows: Vec<(Mono, Mono)> = h
        .faults
        .iter()
        .enumerate()
        .map(|(i, f)| {
            (
                f.healed,
                h.faults.get(i + 1).map_or(h.end, |next| next.start),
            )
        })
        .collect();
    let reacquired: Vec<Option<Duration>> = windows
        .iter()
        .map(|&(healed, until)| {
            sections
                .iter()
                .map(|s| s.acquired)
                .filter(|&a| a >= healed && a < until)
                .min()
                .map(|a| a.since(healed))
        })
        .collect();
    // Slow: not acquired within the bound, though the window was long enough to be.
    let slow_recoveries = reacquired
        .iter()
        .zip(&windows)
        .enumerate()
        .filter(|(_, (r, (healed, until)))| match r {
            Some(d) => *d > reacquire_bound,
            None => until.since(*healed) >= reacquire_bound,
        })
        .map(|(i, _)| i)
        .collect();
    (reacquired, slow_recoveries)
}

/// The acquisitions during each fault, and the faults judged for starvation.
struct Starvation {
    during: Vec<usize>,
    judged: Vec<usize>,
    contended: Vec<usize>,
    starved: Vec<usize>,
}

/// Faults that promise availability, stand alone, and saw no acquisition: starved, or
/// contended when an acquisition was refused as held meanwhile.
fn starvation(h: &History, sections: &[&Section]) -> Starvation {
    let during: Vec<usize> = h
        .faults
        .iter()
        .map(|f| {
            sections
                .iter()
                .filter(|s| s.acquired >= f.start && s.acquired <= f.healed)
                .count()
        })
        .collect();
    // A fault's promise is its own: while another fault overlaps it, the two together may cut
    // a majority (pauses of nodes 0, then 1, then 2 and 4, each a minority, left one node up in
    // a soak run: `STARVED: no acquisition during "SIGSTOP nodes [1] ..."`), so only a fault
    // that no other overlaps is judged.
    let alone = |i: usize| {
        let f = &h.faults[i];
        h.faults
            .iter()
            .enumerate()
            .all(|(j, g)| j == i || g.healed < f.start || g.start > f.healed)
    };
    let judged: Vec<usize> = h
        .faults
        .iter()
        .enumerate()
        .filter(|&(i, f)| {
            f.available_after
                .is_some_and(|after| f.healed.since(f.start) >= after + STARVE_MIN)
                && alone(i)
        })
        .map(|(i, _)| i)
        .collect();
    let refused_during = |f: &crate::history::Fault| {
        h.ops.iter().any(|op| {
            op.kind == OpKind::Acquire
                && op.outcome == "held"
                && op.end >= f.start
                && op.end <= f.healed
        })
    };
    let (contended, starved): (Vec<usize>, Vec<usize>) = judged
        .iter()
        .copied()
        .filter(|&i| during[i] == 0)
        .partition(|&i| refused_during(&h.faults[i]));
    Starvation {
        during,
        judged,
        contended,
        starved,
    }
}

/// Acquisitions that ended where `held` is impossible, and those of them that said `held`.
fn held_misreports(h: &History) -> (Vec<usize>, Vec<usize>) {
    // Acquisitions that ended inside a window where `held` is impossible (their last round, the
    // one they report, was made during the fault).
    let held_judged: Vec<usize> = h
        .ops
        .iter()
        .enumerate()
        .filter(|(_, op)| {
            op.kind == OpKind::Acquire
                && h.held_impossible
                    .iter()
                    .any(|&(s, e)| op.end >= s && op.end <= e)
        })
        .map(|(i, _)| i)
        .collect();
    let misreported_held = held_judged
        .iter()
        .copied()
        .filter(|&i| h.ops[i].outcome == "held")
        .collect();
    (held_judged, misreported_held)
}

/// The longest time without a section: between sections, from the start, and after the last
/// one to the end.
fn worst_gap(h: &History, sections: &[&Section]) -> Duration {
    // Unavailability: gaps between sections, from the start, and after the last one to the end
    // (a lock that never came back is unavailable until the run stopped).
    let mut worst_gap = Duration::ZERO;
    let mut covered = h.start;
    for s in sections {
        worst_gap = worst_gap.max(s.acquired.since(covered));
        covered = covered.max(s.end());
    }
    worst_gap = worst_gap.max(h.end.since(covered));
    worst_gap
}

fn intersection(a0: Mono, a1: Mono, b0: Mono, b1: Mono) -> Duration {
    a1.min(b1).since(a0.max(b0))
}

/// Accepted writes that are ordered in real time (one ended before the other started) must
/// carry non-decreasing tokens.
fn order_broken(writes: &[Write]) -> Vec<Uncaught> {
    let mut accepted: Vec<usize> = (0..writes.len()).filter(|&i| writes[i].accepted).collect();
    let mut by_end = accepted.clone();
    accepted.sort_by_key(|&i| writes[i].start);
    by_end.sort_by_key(|&i| writes[i].end);
    let mut found = Vec::new();
    let mut ended = 0;
    let mut highest: Option<usize> = None;
    for &later in &accepted {
        while ended < by_end.len() && writes[by_end[ended]].end < writes[later].start {
            let e = by_end[ended];
            if highest.is_none_or(|h| writes[e].token > writes[h].token) {
                highest = Some(e);
            }
            ended += 1;
        }
        if let Some(earlier) = highest
            && writes[later].token < writes[earlier].token
        {
            found.push(Uncaught::OrderBroken { earlier, later });
        }
    }
    found
}

/// Sessions sharing a token that both wrote while both were active.
fn shared_tokens(h: &History) -> Vec<Uncaught> {
    let mut wrote: HashMap<SessionId, Mono> = HashMap::new();
    for w in h.writes.iter().filter(|w| w.accepted) {
        let last = wrote.entry(w.session).or_insert(w.end);
        *last = (*last).max(w.end);
    }
    let mut by_token: BTreeMap<u64, Vec<_>> = BTreeMap::new();
    for s in &h.sections {
        if let Some(&last) = wrote.get(&s.session) {
            by_token
                .entry(s.token)
                .or_default()
                .push((s.session, s.acquired, s.end().max(last)));
        }
    }
    let mut found = Vec::new();
    for (token, group) in by_token {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                if a.1 < b.2 && b.1 < a.2 {
                    found.push(Uncaught::SharedToken {
                        a: a.0,
                        b: b.0,
                        token,
                    });
                }
            }
        }
    }
    found
}
