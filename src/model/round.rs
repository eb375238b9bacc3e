//! A round's verdict (the library's `Tally`, refusal classification, or the `old_verdict` mutant),
//! connections and the restart guard, sends and fan-outs.

use std::time::Duration;

use super::{Ans, Op, Phase, Redlock, Req, Round, State, Val, secs};
use crate::core::health::{Meeting, data_survived, hold_out_for, restart_verdict};
use crate::core::quorum::{self, Answer, Refusal, Tally, Verdict};
use crate::core::timing;

impl Redlock {
    // ---- the round's verdict ------------------------------------------------------------

    pub(super) fn tally(&self, answers: &[Option<Ans>]) -> Tally {
        let mut t = Tally::new(self.cfg.nodes);
        for a in answers.iter().flatten() {
            if !matches!(a, Ans::Set(_)) {
                t.record(a.answer());
            }
        }
        t
    }

    /// The tally with the pending nodes known down counted as failed (an acquisition round
    /// does not wait for them).
    // mirrors client/round.rs Answers::decided() + pending_down() (decided inside the round's
    // I/O code, not in core), and abandon(): a round not won records them as failed.
    pub(super) fn tally_down(&self, s: &State, c: usize, answers: &[Option<Ans>]) -> Tally {
        let mut t = self.tally(answers);
        let conns = &s.clients[c].conns;
        let down = answers
            .iter()
            .enumerate()
            .filter(|&(n, a)| matches!(a, None | Some(Ans::Set(_))) && conns[n].down)
            .count();
        for _ in 0..down.min(t.pending()) {
            t.record(Answer::Failed);
        }
        t
    }

    /// The verdict as soon as it is certain: the library's [`Tally::verdict`], or today's rule
    /// under the `old_verdict` mutant.
    pub(super) fn verdict(&self, t: &Tally) -> Option<Verdict> {
        if self.cfg.mutants.old_verdict {
            old_verdict(t, self.cfg.nodes)
        } else {
            t.verdict()
        }
    }

    pub(super) fn final_verdict(&self, t: &Tally) -> Verdict {
        if self.cfg.mutants.old_verdict {
            let mut answers = *t;
            for _ in 0..t.pending() {
                answers.record(Answer::Failed);
            }
            old_verdict(&answers, self.cfg.nodes).unwrap_or(Verdict::Unreachable)
        } else {
            t.final_verdict()
        }
    }

    /// How a refused acquisition round is classified: the library's [`quorum::refusal`] over
    /// the values the refusals named, or always `Held` under the `old_verdict` mutant (today's
    /// rule before the split-vote fix).
    pub(super) fn refusal(&self, answers: &[Option<Ans>], t: &Tally) -> Refusal {
        if self.cfg.mutants.old_verdict {
            return Refusal::Held;
        }
        let refusals: Vec<Option<Val>> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ans::No(h)) => Some(*h),
                _ => None,
            })
            .collect();
        quorum::refusal_of(self.cfg.nodes, &refusals, t.failed(), t.pending())
    }

    /// Records the checks of a `Held` (acquire) or `NotOwner` (extend) outcome: the refusals
    /// alone must forbid a quorum, and a round where nothing failed must name
    /// one value on a quorum (item 7: a split vote is contention, not `Held`).
    pub(super) fn check_refused(
        &self,
        s: &mut State,
        answers: &[Option<Ans>],
        t: &Tally,
        acquire: bool,
    ) {
        let n = self.cfg.nodes;
        if t.no() <= n - self.cfg.quorum() {
            s.flags.held_with_too_few_refusals = true;
        }
        if acquire && t.failed() == 0 {
            let holders: Vec<Option<Val>> = answers
                .iter()
                .filter_map(|a| match a {
                    Some(Ans::No(h)) => Some(*h),
                    _ => None,
                })
                .collect();
            let one_on_quorum = holders
                .iter()
                .any(|h| holders.iter().filter(|g| *g == h).count() >= self.cfg.quorum());
            if !one_on_quorum {
                s.flags.held_on_split_vote = true;
            }
        }
    }

    // ---- connections and the restart guard ----------------------------------------------

    /// Connects client `c` to node `n` if its connection is not live: reads the run id, uptime
    /// and durability, and takes the restart guard's decision with the library's
    /// [`data_survived`] and [`restart_verdict`]. The run id is the node's epoch; the marker
    /// holds the epoch it was written in.
    // mirrors node.rs connect() + observe_start(): the reads, and what is done with the verdict.
    pub(super) fn connect(&self, s: &mut State, c: usize, n: usize) {
        if s.clients[c].conns[n].live {
            return;
        }
        let node = s.nodes[n].clone();
        let conn = &mut s.clients[c].conns[n];
        // The identity is the run id and the replication id; the mutant compares
        // the run id alone.
        let same_replid = self.cfg.mutants.run_id_only_identity || conn.seen_replid == node.replid;
        let meeting = match conn.seen_epoch {
            None => Meeting::First,
            Some(e) if e == node.epoch && same_replid => Meeting::Same,
            Some(_) => Meeting::Restarted,
        };
        let run_id = node.epoch.to_string();
        let marker = node.marker.map(|m| m.to_string());
        let durable_before = conn.seen_epoch.map(|_| self.cfg.durable);
        // mirrors node/connection.rs meet_server(): a server promoted from a replica is not
        // taken for durable (its marker came by replication)
        let durable =
            self.cfg.durable && (!node.promoted || self.cfg.mutants.promoted_marker_trusted);
        let survived = if self.cfg.mutants.trust_durable_empty {
            durable
        } else if self.cfg.mutants.marker_presence_only {
            durable && marker.is_some()
        } else {
            data_survived(durable, marker.as_deref(), &run_id, durable_before)
        };
        let (hold_out, repair) = restart_verdict(self.cfg.guard, meeting, survived);
        if hold_out {
            conn.held_until = hold_out_for(secs(node.age), self.cfg.ttl());
        }
        if repair {
            conn.repair = true;
        }
        conn.live = true;
        conn.seen_epoch = Some(node.epoch);
        conn.seen_replid = node.replid;
        // mirrors node/wallclock.rs clock_baseline(): the same server's clock compared with
        // the last reading; another server's reading is a new baseline
        if meeting == Meeting::Same {
            self.clock_check(s, c, n, false);
        } else {
            s.clients[c].conns[n].seen_clock = s.nodes[n].clock;
        }
        // The marker: written at first contact, and again where it is missing.
        let marker = node.marker.unwrap_or(node.epoch);
        s.nodes[n].marker = Some(marker);
    }

    /// Client `c` reads node `n`'s clock: a jump since its last reading holds the node out
    /// for the max ttl and marks it for repair, as a restart does (unless the guard is off or
    /// the check is mutated away). `true` when a jump was seen on an `acquire` reading.
    // mirrors node/wallclock.rs check_clock() and node/health.rs observe_clock_jump()
    pub(super) fn clock_check(&self, s: &mut State, c: usize, n: usize, acquire: bool) -> bool {
        let clock = s.nodes[n].clock;
        let conn = &mut s.clients[c].conns[n];
        let jumped = conn.seen_clock != clock;
        conn.seen_clock = clock;
        if !jumped
            || self.cfg.mutants.clock_jump_undetected
            || self.cfg.guard == crate::core::health::RestartGuard::Off
        {
            return false;
        }
        conn.held_until = hold_out_for(Duration::ZERO, self.cfg.ttl());
        conn.repair = true;
        acquire
    }

    // mirrors node.rs held_out()
    pub(super) fn held_out(&self, s: &State, c: usize, n: usize) -> bool {
        let conn = &s.clients[c].conns[n];
        conn.repair || conn.held_until.is_some()
    }

    /// Sends a call: `false` when it fails at once (node down, or held out and `respect`).
    // mirrors node.rs run_now(): connect, then the hold-out check, then the send.
    pub(super) fn send(
        &self,
        s: &mut State,
        c: usize,
        n: usize,
        rid: u8,
        op: Op,
        respect: bool,
    ) -> bool {
        self.send_all(s, c, n, rid, &[op], respect)
    }

    /// Sends calls back to back on one connection (a pipeline): `false` when they fail at once.
    /// A round call (`respect`) failing on a down node marks the node down for this client.
    pub(super) fn send_all(
        &self,
        s: &mut State,
        c: usize,
        n: usize,
        rid: u8,
        ops: &[Op],
        respect: bool,
    ) -> bool {
        if !s.nodes[n].up {
            if respect {
                s.clients[c].conns[n].down = true;
            }
            return false;
        }
        self.connect(s, c, n);
        if respect && self.held_out(s, c, n) {
            return false;
        }
        let ix = self.ix(c, n);
        for &op in ops {
            s.req[ix].push_back(Req { rid, op });
        }
        true
    }

    /// A round: `ops` to every node; the answers of the calls that fail at once are recorded.
    pub(super) fn fan_out(&self, s: &mut State, c: usize, ops: &[Op], deadline: Duration) -> Round {
        s.clients[c].rid += 1;
        let rid = s.clients[c].rid;
        let answers = (0..self.cfg.nodes)
            .map(|n| (!self.send_all(s, c, n, rid, ops, true)).then_some(Ans::Failed))
            .collect();
        Round {
            rid,
            elapsed: 0,
            deadline,
            answers,
        }
    }

    /// A release of a value to every node (a held lock's release, or the undo of a failed
    /// attempt with token 0), except the nodes of `skip`.
    // mirrors client/acquire.rs UndoRelease + client/release.rs release_on()
    pub(super) fn release_everywhere(
        &self,
        s: &mut State,
        c: usize,
        val: Val,
        token: u8,
        skip: &[bool],
    ) {
        for n in 0..self.cfg.nodes {
            if !skip.get(n).copied().unwrap_or(false) {
                self.send(s, c, n, 0, Op::Release(val, token), false);
            }
        }
    }

    pub(super) fn retry_later(&self, s: &mut State, c: usize) {
        let delay =
            timing::retry_delay(secs(self.cfg.retry_base), secs(self.cfg.retry_jitter), 0.0);
        let wait = u8::try_from(delay.as_secs()).unwrap_or(u8::MAX);
        s.clients[c].phase = Phase::Idle { wait };
    }
}

/// Today's rule for a round's verdict (`Tally::verdict` before the held and split-vote fixes), kept
/// here as the `old_verdict` mutant.
fn old_verdict(t: &Tally, n: usize) -> Option<Verdict> {
    let q = quorum::quorum(n);
    if t.yes() >= q {
        Some(Verdict::Quorum)
    } else if t.yes() + t.pending() < q {
        if t.failed() > n - q {
            Some(Verdict::Unreachable)
        } else {
            Some(Verdict::Refused)
        }
    } else {
        None
    }
}
