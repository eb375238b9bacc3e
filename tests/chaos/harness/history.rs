//! What the clients and the nemesis record: critical sections, resource writes, operations,
//! faults and client pauses, all stamped with `CLOCK_MONOTONIC` (shared by every process on this
//! machine, so a child client's records line up with the test's).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Nanoseconds of `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Mono(pub u64);

impl Mono {
    pub fn now() -> Mono {
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .expect("CLOCK_MONOTONIC is always available on Linux");
        Mono(ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
    }

    /// The same moment as a `std` instant (which is `CLOCK_MONOTONIC` on Linux too).
    pub fn of(instant: std::time::Instant) -> Mono {
        let (now, mono) = (std::time::Instant::now(), Mono::now());
        if instant >= now {
            mono + (instant - now)
        } else {
            mono.minus(now - instant)
        }
    }

    pub fn since(self, earlier: Mono) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    pub fn minus(self, d: Duration) -> Mono {
        Mono(self.0.saturating_sub(d.as_nanos() as u64))
    }
}

impl std::ops::Add<Duration> for Mono {
    type Output = Mono;
    fn add(self, d: Duration) -> Mono {
        Mono(self.0 + d.as_nanos() as u64)
    }
}

/// One acquisition; unique across every client and process of a run.
pub type SessionId = u64;

/// A critical section: from the moment `acquire` returned to the release call or the end of the
/// lock's validity (after any extensions), whichever came first. A client that stopped acting
/// without a release (its task aborted, its process killed) counts as released at that moment;
/// one still inside at the snapshot is open (`released: None`, last known deadline).
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub session: SessionId,
    pub client: usize,
    pub token: u64,
    pub acquired: Mono,
    /// The lock's validity deadline, as last extended.
    pub valid_until: Mono,
    /// When the client called release (None: it never did).
    pub released: Option<Mono>,
}

impl Section {
    /// The end of the time this session was entitled to act.
    pub fn end(&self) -> Mono {
        self.released
            .map_or(self.valid_until, |r| r.min(self.valid_until))
    }
}

/// A write to the fenced resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub session: SessionId,
    pub token: u64,
    pub start: Mono,
    pub end: Mono,
    /// Accepted by the fencing check (false: rejected as stale).
    pub accepted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Acquire,
    Extend,
    Release,
    Write,
}

/// Any call a client made, with how long it was allowed to take.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub client: usize,
    pub kind: OpKind,
    pub start: Mono,
    pub end: Mono,
    pub bound: Duration,
    /// "ok", "held", "no_quorum", "lost", ...
    pub outcome: &'static str,
}

/// A fault the nemesis injected, from injection to heal (equal for instantaneous faults).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fault {
    pub what: String,
    pub start: Mono,
    pub healed: Mono,
    /// The lock must be acquired *during* the fault, if it lasts this long plus
    /// [`STARVE_MIN`](crate::checker::STARVE_MIN): some client kept a majority (see
    /// `nemesis::Fault::available_after`). None: no such promise.
    pub available_after: Option<Duration>,
}

/// A write that started and never finished: its process was killed or its task aborted.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingWrite {
    pub session: SessionId,
    pub client: usize,
    pub token: u64,
    pub start: Mono,
}

/// The moment a client saw its lock's "lost" signal fire (see `Lock::lost`).
#[derive(Debug, Clone, PartialEq)]
pub struct LostSignal {
    pub session: SessionId,
    pub at: Mono,
}

/// A simulated forward clock jump the nemesis made on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct ClockJump {
    pub node: usize,
    pub at: Mono,
    /// The cut client held the lock on its bare majority when the jump came (otherwise the
    /// nemesis gave up waiting for that and jumped anyway).
    pub targeted: bool,
    /// The jump expired the lock key there while it held that bare-majority holder's value.
    pub hit_holder: bool,
    /// Keys whose time to live the jump cut.
    pub keys: u64,
}

impl ClockJump {
    /// The jump did what the fault is about: expired a bare-majority holder's key.
    pub fn fired(&self) -> bool {
        self.targeted && self.hit_holder
    }
}

/// A client process frozen by SIGSTOP: its operations are not "hung" for the time it was frozen.
#[derive(Debug, Clone, PartialEq)]
pub struct Pause {
    pub client: usize,
    pub start: Mono,
    pub end: Mono,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub start: Mono,
    pub end: Mono,
    /// Closed sections, and (in a snapshot) the ones still open, with `released: None` and
    /// their last known deadline.
    pub sections: Vec<Section>,
    pub writes: Vec<Write>,
    pub ops: Vec<Op>,
    pub faults: Vec<Fault>,
    pub pauses: Vec<Pause>,
    pub lost: Vec<LostSignal>,
    pub clock_jumps: Vec<ClockJump>,
    /// Windows in which no acquisition may end as `held` (it reports its last round, made in
    /// the fault: the window starts a call bound after the fault is in place): a foreign key on a minority of nodes
    /// and failed nodes, the refusals alone too few to rule out a quorum (see
    /// `nemesis::Fault::StaleKeys`). `held` then misreports an outage (issue 12 item 6).
    pub held_impossible: Vec<(Mono, Mono)>,
    /// Writes whose outcome is unknown (see [`PendingWrite`]).
    pub unfinished_writes: Vec<PendingWrite>,
    /// Lines of a child client that looked like records but could not be parsed.
    pub malformed: Vec<String>,
    /// What went wrong in the harness itself (a client that did not stop, a child that had to
    /// be killed, ...): any of it fails the run.
    pub incidents: Vec<String>,
}

/// What a recorder keeps: the history, plus the sections and writes still in progress.
#[derive(Debug, Default)]
struct State {
    history: History,
    /// Sections acquired and not closed yet, with their last known deadline.
    open: BTreeMap<SessionId, Section>,
    /// Writes started and not finished yet (at most one per session).
    pending: BTreeMap<SessionId, PendingWrite>,
}

/// Shared, append-only history of a run. A child client's recorder (`echo`) prints every record
/// on stdout instead, for the test process to parse (see `child.rs`).
///
/// A critical section is recorded when it *begins* ([`Recorder::open`]), updated when its
/// deadline moves ([`Recorder::extended`]) and closed at release ([`Recorder::section`]); a
/// snapshot includes the sections still open, so a client stopped inside one (or a child killed
/// there) does not vanish from the history with its overlaps.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Mutex<State>>,
    next_session: Arc<AtomicU64>,
    echo: bool,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::with_sessions_from(1, false)
    }

    /// A recorder whose session ids start at `first`; `echo` prints records instead of keeping them.
    pub fn with_sessions_from(first: SessionId, echo: bool) -> Recorder {
        let history = History {
            start: Mono::now(),
            ..History::default()
        };
        Recorder {
            inner: Arc::new(Mutex::new(State {
                history,
                ..State::default()
            })),
            next_session: Arc::new(AtomicU64::new(first)),
            echo,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn emit(&self, line: String) {
        println!("{}{line}", crate::child::PREFIX);
    }

    pub fn session(&self) -> SessionId {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// A session began: `s` has `released: None` and the deadline the acquisition returned.
    pub fn open(&self, s: Section) {
        if self.echo {
            self.emit(format!(
                "acquired {} {} {} {}",
                s.session, s.token, s.acquired.0, s.valid_until.0
            ));
        } else {
            self.with(|st| st.open.insert(s.session, s));
        }
    }

    /// An open session's deadline moved (an extension, by hand or by `keep_alive`).
    pub fn extended(&self, session: SessionId, until: Mono) {
        if self.echo {
            self.emit(format!("extended {session} {}", until.0));
        } else {
            self.with(|st| {
                if let Some(s) = st.open.get_mut(&session) {
                    s.valid_until = until;
                }
            });
        }
    }

    /// A section closed (released, or its client stopped acting on it).
    pub fn section(&self, s: Section) {
        if self.echo {
            self.emit(crate::child::encode_section(&s));
        } else {
            self.with(|st| {
                st.open.remove(&s.session);
                st.history.sections.push(s);
            });
        }
    }

    /// Closes every section `client` still has open, as of `at` (its process died then).
    /// Returns how many were closed.
    pub fn close_open(&self, client: usize, at: Mono) -> usize {
        self.with(|st| {
            let ids: Vec<SessionId> = st
                .open
                .values()
                .filter(|s| s.client == client)
                .map(|s| s.session)
                .collect();
            for id in &ids {
                let mut s = st.open.remove(id).expect("listed");
                s.released = Some(at);
                st.history.sections.push(s);
            }
            ids.len()
        })
    }

    /// A write is about to be sent.
    pub fn write_started(&self, p: PendingWrite) {
        if self.echo {
            self.emit(format!(
                "writing {} {} {} {}",
                p.session, p.client, p.token, p.start.0
            ));
        } else {
            self.with(|st| st.pending.insert(p.session, p));
        }
    }

    /// Writes `client` started and never finished; they stay in the history as unfinished
    /// unless resolved with [`write`](Self::write).
    pub fn pending_writes(&self, client: usize) -> Vec<PendingWrite> {
        self.with(|st| {
            st.pending
                .values()
                .filter(|p| p.client == client)
                .cloned()
                .collect()
        })
    }

    pub fn write(&self, w: Write) {
        if self.echo {
            self.emit(crate::child::encode_write(&w));
        } else {
            self.with(|st| {
                st.pending.remove(&w.session);
                st.history.writes.push(w);
            });
        }
    }

    pub fn op(&self, op: Op) {
        if self.echo {
            self.emit(crate::child::encode_op(&op));
        } else {
            self.with(|st| st.history.ops.push(op));
        }
    }

    /// A session checked its validity and is about to work, then write.
    pub fn checked(&self, session: SessionId, at: Mono) {
        if self.echo {
            self.emit(format!("checked {session} {}", at.0));
        }
    }

    /// A session's "lost" signal fired.
    pub fn lost(&self, session: SessionId, at: Mono) {
        if self.echo {
            self.emit(format!("lost {session} {}", at.0));
        } else {
            self.with(|st| st.history.lost.push(LostSignal { session, at }));
        }
    }

    pub fn fault(&self, f: Fault) {
        self.with(|st| st.history.faults.push(f));
    }

    pub fn pause(&self, p: Pause) {
        self.with(|st| st.history.pauses.push(p));
    }

    pub fn clock_jump(&self, j: ClockJump) {
        self.with(|st| st.history.clock_jumps.push(j));
    }

    /// A window in which no acquisition may end as `held` (see [`History::held_impossible`]).
    pub fn held_impossible(&self, start: Mono, end: Mono) {
        self.with(|st| st.history.held_impossible.push((start, end)));
    }

    /// A child's line that looked like a record and could not be parsed.
    pub fn malformed(&self, line: String) {
        self.with(|st| st.history.malformed.push(line));
    }

    /// Something went wrong in the harness: fails the run.
    pub fn incident(&self, what: String) {
        println!("[chaos] INCIDENT: {what}");
        self.with(|st| st.history.incidents.push(what));
    }

    /// Acquisitions recorded so far (open sections included) that started at or after `at`.
    pub fn acquired_since(&self, at: Mono) -> usize {
        self.with(|st| {
            st.history
                .sections
                .iter()
                .chain(st.open.values())
                .filter(|s| s.acquired >= at)
                .count()
        })
    }

    /// The history so far, closed now: open sections are included with their last known
    /// deadline, and writes still in flight are listed as unfinished.
    pub fn snapshot(&self) -> History {
        let mut h = self.with(|st| {
            let mut h = st.history.clone();
            h.sections.extend(st.open.values().cloned());
            h.unfinished_writes.extend(st.pending.values().cloned());
            h
        });
        h.end = Mono::now();
        h
    }
}
