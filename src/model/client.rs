//! The client's steps: start an attempt, extend, release, and what is done with each round's
//! verdict (token, raise, grant, undo and retry, extension outcome).

use super::{AcquireMode, Ans, LockS, Op, Phase, Redlock, Round, State, Val, secs};
use crate::core::quorum::{self, Acquisition, Refusal, Tally, Verdict};
use crate::core::timing::{self, Extension};
use crate::core::token::{FencingToken, fencing_max, raised_to_quorum};

impl Redlock {
    // ---- client steps -------------------------------------------------------------------

    // mirrors redlock.rs attempt(): the round's deadline, then the fan-out.
    pub(super) fn start(&self, s: &mut State, c: usize) {
        let client = &mut s.clients[c];
        let val = Val {
            client: c as u8,
            attempt: client.attempts,
        };
        client.attempts += 1;
        let deadline = timing::acquire_round(
            secs(self.cfg.node_timeout),
            self.cfg.ttl(),
            self.cfg.drift(),
        );
        let round = match self.cfg.acquire {
            AcquireMode::Script => self.fan_out(s, c, &[Op::Acquire(val)], deadline),
            AcquireMode::Pipelined => self.fan_out(s, c, &[Op::SetNx(val), Op::Incr], deadline),
        };
        s.clients[c].phase = Phase::Acquire { val, round };
        self.progress(s, c, false);
    }

    // mirrors redlock.rs extend_state(): the checks before the round, lower_deadline, the
    // round's deadline (no later than the lock's deadline).
    pub(super) fn extend(&self, s: &mut State, c: usize) {
        let budget_end = timing::budget(self.cfg.ttl(), self.cfg.drift());
        let lock = s.clients[c].lock.as_mut().expect("holding");
        if lock.deadline > budget_end {
            lock.deadline = budget_end;
        }
        lock.extensions += 1;
        // The library's timing::extend_round (item 1's fix: never past the lock's deadline);
        // the mutant waits the node timeout regardless.
        let deadline = if self.cfg.mutants.late_extension_ok {
            secs(self.cfg.node_timeout).min(budget_end)
        } else {
            timing::extend_round(secs(self.cfg.node_timeout), budget_end, lock.deadline)
        };
        let op = Op::Extend(lock.val, lock.token);
        let round = self.fan_out(s, c, &[op], deadline);
        s.clients[c].phase = Phase::Extend { round };
        self.progress(s, c, false);
    }

    pub(super) fn release(&self, s: &mut State, c: usize) {
        let lock = s.clients[c].lock.take().expect("holding");
        self.release_everywhere(s, c, lock.val, lock.token, &[]);
        s.seen.released |= 1 << c;
        self.retry_later(s, c);
    }

    /// After an answer (or the deadline, `timed_out`): takes the round's decision if certain.
    pub(super) fn progress(&self, s: &mut State, c: usize, timed_out: bool) {
        match s.clients[c].phase.clone() {
            Phase::Acquire { val, round } => {
                // Nodes known down are not waited for: they count as failed.
                let t = self.tally_down(s, c, &round.answers);
                let verdict = if timed_out {
                    Some(self.final_verdict(&t))
                } else {
                    self.verdict(&t)
                };
                // A refused round whose pending answers could still show contention waits for
                // them (the library's attempt() does the same).
                let undecided = verdict == Some(Verdict::Refused)
                    && !timed_out
                    && self.refusal(&round.answers, &t) == Refusal::Undecided;
                if let Some(v) = verdict.filter(|_| !undecided) {
                    self.acquire_verdict(s, c, val, &round, &t, v);
                }
            }
            Phase::Raise {
                val,
                since,
                max,
                at_max,
                round,
            } => {
                if timed_out || round.answers.iter().all(Option::is_some) {
                    // mirrors redlock.rs raise_fence(): a quorum must stand at the token.
                    let raised = round
                        .answers
                        .iter()
                        .filter(|a| matches!(a, Some(Ans::Yes(1))))
                        .count();
                    if raised_to_quorum(usize::from(at_max), raised, self.cfg.nodes) {
                        self.grant(s, c, val, max, since);
                    } else {
                        self.fail_attempt(s, c, val, &[]);
                    }
                }
            }
            Phase::Extend { round } => {
                let t = self.tally(&round.answers);
                let verdict = if timed_out {
                    Some(self.final_verdict(&t))
                } else {
                    self.verdict(&t)
                };
                if let Some(v) = verdict {
                    self.extend_verdict(s, c, &round, &t, v);
                }
            }
            Phase::Idle { .. } | Phase::Hold => {}
        }
    }

    /// The outcome of an acquisition round: the library's [`quorum::acquisition`] (with
    /// [`Self::refusal`] for a refused round).
    // mirrors client/acquire.rs: what is done with each outcome (token, raise round, undo).
    pub(super) fn acquire_verdict(
        &self,
        s: &mut State,
        c: usize,
        val: Val,
        round: &Round,
        t: &Tally,
        v: Verdict,
    ) {
        // mirrors client/acquire.rs held_elsewhere(): a round not won undoes its value everywhere but
        // on the nodes that refused it (another value holds the key there, ours is not).
        let skip: Vec<bool> = if t.no() > 0 && v != Verdict::Quorum {
            round
                .answers
                .iter()
                .map(|a| matches!(a, Some(Ans::No(_))))
                .collect()
        } else {
            Vec::new()
        };
        match quorum::acquisition(v, || self.refusal(&round.answers, t)) {
            Acquisition::Won => self.won_round(s, c, val, round),
            // Contenders split the nodes: undo and re-try (the library re-tries at once after a
            // short pause; the model retries later, which only widens the interleavings).
            Acquisition::Held { contended: true } => self.fail_attempt(s, c, val, &skip),
            Acquisition::Held { contended: false } => {
                // Error::Held
                self.check_refused(s, &round.answers, t, true);
                self.fail_attempt(s, c, val, &skip);
            }
            // Error::NoQuorum
            Acquisition::Unreachable => self.fail_attempt(s, c, val, &skip),
        }
    }

    /// A won acquisition round: its token granted, or a raise round to the yes-nodes below it
    /// (the attempt fails when no counter is known at all).
    // mirrors client/acquire.rs seal(): the token, the raise where fewer than a quorum stand at
    // it.
    fn won_round(&self, s: &mut State, c: usize, val: Val, round: &Round) {
        let mut yes: Vec<(usize, u8)> = round
            .answers
            .iter()
            .enumerate()
            .filter_map(|(n, a)| match a {
                Some(Ans::Yes(k)) => Some((n, *k)),
                _ => None,
            })
            .collect();
        // The `missing_incr_counted` mutant: a yes without its INCR's counter is taken
        // to stand at the token.
        // (With no counter known at all it has no token to take: the attempt fails.)
        let known = yes.iter().map(|&(_, k)| k).max().unwrap_or(0);
        if known == 0 {
            self.fail_attempt(s, c, val, &[]);
            return;
        }
        for (_, k) in yes.iter_mut().filter(|(_, k)| *k == 0) {
            *k = known;
        }
        let counters: Vec<FencingToken> = yes
            .iter()
            .map(|&(_, k)| FencingToken::new(u64::from(k)))
            .collect();
        let (max, settled) = fencing_max(&counters, self.cfg.nodes).expect("a quorum said yes");
        let max = u8::try_from(max.get()).expect("small counters");
        if settled {
            self.grant(s, c, val, max, round.elapsed);
            return;
        }
        let at_max = yes.iter().filter(|&&(_, k)| k == max).count() as u8;
        let budget_end =
            timing::budget(self.cfg.ttl(), self.cfg.drift()).saturating_sub(secs(round.elapsed));
        let deadline = secs(self.cfg.node_timeout).min(budget_end);
        s.clients[c].rid += 1;
        let rid = s.clients[c].rid;
        let answers = (0..self.cfg.nodes)
            .map(|n| match yes.iter().find(|&&(m, _)| m == n) {
                Some(&(_, k)) if k < max => {
                    (!self.send(s, c, n, rid, Op::RaiseFence(val, max), true))
                        .then_some(Ans::Failed)
                }
                // Not asked.
                _ => Some(Ans::No(None)),
            })
            .collect();
        s.clients[c].phase = Phase::Raise {
            val,
            since: round.elapsed,
            max,
            at_max,
            round: Round {
                rid,
                elapsed: 0,
                deadline,
                answers,
            },
        };
        self.progress(s, c, false);
    }

    /// The undo of a failed attempt (a release of its value, token 0, but on the nodes of
    /// `skip`), then a retry later. A refused round's nodes that had not answered are sent the
    /// release at once, behind their ACQUIRE: the library waits for their answer and skips those
    /// that refused too, where the release would change nothing (the model's release there is a
    /// no-op, delivered at once by `normalize`).
    pub(super) fn fail_attempt(&self, s: &mut State, c: usize, val: Val, skip: &[bool]) {
        self.release_everywhere(s, c, val, 0, skip);
        self.retry_later(s, c);
    }

    // mirrors client/acquire.rs grant(): validity after the round, else ValidityExpired.
    pub(super) fn grant(&self, s: &mut State, c: usize, val: Val, token: u8, since: u8) {
        let elapsed = secs(since);
        let Some(validity) = timing::validity(self.cfg.ttl(), elapsed, self.cfg.drift()) else {
            self.fail_attempt(s, c, val, &[]);
            return;
        };
        if token <= s.max_token {
            s.flags.token_not_increasing = true;
        }
        s.max_token = s.max_token.max(token);
        for (i, other) in s.clients.iter_mut().enumerate() {
            if i != c
                && let Some(l) = other.lock.as_mut()
            {
                l.others_since = true;
            }
        }
        s.seen.granted |= 1 << c;
        if self.quiet(s) {
            s.seen.granted_in_quiet = true;
        }
        let client = &mut s.clients[c];
        client.lock = Some(LockS {
            val,
            token,
            // mirrors client/acquire.rs grant(): validity counts from the end of the round
            deadline: validity,
            lost: false,
            ever_lost: false,
            others_since: false,
            extensions: 0,
        });
        client.phase = Phase::Hold;
    }

    /// The outcome of an extension round: the library's [`timing::extension`] (item 1's fix: a
    /// quorum reached after the deadline is `Lost(Expired)`), or, under the mutant, a late
    /// quorum counted as in time.
    // mirrors redlock.rs extend_state(): what is done with each outcome (the deadline moved
    // unless lost, the lost signal).
    pub(super) fn extend_verdict(
        &self,
        s: &mut State,
        c: usize,
        round: &Round,
        t: &Tally,
        v: Verdict,
    ) {
        s.clients[c].phase = Phase::Hold;
        let late = s.clients[c]
            .lock
            .as_ref()
            .expect("holding")
            .deadline
            .is_zero();
        let in_time = !late || self.cfg.mutants.late_extension_ok;
        let validity = timing::validity(self.cfg.ttl(), secs(round.elapsed), self.cfg.drift());
        match timing::extension(v, in_time, validity) {
            Extension::Extended(validity) => {
                let lock = s.clients[c].lock.as_mut().expect("holding");
                // LockState::set_deadline: not once lost.
                if !lock.lost {
                    // validity counts from the verdict, the end of the round
                    lock.deadline = validity;
                }
                // Ok(validity): no gap allowed.
                if lock.ever_lost || lock.others_since {
                    s.flags.ok_after_gap = true;
                }
                s.seen.extended |= 1 << c;
            }
            Extension::NotOwner => {
                // Lost(NotOwner)
                self.check_refused(s, &round.answers, t, false);
                s.clients[c].lock.as_mut().expect("holding").lost = true;
            }
            Extension::Expired => s.clients[c].lock.as_mut().expect("holding").lost = true,
            // Too slow to leave any validity, or too few answers: the lock is kept, its
            // deadline unchanged.
            Extension::TooSlow | Extension::Unreachable => {}
        }
    }

    pub(super) fn record(&self, s: &mut State, c: usize, n: usize, rid: u8, ans: Ans) {
        let round = match &mut s.clients[c].phase {
            Phase::Acquire { round, .. } | Phase::Raise { round, .. } | Phase::Extend { round } => {
                round
            }
            _ => return,
        };
        if round.rid != rid {
            return;
        }
        match (round.answers[n], ans) {
            (None, Ans::Set(_)) => {
                round.answers[n] = Some(ans);
                return;
            }
            // The INCR's reply completes a pipelined acquire's answer: a yes with its counter
            // when the SET was ours, else the SET's refusal.
            (Some(Ans::Set(set)), Ans::Yes(k)) => {
                round.answers[n] = Some(match set {
                    None => Ans::Yes(k),
                    Some(holder) => Ans::No(Some(holder)),
                });
            }
            (Some(Ans::Set(set)), Ans::Failed) => {
                round.answers[n] = Some(missing_incr(set, self.cfg.mutants.missing_incr_counted));
            }
            (None, _) => round.answers[n] = Some(ans),
            _ => return,
        }
        self.progress(s, c, false);
    }

    /// A connection broke: its queues are lost, the pending call fails.
    pub(super) fn break_conn(&self, s: &mut State, c: usize, n: usize) {
        let ix = self.ix(c, n);
        // A round call in flight fails: the node is down for this client (releases' replies
        // are not modelled).
        if s.req[ix].iter().any(|r| !matches!(r.op, Op::Release(..))) {
            s.clients[c].conns[n].down = true;
        }
        s.req[ix].clear();
        s.clients[c].conns[n].live = false;
        let rid = match &s.clients[c].phase {
            Phase::Acquire { round, .. } | Phase::Raise { round, .. } | Phase::Extend { round } => {
                round.rid
            }
            _ => return,
        };
        self.record(s, c, n, rid, Ans::Failed);
    }
}

/// A pipelined acquire whose INCR reply never came: a failure (the library's rule), or under
/// the `missing_incr_counted` mutant a yes whose counter is unknown (`Yes(0)`: taken to stand
/// at the token) when the SET was ours.
pub(super) fn missing_incr(set: Option<Val>, mutant: bool) -> Ans {
    if set.is_none() && mutant {
        Ans::Yes(0)
    } else {
        Ans::Failed
    }
}
