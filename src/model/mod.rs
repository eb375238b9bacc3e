//! A model of the protocol for the `stateright` model checker (issue 13): every interleaving of a
//! small cluster (3 nodes, 2 clients) within a bounded time, with faults as nondeterministic
//! steps, checked against the safety properties of `docs/verification.md`.
//!
//! It is written with stateright's plain [`Model`] trait rather than its actor framework: the
//! model owns the whole state (nodes, clients, one FIFO request queue per connection, the real
//! time and each client's clock) and every step is one explicit [`Action`]; a reply is read when
//! the node applies the call. That keeps the state small (no actor timers or envelopes, no
//! per-message ids), lets time be a step of its own (clocks that stall, keys that expire on the
//! node's clock) and lets the trace printer name each step as the library would log it.
//!
//! **What is the library's own code.** Every decision the library takes in a pure function of
//! `src/core/` is called here, not copied: quorum size, [`Tally`] and its [`Verdict`] (early and
//! final), refusal classification and [`quorum::acquisition`]; drift, validity, budget, the
//! acquire and extend round lengths, [`timing::extension`] and the retry delay; [`fencing_max`]
//! and [`raised_to_quorum`]; the restart guard's [`hold_out_for`], [`data_survived`] and
//! [`restart_verdict`]; [`repair_sources_required`]. What is done with each decision (state
//! changes, sends) is mirrored, marked `// mirrors <file> <fn>()`, and listed in
//! `docs/verification.md` ("not yet shared code").
//!
//! **Time.** One tick is one second of real time. Nodes expire keys on their own clock (real time
//! plus a forward jump, when that fault is enabled); each client measures time on its own clock,
//! which may stall for a tick (runs slow) within a budget: one stalled tick over the run is within
//! the drift bound of the base configuration (`ttl * drift_factor` = 1.02 s), two break it.
//!
//! **Faults**, all optional steps that the checker interleaves everywhere: a connection breaking
//! (its queued requests, or the reply of the call just applied, are lost; the client reconnects
//! and re-reads the run id), a
//! node crashing and restarting (with its data or empty), a node's clock jumping forward, the
//! eviction of a lock key, and a client that pauses (every client step is optional at every tick,
//! so a client may stop anywhere for any time: between its verdict and acting on it, with calls
//! queued, past its validity).

mod symmetry;
mod timeline;

#[cfg(test)]
mod checks;

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use stateright::{Model, Property};

use crate::core::health::{Meeting, RestartGuard, data_survived, hold_out_for, restart_verdict};
use crate::core::quorum::{self, Acquisition, Answer, Refusal, Tally, Verdict};
use crate::core::repair::repair_sources_required;
use crate::core::timing::{self, Extension};
use crate::core::token::{fencing_max, raised_to_quorum};

/// Switches that put a bug of issue 12 back, in the model only (the library is not touched).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mutants {
    /// Item 1 (client): an extension whose quorum arrives after the lock's deadline returns `Ok`
    /// and moves the deadline forward, as `extend_state` did before the fix.
    pub(crate) late_extension_ok: bool,
    /// Item 1 (script): EXTEND re-sets an absent key whatever the node's counter says.
    pub(crate) extend_recreates: bool,
    /// Item 2: a node configured for durability (`appendfsync always`) is trusted after a
    /// restart even when its data did not survive.
    pub(crate) trust_durable_empty: bool,
    /// Item 2, a weaker fix: the durability marker is trusted when it is merely *present* after a
    /// restart (another client may have written it again since).
    pub(crate) marker_presence_only: bool,
    /// Items 6 and 7: the round's verdict from today's rule (`Refused` whenever a quorum can no
    /// longer say yes and the failures alone do not rule it out), mirrored here, instead of the
    /// library's [`Tally::verdict`].
    pub(crate) old_verdict: bool,
}

/// A model configuration: sizes, timing, fault budgets and which assumptions hold.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Redis nodes.
    pub(crate) nodes: usize,
    /// Clients.
    pub(crate) clients: usize,
    /// Lock ttl, seconds (also the max ttl the restart guard holds nodes out for).
    pub(crate) ttl: u8,
    /// The client's drift factor.
    pub(crate) drift_factor: f64,
    /// The node timeout, seconds.
    pub(crate) node_timeout: u8,
    /// Retry delay base and jitter, seconds.
    pub(crate) retry_base: u8,
    pub(crate) retry_jitter: u8,
    /// Acquisition attempts per client (each a fresh owner value).
    pub(crate) attempts: u8,
    /// Extensions per held lock.
    pub(crate) extensions: u8,
    /// Fault budgets over the whole run.
    pub(crate) crashes: u8,
    pub(crate) disconnects: u8,
    /// Ticks a client clock may stall in total (1 is within the drift bound, 2 breaks it).
    pub(crate) stalls: u8,
    /// Forward jumps of a node's clock, and by how many seconds.
    pub(crate) node_jumps: u8,
    pub(crate) jump: u8,
    /// Lock keys a node may evict (a `volatile-*` policy under memory pressure).
    pub(crate) evictions: u8,
    /// Whether a crashed node may come back empty (else only with its data).
    pub(crate) empty_restarts: bool,
    /// The restart guard: `Restarted` (the default), `Strict` or `Off`.
    pub(crate) guard: RestartGuard,
    /// Nodes run with `appendfsync always` (what an empty restart then breaks).
    pub(crate) durable: bool,
    /// Clients meet the nodes for the first time in the run (a CLI, a fresh process); by
    /// default they were connected before anything happened (long-lived clients), which is
    /// what the `Restarted` guard needs to see a restart.
    pub(crate) fresh_clients: bool,
    pub(crate) mutants: Mutants,
    /// Liveness: a `Quiet` step may stop the faults, after which the fairness assumption of
    /// `docs/verification.md` holds (time only passes once every pending step is taken:
    /// messages delivered, down nodes restarted, due timeouts, retries and repairs taken, held
    /// locks released by their users), each client gets `live_attempts` more attempts, and
    /// within `live_within` ticks some client must be granted the lock (an `eventually`
    /// property; the quiet phase ends there, so every path is finite).
    pub(crate) liveness: bool,
    pub(crate) live_within: u8,
    pub(crate) live_attempts: u8,
}

impl Config {
    /// 3 nodes, 2 clients, ttl 3 s, drift factor 0.34 (a 1.022 s allowance), node timeout 1 s,
    /// retries after 1 to 2 s, the restart guard on; no faults. Profiles switch on what they
    /// explore.
    pub(crate) fn base() -> Self {
        Config {
            nodes: 3,
            clients: 2,
            ttl: 3,
            drift_factor: 0.34,
            node_timeout: 1,
            retry_base: 1,
            retry_jitter: 1,
            attempts: 2,
            extensions: 1,
            crashes: 0,
            disconnects: 0,
            stalls: 0,
            node_jumps: 0,
            jump: 3,
            evictions: 0,
            empty_restarts: true,
            guard: RestartGuard::Restarted,
            durable: false,
            fresh_clients: false,
            mutants: Mutants::default(),
            liveness: false,
            live_within: 0,
            live_attempts: 0,
        }
    }

    fn ttl(&self) -> Duration {
        secs(self.ttl)
    }

    fn drift(&self) -> Duration {
        timing::drift(self.ttl(), self.drift_factor)
    }

    fn quorum(&self) -> usize {
        quorum::quorum(self.nodes)
    }
}

fn secs(s: u8) -> Duration {
    Duration::from_secs(u64::from(s))
}

/// An owner value: which client, which attempt (each attempt draws a fresh one).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Val {
    client: u8,
    attempt: u8,
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}#{}", self.client, self.attempt)
    }
}

/// A script call on the wire (`src/scripts.rs`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Op {
    Acquire(Val),
    RaiseFence(Val, u8),
    Extend(Val, u8),
    /// Fire-and-forget in the model: nothing reads a release's reply.
    Release(Val, u8),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Acquire(v) => write!(f, "ACQUIRE {v}"),
            Op::RaiseFence(v, t) => write!(f, "RAISE_FENCE {v} token {t}"),
            Op::Extend(v, t) => write!(f, "EXTEND {v} token {t}"),
            Op::Release(v, t) => write!(f, "RELEASE {v} token {t}"),
        }
    }
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Req {
    rid: u8,
    op: Op,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct NodeS {
    up: bool,
    /// The run id: a new one at every restart.
    epoch: u8,
    /// Seconds since the last (re)start (capped: only `uptime_in_seconds` below the max ttl
    /// matters).
    age: u8,
    /// The lock key: value and seconds to live on the node's clock (gone at 0).
    key: Option<(Val, u8)>,
    /// The fencing counter (never expires).
    counter: u8,
    /// The durability marker (issue 12 item 2's fix): an id written at first contact.
    marker: Option<u8>,
}

/// One client's view of one node: the connection and the restart guard's state (`node.rs`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct ConnS {
    live: bool,
    seen_epoch: Option<u8>,
    /// Hold-out left, on the client's clock.
    held_until: Option<Duration>,
    repair: bool,
}

/// One node's answer in a round (the model's hashable twin of [`Answer`], with the counter of a
/// yes and the holder named by a refusal).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Ans {
    Yes(u8),
    No(Option<Val>),
    Failed,
}

impl Ans {
    fn answer(self) -> Answer {
        match self {
            Ans::Yes(_) => Answer::Yes,
            Ans::No(_) => Answer::No,
            Ans::Failed => Answer::Failed,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Round {
    rid: u8,
    /// Seconds since the round started, on the client's clock (capped at the ttl: no validity
    /// is left beyond).
    elapsed: u8,
    /// Time left before the round gives up on the unanswered nodes, on the client's clock.
    deadline: Duration,
    /// `None` while the node's answer is awaited.
    answers: Vec<Option<Ans>>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Not holding, not trying; may start an attempt `wait` seconds from now or later.
    Idle {
        wait: u8,
    },
    Acquire {
        val: Val,
        round: Round,
    },
    /// Raising the fencing counters of the yes-nodes below `max`; `at_max` stood at it.
    Raise {
        val: Val,
        /// Seconds since the acquire round started.
        since: u8,
        max: u8,
        at_max: u8,
        round: Round,
    },
    Hold,
    Extend {
        round: Round,
    },
}

/// A held lock (`guard.rs` `LockState`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LockS {
    val: Val,
    token: u8,
    /// Validity left, on the client's clock (zero once passed).
    deadline: Duration,
    /// The lost signal fired (`LockState::lose`).
    lost: bool,
    /// `is_lost()` was true in some state since the acquisition.
    ever_lost: bool,
    /// Another client was granted the lock since our acquisition.
    others_since: bool,
    extensions: u8,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ClientS {
    conns: Vec<ConnS>,
    attempts: u8,
    /// Attempts this client may make in all (`Config::attempts`, more once faults stop).
    budget: u8,
    rid: u8,
    phase: Phase,
    lock: Option<LockS>,
}

/// Safety violations, recorded at the step they happen (properties read them).
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Flags {
    token_not_increasing: bool,
    ok_after_gap: bool,
    held_with_too_few_refusals: bool,
    held_on_split_vote: bool,
}

/// What the run has shown so far (for the coverage examples).
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Seen {
    granted: u8,
    extended: u8,
    released: u8,
    repaired: bool,
    /// A client was granted the lock after the faults stopped (liveness).
    granted_in_quiet: bool,
}

/// The state. Every time in it is relative to the present (time left, time elapsed, capped
/// where larger values change nothing), so states that differ only by when they happen are one
/// state: the space is finite without a horizon, and exploring it covers unbounded time.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct State {
    nodes: Vec<NodeS>,
    clients: Vec<ClientS>,
    /// Requests, one FIFO queue per connection: index `client * nodes + node`.
    req: Vec<VecDeque<Req>>,
    crashes: u8,
    disconnects: u8,
    stalls: u8,
    jumps: u8,
    evictions: u8,
    max_token: u8,
    flags: Flags,
    seen: Seen,
    /// Faults have stopped (liveness), and ticks since (capped).
    quiet: Option<u8>,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub(crate) enum Action {
    /// One second of real time; clients in the `stall` mask do not see it.
    Tick {
        stall: u8,
    },
    Start(u8),
    /// Node `n` applies the oldest request from client `c`, and the client reads the reply.
    Deliver {
        c: u8,
        n: u8,
    },
    /// Node `n` applies the oldest request from client `c`, then the connection breaks: the
    /// reply and the requests queued behind are lost, the call fails.
    DeliverLoseReply {
        c: u8,
        n: u8,
    },
    /// Client `c`'s round gives up on its unanswered nodes.
    Timeout(u8),
    Extend(u8),
    Release(u8),
    Repair {
        c: u8,
        n: u8,
    },
    Disconnect {
        c: u8,
        n: u8,
    },
    Crash(u8),
    Restart {
        n: u8,
        empty: bool,
    },
    JumpClock(u8),
    Evict(u8),
    /// Faults stop (liveness configurations).
    Quiet,
}

/// The model: a configuration; the state is [`State`].
#[derive(Debug, Clone)]
pub(crate) struct Redlock {
    pub(crate) cfg: Config,
}

impl Redlock {
    pub(crate) fn new(cfg: Config) -> Self {
        Redlock { cfg }
    }

    fn ix(&self, c: usize, n: usize) -> usize {
        c * self.cfg.nodes + n
    }

    fn quiet(&self, s: &State) -> bool {
        s.quiet.is_some()
    }

    /// A client believes its lock valid: `!is_lost()` (`guard.rs`).
    pub(crate) fn valid(&self, s: &State, c: usize) -> bool {
        s.clients[c]
            .lock
            .as_ref()
            .is_some_and(|l| !l.lost && !l.deadline.is_zero())
    }

    // ---- the round's verdict ------------------------------------------------------------

    fn tally(&self, answers: &[Option<Ans>]) -> Tally {
        let mut t = Tally::new(self.cfg.nodes);
        for a in answers.iter().flatten() {
            t.record(a.answer());
        }
        t
    }

    /// The verdict as soon as it is certain: the library's [`Tally::verdict`], or today's rule
    /// under the `old_verdict` mutant.
    fn verdict(&self, t: &Tally) -> Option<Verdict> {
        if self.cfg.mutants.old_verdict {
            old_verdict(t, self.cfg.nodes)
        } else {
            t.verdict()
        }
    }

    fn final_verdict(&self, t: &Tally) -> Verdict {
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
    /// rule before issue 12 item 7).
    fn refusal(&self, answers: &[Option<Ans>], t: &Tally) -> Refusal {
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
    /// alone must forbid a quorum (issue 12 item 6), and a round where nothing failed must name
    /// one value on a quorum (item 7: a split vote is contention, not `Held`).
    fn check_refused(&self, s: &mut State, answers: &[Option<Ans>], t: &Tally, acquire: bool) {
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
    fn connect(&self, s: &mut State, c: usize, n: usize) {
        if s.clients[c].conns[n].live {
            return;
        }
        let node = s.nodes[n].clone();
        let conn = &mut s.clients[c].conns[n];
        let meeting = match conn.seen_epoch {
            None => Meeting::First,
            Some(e) if e == node.epoch => Meeting::Same,
            Some(_) => Meeting::Restarted,
        };
        let run_id = node.epoch.to_string();
        let marker = node.marker.map(|m| m.to_string());
        let durable_before = conn.seen_epoch.map(|_| self.cfg.durable);
        let survived = if self.cfg.mutants.trust_durable_empty {
            self.cfg.durable
        } else if self.cfg.mutants.marker_presence_only {
            self.cfg.durable && marker.is_some()
        } else {
            data_survived(self.cfg.durable, marker.as_deref(), &run_id, durable_before)
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
        // The marker: written at first contact, and again where it is missing.
        let marker = node.marker.unwrap_or(node.epoch);
        s.nodes[n].marker = Some(marker);
    }

    // mirrors node.rs held_out()
    fn held_out(&self, s: &State, c: usize, n: usize) -> bool {
        let conn = &s.clients[c].conns[n];
        conn.repair || conn.held_until.is_some()
    }

    /// Sends a call: `false` when it fails at once (node down, or held out and `respect`).
    // mirrors node.rs run_now(): connect, then the hold-out check, then the send.
    fn send(&self, s: &mut State, c: usize, n: usize, rid: u8, op: Op, respect: bool) -> bool {
        if !s.nodes[n].up {
            return false;
        }
        self.connect(s, c, n);
        if respect && self.held_out(s, c, n) {
            return false;
        }
        let ix = self.ix(c, n);
        s.req[ix].push_back(Req { rid, op });
        true
    }

    /// A round: `op` to every node; the answers of the calls that fail at once are recorded.
    fn fan_out(&self, s: &mut State, c: usize, op: Op, deadline: Duration) -> Round {
        s.clients[c].rid += 1;
        let rid = s.clients[c].rid;
        let answers = (0..self.cfg.nodes)
            .map(|n| (!self.send(s, c, n, rid, op, true)).then_some(Ans::Failed))
            .collect();
        Round {
            rid,
            elapsed: 0,
            deadline,
            answers,
        }
    }

    /// The undo of a failed attempt: a release of its value (token 0) to every node.
    // mirrors redlock.rs UndoRelease + spawn_release()
    fn release_everywhere(&self, s: &mut State, c: usize, val: Val, token: u8) {
        for n in 0..self.cfg.nodes {
            self.send(s, c, n, 0, Op::Release(val, token), false);
        }
    }

    fn retry_later(&self, s: &mut State, c: usize) {
        let delay =
            timing::retry_delay(secs(self.cfg.retry_base), secs(self.cfg.retry_jitter), 0.0);
        let wait = u8::try_from(delay.as_secs()).unwrap_or(u8::MAX);
        s.clients[c].phase = Phase::Idle { wait };
    }

    // ---- client steps -------------------------------------------------------------------

    // mirrors redlock.rs attempt(): the round's deadline, then the fan-out.
    fn start(&self, s: &mut State, c: usize) {
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
        let round = self.fan_out(s, c, Op::Acquire(val), deadline);
        s.clients[c].phase = Phase::Acquire { val, round };
        self.progress(s, c, false);
    }

    // mirrors redlock.rs extend_state(): the checks before the round, lower_deadline, the
    // round's deadline (with the fix of issue 12 item 1, no later than the lock's deadline).
    fn extend(&self, s: &mut State, c: usize) {
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
        let round = self.fan_out(s, c, op, deadline);
        s.clients[c].phase = Phase::Extend { round };
        self.progress(s, c, false);
    }

    fn release(&self, s: &mut State, c: usize) {
        let lock = s.clients[c].lock.take().expect("holding");
        self.release_everywhere(s, c, lock.val, lock.token);
        s.seen.released |= 1 << c;
        self.retry_later(s, c);
    }

    /// After an answer (or the deadline, `timed_out`): takes the round's decision if certain.
    fn progress(&self, s: &mut State, c: usize, timed_out: bool) {
        match s.clients[c].phase.clone() {
            Phase::Acquire { val, round } => {
                let t = self.tally(&round.answers);
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
                        self.fail_attempt(s, c, val);
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
    fn acquire_verdict(
        &self,
        s: &mut State,
        c: usize,
        val: Val,
        round: &Round,
        t: &Tally,
        v: Verdict,
    ) {
        match quorum::acquisition(v, || self.refusal(&round.answers, t)) {
            Acquisition::Won => {
                let yes: Vec<(usize, u8)> = round
                    .answers
                    .iter()
                    .enumerate()
                    .filter_map(|(n, a)| match a {
                        Some(Ans::Yes(k)) => Some((n, *k)),
                        _ => None,
                    })
                    .collect();
                let counters: Vec<u64> = yes.iter().map(|&(_, k)| u64::from(k)).collect();
                let (max, settled) =
                    fencing_max(&counters, self.cfg.nodes).expect("a quorum said yes");
                let max = u8::try_from(max).expect("small counters");
                if settled {
                    self.grant(s, c, val, max, round.elapsed);
                    return;
                }
                let at_max = yes.iter().filter(|&&(_, k)| k == max).count() as u8;
                let budget_end = timing::budget(self.cfg.ttl(), self.cfg.drift())
                    .saturating_sub(secs(round.elapsed));
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
            // Contenders split the nodes: undo and re-try (the library re-tries at once after a
            // short pause; the model retries later, which only widens the interleavings).
            Acquisition::Held { contended: true } => self.fail_attempt(s, c, val),
            Acquisition::Held { contended: false } => {
                // Error::Held
                self.check_refused(s, &round.answers, t, true);
                self.fail_attempt(s, c, val);
            }
            // Error::NoQuorum
            Acquisition::Unreachable => self.fail_attempt(s, c, val),
        }
    }

    fn fail_attempt(&self, s: &mut State, c: usize, val: Val) {
        self.release_everywhere(s, c, val, 0);
        self.retry_later(s, c);
    }

    // mirrors redlock.rs attempt(): validity after the round, else ValidityExpired.
    fn grant(&self, s: &mut State, c: usize, val: Val, token: u8, since: u8) {
        let elapsed = secs(since);
        let Some(validity) = timing::validity(self.cfg.ttl(), elapsed, self.cfg.drift()) else {
            self.fail_attempt(s, c, val);
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
            // mirrors redlock.rs attempt(): validity counts from the end of the round
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
    fn extend_verdict(&self, s: &mut State, c: usize, round: &Round, t: &Tally, v: Verdict) {
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

    fn record(&self, s: &mut State, c: usize, n: usize, rid: u8, ans: Ans) {
        let round = match &mut s.clients[c].phase {
            Phase::Acquire { round, .. } | Phase::Raise { round, .. } | Phase::Extend { round } => {
                round
            }
            _ => return,
        };
        if round.rid != rid || round.answers[n].is_some() {
            return;
        }
        round.answers[n] = Some(ans);
        self.progress(s, c, false);
    }

    /// A connection broke: its queues are lost, the pending call fails.
    fn break_conn(&self, s: &mut State, c: usize, n: usize) {
        let ix = self.ix(c, n);
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

    // ---- nodes: the scripts of src/scripts.rs -------------------------------------------

    fn apply(&self, s: &mut State, n: usize, op: Op) -> Option<(i8, Option<Val>)> {
        let ttl = self.cfg.ttl;
        let node = &mut s.nodes[n];
        let holder = node.key.map(|(v, _)| v);
        match op {
            // SET NX PX, INCR on success.
            Op::Acquire(val) => {
                if holder.is_some() {
                    return Some((0, holder));
                }
                node.key = Some((val, ttl));
                node.counter += 1;
                Some((node.counter as i8, None))
            }
            Op::RaiseFence(val, token) => {
                if holder != Some(val) {
                    return Some((0, holder));
                }
                node.counter = node.counter.max(token);
                Some((1, None))
            }
            // EXTEND (scripts.rs), with issue 12 item 1's fix: an absent key is re-set only where
            // the counter is at most our token (a later acquisition leaves a quorum above it).
            Op::Extend(val, token) => {
                let r = match holder {
                    Some(v) if v == val => {
                        node.key = Some((val, ttl));
                        1
                    }
                    None if self.cfg.mutants.extend_recreates || node.counter <= token => {
                        node.key = Some((val, ttl));
                        2
                    }
                    _ => return Some((0, holder)),
                };
                node.counter = node.counter.max(token);
                Some((r, None))
            }
            Op::Release(val, token) => {
                if token > 0 {
                    node.counter = node.counter.max(token);
                }
                if holder == Some(val) {
                    node.key = None;
                }
                None
            }
        }
    }

    /// One second of real time: nodes' keys age (and expire), restarted nodes grow older, and
    /// every client not in `stall` sees its timers move.
    fn tick(&self, s: &mut State, stall: u8) {
        let ttl = self.cfg.ttl;
        for node in &mut s.nodes {
            node.age = (node.age + 1).min(ttl + 2);
            if let Some((_, left)) = node.key.as_mut() {
                *left -= 1;
                if *left == 0 {
                    node.key = None;
                }
            }
        }
        let second = Duration::from_secs(1);
        for (c, client) in s.clients.iter_mut().enumerate() {
            if stall & (1 << c) != 0 {
                s.stalls += 1;
                continue;
            }
            for conn in &mut client.conns {
                conn.held_until = conn
                    .held_until
                    .map(|h| h.saturating_sub(second))
                    .filter(|h| !h.is_zero());
            }
            if let Some(lock) = client.lock.as_mut() {
                lock.deadline = lock.deadline.saturating_sub(second);
            }
            match &mut client.phase {
                Phase::Idle { wait } => *wait = wait.saturating_sub(1),
                Phase::Acquire { round, .. } | Phase::Extend { round } => {
                    round.elapsed = (round.elapsed + 1).min(ttl);
                    round.deadline = round.deadline.saturating_sub(second);
                }
                Phase::Raise { since, round, .. } => {
                    *since = (*since + 1).min(ttl);
                    round.elapsed = (round.elapsed + 1).min(ttl);
                    round.deadline = round.deadline.saturating_sub(second);
                }
                Phase::Hold => {}
            }
        }
        if let Some(q) = s.quiet.as_mut() {
            *q = (*q + 1).min(self.cfg.live_within + 1);
        }
    }

    /// `is_lost()` is recorded once true; the quiet phase notes a valid holder.
    fn normalize(&self, s: &mut State) {
        for c in 0..s.clients.len() {
            let lost = !self.valid(s, c);
            if let Some(l) = s.clients[c].lock.as_mut() {
                // `ever_lost && !lost` is a violation: keep the flag as it was so the property
                // sees it.
                l.ever_lost |= lost;
            }
        }
    }

    /// Steps that must happen before time passes in the quiet phase.
    fn progress_actions(&self, s: &State, out: &mut Vec<Action>) {
        let n_nodes = self.cfg.nodes;
        for c in 0..self.cfg.clients {
            for n in 0..n_nodes {
                let ix = self.ix(c, n);
                let (cc, nn) = (c as u8, n as u8);
                if !s.req[ix].is_empty() && s.nodes[n].up {
                    out.push(Action::Deliver { c: cc, n: nn });
                }
                if self.repair_possible(s, c, n) {
                    out.push(Action::Repair { c: cc, n: nn });
                }
            }
            match &s.clients[c].phase {
                Phase::Idle { wait: 0 }
                    if s.clients[c].lock.is_none()
                        && s.clients[c].attempts < s.clients[c].budget =>
                {
                    out.push(Action::Start(c as u8));
                }
                Phase::Acquire { round, .. }
                | Phase::Raise { round, .. }
                | Phase::Extend { round }
                    if round.deadline.is_zero() =>
                {
                    out.push(Action::Timeout(c as u8));
                }
                // A user whose lock is lost lets it go (and tries again); once faults stop,
                // every user finishes its work and releases.
                Phase::Hold if !self.valid(s, c) || self.quiet(s) => {
                    out.push(Action::Release(c as u8));
                }
                _ => {}
            }
        }
        for n in 0..n_nodes {
            if !s.nodes[n].up {
                out.push(Action::Restart {
                    n: n as u8,
                    empty: false,
                });
                if self.cfg.empty_restarts {
                    out.push(Action::Restart {
                        n: n as u8,
                        empty: true,
                    });
                }
            }
        }
    }

    /// A repair of node `n` by client `c` would find enough clean nodes (only then is it a
    /// step: a repair that cannot succeed changes nothing).
    fn repair_possible(&self, s: &State, c: usize, n: usize) -> bool {
        let nodes = self.cfg.nodes;
        let conns = &s.clients[c].conns;
        if !conns[n].repair || !s.nodes[n].up {
            return false;
        }
        let clean = (0..nodes).filter(|&j| j != n && !conns[j].repair).count();
        let up_clean = (0..nodes)
            .filter(|&j| j != n && !conns[j].repair && s.nodes[j].up)
            .count();
        up_clean >= repair_sources_required(nodes, clean)
    }

    // mirrors repair.rs repair(): the largest counter among N - Q + 1 clean nodes (every clean
    // node when fewer are clean), atomic here.
    fn repair(&self, s: &mut State, c: usize, n: usize) {
        let nodes = self.cfg.nodes;
        let clean = (0..nodes)
            .filter(|&j| j != n && !s.clients[c].conns[j].repair)
            .count();
        let required = repair_sources_required(nodes, clean);
        let mut answered = 0;
        let mut highest = 0;
        for j in (0..nodes).filter(|&j| j != n) {
            if !s.nodes[j].up {
                continue;
            }
            let was_clean = !s.clients[c].conns[j].repair;
            self.connect(s, c, j);
            if was_clean && !s.clients[c].conns[j].repair {
                answered += 1;
            }
            highest = highest.max(s.nodes[j].counter);
        }
        if answered >= required {
            self.connect(s, c, n);
            let target = &mut s.nodes[n];
            target.counter = target.counter.max(highest);
            s.clients[c].conns[n].repair = false;
            s.seen.repaired = true;
        }
    }
}

/// Today's rule for a round's verdict (`Tally::verdict` before issue 12 items 6 and 7), kept
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
                held_until: None,
                repair: false,
            }
        };
        let marker = (!self.cfg.fresh_clients).then_some(0);
        vec![State {
            nodes: vec![
                NodeS {
                    up: true,
                    epoch: 0,
                    age: self.cfg.ttl + 2,
                    key: None,
                    counter: 0,
                    marker,
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
            Action::Deliver { c, n } | Action::DeliverLoseReply { c, n } => {
                let (c, n) = (usize::from(c), usize::from(n));
                let req = s.req[self.ix(c, n)].pop_front()?;
                let reply = self.apply(&mut s, n, req.op);
                if let Action::DeliverLoseReply { .. } = action {
                    s.disconnects += 1;
                    self.break_conn(&mut s, c, n);
                } else if let Some((int, holder)) = reply {
                    let ans = match (&s.clients[c].phase, int > 0) {
                        (Phase::Raise { .. }, _) if int == 1 => Ans::Yes(1),
                        (Phase::Raise { .. }, _) | (_, false) => Ans::No(holder),
                        (_, true) => Ans::Yes(int as u8),
                    };
                    self.record(&mut s, c, n, req.rid, ans);
                }
            }
            Action::Timeout(c) => {
                let c = usize::from(c);
                if let Phase::Acquire { round, .. }
                | Phase::Raise { round, .. }
                | Phase::Extend { round } = &mut s.clients[c].phase
                {
                    for a in &mut round.answers {
                        if a.is_none() {
                            *a = Some(Ans::Failed);
                        }
                    }
                }
                self.progress(&mut s, c, true);
            }
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
                if empty {
                    node.key = None;
                    node.counter = 0;
                    node.marker = None;
                }
            }
            Action::JumpClock(n) => {
                s.jumps += 1;
                let node = &mut s.nodes[usize::from(n)];
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
                "coverage: one client acquired, extended and released",
                |_, s: &State| s.seen.granted & s.seen.extended & s.seen.released != 0,
            ),
            Property::sometimes("coverage: a restarted node repaired", |_, s: &State| {
                s.seen.repaired
            }),
        ]
    }
}
