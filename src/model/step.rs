//! The [`Model`] implementation: the initial state, the steps enabled in a state, their effect,
//! and the properties.

use std::collections::VecDeque;

use stateright::{Model, Property};

use super::client::missing_incr;
use super::{Action, Ans, ClientS, ConnS, Flags, NodeS, Op, Phase, Redlock, Seen, State};

impl Redlock {
    /// Client `c`'s oldest request to node `n` is applied; with `lose_reply` its reply is lost
    /// with the connection. `None` when there is no such request.
    fn deliver(&self, s: &mut State, c: usize, n: usize, lose_reply: bool) -> Option<()> {
        let req = s.req[self.ix(c, n)].pop_front()?;
        // mirrors node/mod.rs run_now(): an acquire's `TIME` runs on the node just before it
        let jumped =
            matches!(req.op, Op::Acquire(_) | Op::SetNx(_)) && self.clock_check(s, c, n, true);
        let reply = self.apply(s, n, req.op);
        if lose_reply {
            // The call in flight fails (`break_conn` marks the node down).
            s.req[self.ix(c, n)].push_front(req);
            s.disconnects += 1;
            self.break_conn(s, c, n);
        } else if let Some((int, holder)) = reply {
            // A round call answered: the node is up again for this client.
            s.clients[c].conns[n].down = false;
            let ans = match (&s.clients[c].phase, req.op, int > 0) {
                // The node's clock jumped since the last reading: its answer does not count.
                _ if jumped => Ans::Failed,
                (_, Op::SetNx(_), _) => Ans::Set(holder),
                (_, Op::Incr, _) => Ans::Yes(int as u8),
                (Phase::Raise { .. }, _, _) if int == 1 => Ans::Yes(1),
                (Phase::Raise { .. }, _, _) | (_, _, false) => Ans::No(holder),
                (_, _, true) => Ans::Yes(int as u8),
            };
            self.record(s, c, n, req.rid, ans);
        }
        Some(())
    }

    /// Client `c`'s round times out: whoever has not answered failed, and is down for it.
    fn time_out(&self, s: &mut State, c: usize) {
        if let Phase::Acquire { round, .. } | Phase::Raise { round, .. } | Phase::Extend { round } =
            &mut s.clients[c].phase
        {
            // Whoever has not answered failed, and is down for this client.
            let missing = self.cfg.mutants.missing_incr_counted;
            let mut down = Vec::new();
            for (n, a) in round.answers.iter_mut().enumerate() {
                let failed = match *a {
                    None => Ans::Failed,
                    Some(Ans::Set(set)) => missing_incr(set, missing),
                    Some(_) => continue,
                };
                *a = Some(failed);
                down.push(n);
            }
            for n in down {
                s.clients[c].conns[n].down = true;
            }
        }
        self.progress(s, c, true);
    }
}

impl Model for Redlock {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let (n, k) = (self.cfg.nodes, self.cfg.clients);
        let conn = if self.cfg.fresh_clients {
            ConnS::default()
        } else {
            ConnS {
                live: true,
                seen_epoch: Some(0),
                seen_replid: 0,
                held_until: None,
                repair: false,
                seen_clock: 0,
                down: false,
            }
        };
        let marker = (!self.cfg.fresh_clients).then_some(0);
        vec![State {
            nodes: vec![
                NodeS {
                    up: true,
                    epoch: 0,
                    replid: 0,
                    age: self.cfg.ttl + 2,
                    key: None,
                    counter: 0,
                    marker,
                    promoted: false,
                    clock: 0,
                };
                n
            ],
            clients: vec![
                ClientS {
                    conns: vec![conn; n],
                    attempts: 0,
                    budget: self.cfg.attempts,
                    rid: 0,
                    phase: Phase::Idle { wait: 0 },
                    lock: None,
                };
                k
            ],
            req: vec![VecDeque::new(); n * k],
            crashes: 0,
            disconnects: 0,
            stalls: 0,
            jumps: 0,
            evictions: 0,
            promotions: 0,
            max_token: 0,
            flags: Flags::default(),
            seen: Seen::default(),
            quiet: None,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let cfg = &self.cfg;
        // Liveness: the quiet phase ends (a terminal state, where the `eventually` property is
        // judged) at the horizon or once a client was granted the lock.
        if s.quiet.is_some_and(|q| q > cfg.live_within) || s.seen.granted_in_quiet {
            return;
        }
        let before = out.len();
        self.progress_actions(s, out);
        let pending_progress = out.len() > before;
        let quiet = self.quiet(s);
        for c in 0..cfg.clients {
            let client = &s.clients[c];
            if let (Phase::Hold, Some(lock)) = (&client.phase, &client.lock)
                && !quiet
                && self.valid(s, c)
            {
                // Lock::extend: refused before any call once the deadline has passed.
                if lock.extensions < cfg.extensions && !lock.lost && !lock.deadline.is_zero() {
                    out.push(Action::Extend(c as u8));
                }
                out.push(Action::Release(c as u8));
            }
        }
        if !quiet && cfg.liveness {
            out.push(Action::Quiet);
        }
        if !quiet {
            // A broken connection only matters with something on it.
            if s.disconnects < cfg.disconnects {
                for c in 0..cfg.clients {
                    for n in 0..cfg.nodes {
                        if !s.req[self.ix(c, n)].is_empty() {
                            out.push(Action::Disconnect {
                                c: c as u8,
                                n: n as u8,
                            });
                            out.push(Action::DeliverLoseReply {
                                c: c as u8,
                                n: n as u8,
                            });
                        }
                    }
                }
            }
            for n in 0..cfg.nodes {
                if s.nodes[n].up && s.crashes < cfg.crashes {
                    out.push(Action::Crash(n as u8));
                }
                if s.jumps < cfg.node_jumps {
                    out.push(Action::JumpClock(n as u8));
                }
                if s.evictions < cfg.evictions && s.nodes[n].key.is_some() {
                    out.push(Action::Evict(n as u8));
                }
                if s.promotions < cfg.promotions && s.nodes[n].up {
                    for failback in [false, true] {
                        out.push(Action::Promote {
                            n: n as u8,
                            failback,
                        });
                    }
                }
            }
        }
        if !(quiet && pending_progress) {
            out.push(Action::Tick { stall: 0 });
            if !quiet && s.stalls < cfg.stalls {
                for c in 0..cfg.clients {
                    out.push(Action::Tick { stall: 1 << c });
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick { stall } => self.tick(&mut s, stall),
            Action::Quiet => {
                s.quiet = Some(0);
                for client in &mut s.clients {
                    client.budget = client.attempts + self.cfg.live_attempts;
                }
            }
            Action::Start(c) => self.start(&mut s, c.into()),
            Action::Deliver { c, n } => self.deliver(&mut s, c.into(), n.into(), false)?,
            Action::DeliverLoseReply { c, n } => self.deliver(&mut s, c.into(), n.into(), true)?,
            Action::Timeout(c) => self.time_out(&mut s, c.into()),
            Action::Extend(c) => self.extend(&mut s, c.into()),
            Action::Release(c) => self.release(&mut s, c.into()),
            Action::Repair { c, n } => self.repair(&mut s, c.into(), n.into()),
            Action::Disconnect { c, n } => {
                s.disconnects += 1;
                self.break_conn(&mut s, c.into(), n.into());
            }
            Action::Crash(n) => {
                let n = usize::from(n);
                s.crashes += 1;
                s.nodes[n].up = false;
                for c in 0..self.cfg.clients {
                    self.break_conn(&mut s, c, n);
                }
            }
            Action::Restart { n, empty } => {
                let node = &mut s.nodes[usize::from(n)];
                node.up = true;
                node.epoch += 1;
                node.age = 0;
                node.promoted = false;
                if empty {
                    node.key = None;
                    node.counter = 0;
                    node.marker = None;
                }
            }
            Action::JumpClock(n) => {
                s.jumps += 1;
                let node = &mut s.nodes[usize::from(n)];
                node.clock += 1;
                if let Some((_, ttl)) = node.key.as_mut() {
                    *ttl = ttl.saturating_sub(self.cfg.jump);
                    if *ttl == 0 {
                        node.key = None;
                    }
                }
            }
            Action::Evict(n) => {
                s.evictions += 1;
                s.nodes[usize::from(n)].key = None;
            }
            // mirrors node/cluster.rs cluster_view() (a promoted master counts as just started)
            // and node/health.rs server_identity() (run id and replication id)
            Action::Promote { n, failback } => {
                s.promotions += 1;
                let n = usize::from(n);
                let node = &mut s.nodes[n];
                if !failback {
                    node.epoch += 1;
                }
                node.replid += 1;
                // The marker stays: the replica received it by replication.
                node.promoted = true;
                if !self.cfg.mutants.promoted_uptime_trusted {
                    node.age = 0;
                }
                node.key = None;
                node.counter = 0;
                for c in 0..self.cfg.clients {
                    self.break_conn(&mut s, c, n);
                }
            }
        }
        self.normalize(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("mutual exclusion", |m: &Redlock, s: &State| {
                (0..m.cfg.clients).filter(|&c| m.valid(s, c)).count() <= 1
            }),
            Property::always("fencing tokens increase", |_, s: &State| {
                !s.flags.token_not_increasing
            }),
            Property::always("ok extension means no gap", |_, s: &State| {
                !s.flags.ok_after_gap
            }),
            Property::always(
                "is_lost never returns to false",
                |m: &Redlock, s: &State| {
                    (0..m.cfg.clients).all(|c| {
                        s.clients[c]
                            .lock
                            .as_ref()
                            .is_none_or(|l| !l.ever_lost || !m.valid(s, c))
                    })
                },
            ),
            Property::always(
                "held only when the refusals alone forbid a quorum",
                |_, s: &State| !s.flags.held_with_too_few_refusals,
            ),
            Property::always("held never on a split vote", |_, s: &State| {
                !s.flags.held_on_split_vote
            }),
            Property::eventually(
                "liveness: after faults stop a client is granted the lock",
                |m: &Redlock, s: &State| !m.cfg.liveness || s.seen.granted_in_quiet,
            ),
            Property::sometimes("coverage: both clients acquired", |_, s: &State| {
                s.seen.granted == 0b11
            }),
            Property::sometimes(
                "coverage: acquire, extend, release by both",
                |_, s: &State| {
                    s.seen.granted == 0b11 && s.seen.extended == 0b11 && s.seen.released == 0b11
                },
            ),
            Property::sometimes(
                "coverage: acquire, extend, release by both, with a crash",
                |_, s: &State| {
                    s.seen.granted == 0b11
                        && s.seen.extended == 0b11
                        && s.seen.released == 0b11
                        && s.crashes > 0
                },
            ),
            Property::sometimes(
                "coverage: one client acquired, extended and released",
                |_, s: &State| s.seen.granted & s.seen.extended & s.seen.released != 0,
            ),
            Property::sometimes("coverage: a restarted node repaired", |_, s: &State| {
                s.seen.repaired
            }),
        ]
    }
}
