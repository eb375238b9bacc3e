//! A model of the protocol for the `stateright` model checker: every interleaving of a
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
//! `src/core/` is called here, not copied: quorum size, `quorum::Tally` and its `Verdict` (early
//! and final), refusal classification and `quorum::acquisition`; drift, validity, budget, the
//! acquire and extend round lengths, `timing::extension` and the retry delay;
//! `token::fencing_max` and `raised_to_quorum`; the restart guard's `health::hold_out_for`,
//! `data_survived` and `restart_verdict`; `repair::repair_sources_required`. What is done with
//! each decision (state changes, sends) is mirrored, marked `// mirrors <file> <fn>()`, and listed in
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

// The promotion histories (kept apart from the other test modules below).
#[cfg(test)]
mod promotion;

mod client;
mod node;
mod round;
mod step;
mod symmetry;
mod timeline;

#[cfg(test)]
mod checks;
#[cfg(test)]
mod deep;
// The proptest model of fencing tokens across acquisitions, releases and data loss.
#[cfg(test)]
mod fencing;
#[cfg(test)]
mod handoff;
#[cfg(test)]
mod markers;
#[cfg(test)]
mod pipelined;
#[cfg(test)]
mod repair_after_hold_out;
#[cfg(test)]
mod waiting;

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::core::health::RestartGuard;
use crate::core::quorum::{self, Answer};
use crate::core::timing;

/// Switches that put a known bug back, in the model only (the library is not touched).
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
    /// library's `Tally::verdict`.
    pub(crate) old_verdict: bool,
    /// The pipelined acquire, a wrong rule: a node whose `SET` was ours but whose `INCR` reply
    /// is missing (the connection broke, or the round's deadline came, between the two) counts
    /// as a yes standing at the token, as if its `INCR` had landed.
    pub(crate) missing_incr_counted: bool,
    /// Finding 5 put back: a repair reads its sources as soon as the client sees the restart,
    /// not once the node's restart hold-out is over (a round that counted the node's answer
    /// from before the restart may still be raising its token on the sources).
    pub(crate) repair_before_hold_out_ends: bool,
    /// The promotion fix put back: a replica promoted in place of a node keeps its uptime for
    /// the restart guard (a promotion does not reset it), as a Cluster member's age did before
    /// the fix (the youngest master's `uptime_in_seconds`).
    pub(crate) promoted_uptime_trusted: bool,
    /// The failback fix put back: a node's identity is its run id alone, so a failback to a
    /// server that kept its run id (demoted, resynchronised, promoted again) is not seen.
    pub(crate) run_id_only_identity: bool,
    /// A standalone member promoted from a replica (its address moved to it) is trusted for
    /// the durability marker it replicated from its old master, as before the fix: with
    /// `appendfsync always` it then counts at once, unrepaired.
    pub(crate) promoted_marker_trusted: bool,
    /// No clock-jump check: a node whose clock jumped forward (and dropped lock keys early)
    /// counts as before.
    pub(crate) clock_jump_undetected: bool,
}

/// How an acquisition is sent to each node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum AcquireMode {
    /// The ACQUIRE script: `SET NX PX` and, when set, `INCR`, one atomic step (Redis < 7,
    /// Cluster members).
    #[default]
    Script,
    /// `SET lock v NX PX ttl GET` then `INCR counter`, sent back to back on the node's one
    /// connection but executed as two steps: other clients' commands, a crash, a broken
    /// connection and the key's expiry may come between them. The `INCR` runs whatever the
    /// `SET` did; the node's answer is read when both replies are (one pipeline): a yes with
    /// the `INCR`'s counter when the `SET` replied nil (ours), a refusal naming the holder the
    /// `SET` returned, a failure when either reply is missing.
    Pipelined,
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
    /// Promotions over the run: a node's server replaced by a replica that missed
    /// the last writes (a failover: a new run id), or demoted and promoted back (a failback:
    /// the same run id, a new replication id). Either way the node answers at once, its lock key
    /// gone and its counter lagging (modelled as lost, the worst a lagging replica can be), and
    /// every connection to it breaks (the sentinels kill the clients of a server they
    /// reconfigure; the cluster client reconnects and the per-call check drops the connection).
    pub(crate) promotions: u8,
    /// Whether a crashed node may come back empty.
    pub(crate) empty_restarts: bool,
    /// Whether a crashed node may come back with its data (one of the two is on; a run with a
    /// crash budget of 1 splits in two runs, one per kind of restart, that cover its histories).
    pub(crate) data_restarts: bool,
    /// How an acquisition is sent (script or pipelined).
    pub(crate) acquire: AcquireMode,
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
            promotions: 0,
            empty_restarts: true,
            data_restarts: true,
            acquire: AcquireMode::Script,
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
    /// The pipelined acquire's first command: `SET lock v NX PX ttl GET`.
    SetNx(Val),
    /// The pipelined acquire's second command: `INCR counter`, whatever the `SET` did.
    Incr,
    RaiseFence(Val, u8),
    Extend(Val, u8),
    /// Fire-and-forget in the model: nothing reads a release's reply.
    Release(Val, u8),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Acquire(v) => write!(f, "ACQUIRE {v}"),
            Op::SetNx(v) => write!(f, "SET {v} NX PX GET"),
            Op::Incr => write!(f, "INCR"),
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
    /// matters), as the restart guard counts it: a promotion counts as a start.
    age: u8,
    /// The replication id: a new one at every promotion (failover or failback).
    replid: u8,
    /// The lock key: value and seconds to live on the node's clock (gone at 0).
    key: Option<(Val, u8)>,
    /// The fencing counter (never expires).
    counter: u8,
    /// The durability marker: an id written at first contact.
    marker: Option<u8>,
    /// Promoted from a replica during its current process: its data, the marker included,
    /// came by replication.
    promoted: bool,
    /// How many times its clock jumped forward (what comparing two `TIME` readings shows).
    clock: u8,
}

/// One client's view of one node: the connection and the restart guard's state (`node.rs`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct ConnS {
    live: bool,
    seen_epoch: Option<u8>,
    /// The replication id seen with `seen_epoch` (the identity is the pair).
    seen_replid: u8,
    /// Hold-out left, on the client's clock.
    held_until: Option<Duration>,
    repair: bool,
    /// The node's clock jumps as of this client's last reading of its `TIME`.
    seen_clock: u8,
    /// The node is known down: a round call of this client to it failed, and no round call has
    /// answered since (`Node::is_down`). An acquisition round does not wait for it.
    down: bool,
}

/// One node's answer in a round (the model's hashable twin of [`Answer`], with the counter of a
/// yes and the holder named by a refusal).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Ans {
    Yes(u8),
    No(Option<Val>),
    Failed,
    /// Pipelined acquire: the `SET`'s reply is read (`None`: set by us; else the holder it
    /// returned), the `INCR`'s is awaited. Still pending for the verdict.
    Set(Option<Val>),
}

impl Ans {
    fn answer(self) -> Answer {
        match self {
            Ans::Yes(_) => Answer::Yes,
            Ans::No(_) => Answer::No,
            Ans::Failed => Answer::Failed,
            Ans::Set(_) => unreachable!("a half-answered node is pending"),
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
    promotions: u8,
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
    /// Node `n`'s server is replaced by a promoted replica that missed the last writes
    /// (`failback`: the same process, demoted and promoted back: same run id).
    Promote {
        n: u8,
        failback: bool,
    },
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
}
