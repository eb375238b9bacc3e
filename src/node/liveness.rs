//! Whether a node's last call failed, and why: failures are logged at warn on the way down and
//! at info on the way back, not on every call; a round that did not wait for the node names the
//! last failure's cause.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use super::{Node, Op};
use crate::error::NodeError;
use crate::metrics;

/// A node's liveness as its calls found it.
#[derive(Default)]
pub(super) struct Liveness {
    /// Whether the last call (or connect) failed: failures are logged at warn on the way down
    /// and at info on the way back, not on every call.
    down: AtomicBool,
    /// The last failure's cause, while `down`: what a round that did not wait for the node
    /// names.
    last_failure: Mutex<Option<NodeError>>,
    /// Why the node was last seen held out of quorums, as an index into [`HELD_OUT`] (0: it
    /// was not): the held-out gauge moves only when this changes.
    held_out: AtomicU8,
    /// How many calls the node has answered: a call that waits while this moves waits behind
    /// this client's earlier calls, not for a silent node (`client/patience.rs`).
    answers: AtomicU64,
}

/// The reasons a node counts toward no quorum, as `NodeError::kind()` names them (index 0:
/// none).
const HELD_OUT: [&str; 5] = ["", "held_out", "repairing", "same_server", "evicting"];

impl Node {
    /// Records a call that its round's deadline cut short.
    pub(crate) fn timed_out(&self, op: Op, e: &NodeError) {
        self.failed(op, e);
    }

    /// Records a failed call: metrics, a debug event, and a warning when the node goes down.
    /// A node held out (after a restart, as a second URL of one server, for its eviction
    /// policy) is not down: its own warning says why.
    pub(super) fn failed(&self, op: Op, e: &NodeError) {
        metrics::node_error(&self.name, op.as_str(), e.kind());
        tracing::debug!(node = %self.name, op = op.as_str(), error = %e, "node call failed");
        if matches!(
            e,
            NodeError::HeldOut { .. }
                | NodeError::ClockJumped { .. }
                | NodeError::Repairing
                | NodeError::SameServer { .. }
                | NodeError::Evicting(_)
                | NodeError::Backlog(_)
        ) {
            return;
        }
        *crate::core::lock(&self.live.last_failure) = Some(e.clone());
        if let NodeError::Denied { command, .. } = e {
            if !self.live.down.swap(true, Ordering::Relaxed) {
                metrics::node_up(&self.name, false);
                tracing::warn!(node = %self.name, op = op.as_str(), %command, error = %e, "the node's ACL refuses a command quorumlock needs; it counts as failed until the Redis user is granted it (quorumlock::guide::acl, docs/acl.md)");
            }
            return;
        }
        if !self.live.down.swap(true, Ordering::Relaxed) {
            metrics::node_up(&self.name, false);
            tracing::warn!(node = %self.name, op = op.as_str(), error = %e, "node unreachable; it counts as failed in every round until it answers again");
        }
    }

    /// Whether the node's last call failed (and none has answered since): rounds whose outcome
    /// is certain without it need not wait for it.
    pub(crate) fn is_down(&self) -> bool {
        self.live.down.load(Ordering::Relaxed)
    }

    /// How many calls the node has answered so far (any of this client's calls): while this
    /// moves, the node is working through what was sent before a call still waiting.
    pub(crate) fn answers(&self) -> u64 {
        self.live.answers.load(Ordering::Relaxed)
    }

    /// The cause of the last failure, while the node is down.
    pub(crate) fn down_cause(&self) -> Option<NodeError> {
        if !self.is_down() {
            return None;
        }
        crate::core::lock(&self.live.last_failure).clone()
    }

    /// Records whether a call found the node held out of quorums (`why`), moving the
    /// `quorumlock_node_held_out` gauge when that changed.
    pub(super) fn note_held_out(&self, why: Option<&NodeError>) {
        let now = why.map_or(0, |e| {
            HELD_OUT.iter().position(|k| *k == e.kind()).unwrap_or(1)
        });
        let before = self.live.held_out.swap(now as u8, Ordering::Relaxed) as usize;
        if before != now {
            if before != 0 {
                metrics::node_held_out(&self.name, HELD_OUT[before], false);
            }
            if now != 0 {
                metrics::node_held_out(&self.name, HELD_OUT[now], true);
            }
        }
    }

    pub(super) fn mark_up(&self) {
        self.live.answers.fetch_add(1, Ordering::Relaxed);
        if self.live.down.load(Ordering::Relaxed) && self.live.down.swap(false, Ordering::Relaxed) {
            metrics::node_up(&self.name, true);
            tracing::info!(node = %self.name, "node answers again");
        }
    }
}
