//! What the clients and the nemesis record: critical sections, resource writes, operations,
//! faults and client pauses, all stamped with `CLOCK_MONOTONIC` (shared by every process on this
//! machine, so a child client's records line up with the test's).

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
/// lock's validity (after any extensions), whichever came first.
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
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub what: String,
    pub start: Mono,
    pub healed: Mono,
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
    pub sections: Vec<Section>,
    pub writes: Vec<Write>,
    pub ops: Vec<Op>,
    pub faults: Vec<Fault>,
    pub pauses: Vec<Pause>,
}

/// Shared, append-only history of a run. A child client's recorder (`echo`) prints every record
/// on stdout instead, for the test process to parse (see `child.rs`).
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Mutex<History>>,
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
            inner: Arc::new(Mutex::new(history)),
            next_session: Arc::new(AtomicU64::new(first)),
            echo,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn emit(&self, line: String) {
        println!("{}{line}", crate::child::PREFIX);
    }

    pub fn session(&self) -> SessionId {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    pub fn section(&self, s: Section) {
        if self.echo {
            self.emit(crate::child::encode_section(&s));
        } else {
            self.with(|h| h.sections.push(s));
        }
    }

    pub fn write(&self, w: Write) {
        if self.echo {
            self.emit(crate::child::encode_write(&w));
        } else {
            self.with(|h| h.writes.push(w));
        }
    }

    pub fn op(&self, op: Op) {
        if self.echo {
            self.emit(crate::child::encode_op(&op));
        } else {
            self.with(|h| h.ops.push(op));
        }
    }

    /// A session began (only a child reports it: the test synchronises on it).
    pub fn acquired(&self, session: SessionId, token: u64, at: Mono, until: Mono) {
        if self.echo {
            self.emit(format!("acquired {session} {token} {} {}", at.0, until.0));
        }
    }

    /// A session checked its validity and is about to work, then write.
    pub fn checked(&self, session: SessionId, at: Mono) {
        if self.echo {
            self.emit(format!("checked {session} {}", at.0));
        }
    }

    pub fn fault(&self, f: Fault) {
        self.with(|h| h.faults.push(f));
    }

    pub fn pause(&self, p: Pause) {
        self.with(|h| h.pauses.push(p));
    }

    /// Acquisitions recorded so far that started at or after `at`.
    pub fn acquired_since(&self, at: Mono) -> usize {
        self.with(|h| h.sections.iter().filter(|s| s.acquired >= at).count())
    }

    /// The history so far, closed now.
    pub fn snapshot(&self) -> History {
        let mut h = self.with(|h| h.clone());
        h.end = Mono::now();
        h
    }
}
