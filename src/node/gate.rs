//! A round's gate: which calls of a fan-out round were handed to their connection, and whether
//! the round is closed (nothing of it sent any more).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use smallvec::SmallVec;

use crate::core::clock::{self, Stamp};

/// How many commands a `rediss://` node connection's queue (redis-rs's channel to its driver
/// task) holds (the crate's own connections, `wire.rs`, take every call at its first poll).
/// Far above any backlog the node timeout allows, so a call never waits for room: a call handed
/// to its connection is always already queued. That makes it safe to keep a call's future
/// without polling it (the library parks the unanswered calls of finished rounds): a future
/// waiting for room would hold that room once granted, forever if unpolled, and starve the
/// connection (`t25_connections_stay_usable_after_heavy_concurrency`).
pub(crate) const QUEUE: usize = 1 << 16;

/// A round's gate: which of its calls have been handed to their connection, and whether the
/// round is *closed*. A round is closed at its verdict when its unanswered calls must not be
/// sent late (sent after a later extension or the release, an acquire or an extension could
/// leave the key with the wrong expiry, or re-set it): a call still waiting for its connection
/// then gives up instead of sending.
///
/// A call handed to its connection is queued there (see [`QUEUE`]) and runs before any call
/// queued after it; dropped before its connection writes it, it may be skipped (redis-rs's
/// connection, over `rediss://`, skips it; the crate's own writes every call it took), but a
/// kept future, even unpolled, keeps it. A call still waiting for its connection is sent only if polled.
///
/// Closing and handing exclude each other per call: once [`close`](Self::close) has returned,
/// no call of the round passes any more, and every call that passed before is seen handed.
/// So after a round is closed, a call not handed was never sent, and never will be.
///
/// A gate may also close by itself at a time on the deadline clock (an extension's gate
/// closes at the lock's deadline: nothing of it is sent after), and a call's `EVAL` fallback
/// after a `NOSCRIPT` reply is a new send: it passes the gate again.
#[derive(Debug, Clone)]
pub(crate) struct RoundGate(Arc<GateState>);

#[derive(Debug)]
struct GateState {
    closed: AtomicBool,
    /// When the round closes by itself, on the deadline clock.
    until: Option<Stamp>,
    /// Per call, [`HANDED`] once it passed, [`SHUT`] once the round was closed. Inline (in the
    /// gate's one allocation) for up to 8 nodes.
    calls: SmallVec<[AtomicU8; 8]>,
}

/// A call of a round that its gate stopped: the round was closed before the call (or its `EVAL`
/// fallback after a `NOSCRIPT`) was handed to its connection, so it had no effect on its node,
/// and never will. Not a failure of the node: it names no node, marks none down, and counts as
/// no answer (never a yes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotSent;

/// What a node call passes right before each send: a round's gate and the call's index in it,
/// or [`Ungated`] (a call outside a round, always sent). `Stop` says why a call was not sent:
/// [`NotSent`], or [`Infallible`] where it always is, so such a call's result has no "not sent".
pub(crate) trait Gate: Send + Sync {
    /// Why a call was not sent.
    type Stop: Send;
    /// Lets the call through, or says why not. Checked right before the send, in the same poll.
    fn pass(&self) -> Result<(), Self::Stop>;
}

/// No gate: the call is always sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ungated;

impl Gate for Ungated {
    type Stop = Infallible;

    fn pass(&self) -> Result<(), Infallible> {
        Ok(())
    }
}

impl Gate for (RoundGate, usize) {
    type Stop = NotSent;

    fn pass(&self) -> Result<(), NotSent> {
        if self.0.pass(self.1) {
            Ok(())
        } else {
            Err(NotSent)
        }
    }
}

/// A call's bit: it passed the gate (handed to its connection).
const HANDED: u8 = 1;
/// A call's bit: its round was closed; it passes no more.
const SHUT: u8 = 2;

impl RoundGate {
    /// A gate for `n` calls; with `until`, it also closes by itself then (deadline clock).
    pub(crate) fn new(n: usize, until: Option<Stamp>) -> Self {
        RoundGate(Arc::new(GateState {
            closed: AtomicBool::new(false),
            until,
            calls: (0..n).map(|_| AtomicU8::new(0)).collect(),
        }))
    }

    /// Closes the round: calls still waiting for a connection will not be sent.
    pub(crate) fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
        for call in &self.0.calls {
            call.fetch_or(SHUT, Ordering::AcqRel);
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire) || self.0.until.is_some_and(|u| u <= clock::now())
    }

    /// Whether call `i` has been handed to its connection.
    pub(crate) fn handed(&self, i: usize) -> bool {
        self.state(i) & HANDED != 0
    }

    /// Whether call `i` was never handed to its connection and never will be (its round was
    /// closed with [`close`](Self::close) first): nothing of it reached its node.
    pub(crate) fn never_sent(&self, i: usize) -> bool {
        self.state(i) == SHUT
    }

    fn state(&self, i: usize) -> u8 {
        self.0.calls.get(i).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Lets call `i` through (marking it handed), unless the round is closed. Checked right
    /// before the send, in the same poll.
    pub(super) fn pass(&self, i: usize) -> bool {
        if self.is_closed() {
            return false;
        }
        let Some(call) = self.0.calls.get(i) else {
            return true;
        };
        // One atomic step, so that a `close` in between either stops this call or sees it.
        call.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            (s & SHUT == 0).then_some(s | HANDED)
        })
        .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_round_stops_its_unhanded_calls_as_not_sent() {
        let gate = RoundGate::new(2, None);
        assert_eq!((gate.clone(), 0).pass(), Ok(()));
        gate.close();
        assert_eq!((gate.clone(), 1).pass(), Err(NotSent));
        assert!(gate.handed(0) && gate.never_sent(1));
        assert_eq!(Ungated.pass(), Ok(()));
    }

    #[test]
    fn a_gate_past_its_time_stops_calls_as_not_sent() {
        let gate = RoundGate::new(1, Some(clock::now()));
        assert_eq!((gate, 0).pass(), Err(NotSent));
    }
}
