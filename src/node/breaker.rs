//! The breaker: a node that stopped answering gets one call at a time, not all of them.
//!
//! Commands written to a connection whose server reads nothing pile up (in the kernel's
//! buffers, then in redis-rs' queue) and cost the client for each one. Once a call to the node
//! was given up for its silence (a whole node timeout without any answer, `client/patience.rs`),
//! the breaker is open: every call fails at once with the node's last failure, and the node is
//! probed, one `PING` at a time, on its connection. Any answer from the node (the probe's, or a
//! call's sent before the breaker opened) closes the breaker.
//!
//! The probe is a task of its own, never a caller's call: a caller's future can be dropped
//! unanswered (a round decided without that node, as an acquisition does for a node known
//! down, then dropped its call), and a breaker whose only way back was such a call would stay
//! open after the node came back, every call failing at once. A probe's turn is bounded in
//! time (a node timeout), so a probe task that never ends (a runtime shut down, blocked) cannot
//! hold it either: the next call after its turn starts another.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::core::lock;

/// What a call may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// The breaker is closed: send the call.
    Send,
    /// The breaker is open and no probe's turn is running: start a probe, fail the call.
    Probe,
    /// The breaker is open and a probe's turn is running: fail the call.
    Refuse,
}

/// A node's breaker (see the module's text).
#[derive(Debug, Default)]
pub(super) struct Breaker {
    open: AtomicBool,
    /// While open: when the current probe's turn ends (`None`: no probe yet).
    probe_until: Mutex<Option<Instant>>,
}

impl Breaker {
    /// Opens the breaker: a call was given up for the node's silence.
    pub(super) fn open(&self) {
        self.open.store(true, Ordering::Relaxed);
    }

    /// Closes the breaker: the node answered.
    pub(super) fn close(&self) {
        if self.open.load(Ordering::Relaxed) {
            self.open.store(false, Ordering::Relaxed);
            *lock(&self.probe_until) = None;
        }
    }

    /// What a call may do now (see [`Admit`]); a probe's turn is `window` long.
    pub(super) fn admit(&self, window: Duration) -> Admit {
        if !self.open.load(Ordering::Relaxed) {
            return Admit::Send;
        }
        let now = Instant::now();
        let mut until = lock(&self.probe_until);
        if until.is_some_and(|u| now < u) {
            return Admit::Refuse;
        }
        *until = Some(now + window);
        Admit::Probe
    }

    /// Whether the breaker is open.
    #[cfg(test)]
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }
}

impl super::Node {
    /// Probes the node on `conn` in a task of its own, bounded by the node timeout: an answer
    /// marks the node up, which closes the breaker.
    pub(super) fn spawn_probe(
        self: &std::sync::Arc<Self>,
        mut conn: redis::aio::MultiplexedConnection,
    ) {
        let node = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            let ping = redis::cmd("PING");
            let answer = tokio::time::timeout(node.node_timeout, conn.send_packed_command(&ping));
            if let Ok(Ok(_)) = answer.await {
                node.mark_up();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Admit, Breaker};

    #[tokio::test(start_paused = true)]
    async fn one_probe_per_turn_and_a_lost_probe_ends_with_its_turn() {
        let b = Breaker::default();
        let window = Duration::from_millis(50);
        assert_eq!(b.admit(window), Admit::Send, "closed: every call");
        assert_eq!(b.admit(window), Admit::Send);
        b.open();
        assert_eq!(
            b.admit(window),
            Admit::Probe,
            "the first call starts a probe"
        );
        assert_eq!(b.admit(window), Admit::Refuse, "one probe at a time");
        // The probe never answered: its turn ends by itself.
        tokio::time::advance(window).await;
        assert_eq!(b.admit(window), Admit::Probe, "the next call probes again");
        assert_eq!(b.admit(window), Admit::Refuse);
        b.close();
        assert!(!b.is_open());
        assert_eq!(b.admit(window), Admit::Send);
    }
}
