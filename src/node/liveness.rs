//! Whether a node's last call failed, and why: failures are logged at warn on the way down and
//! at info on the way back, not on every call; a round that did not wait for the node names the
//! last failure's cause.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

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
}

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
        ) {
            return;
        }
        *crate::core::lock(&self.live.last_failure) = Some(e.clone());
        if let NodeError::Denied { command, .. } = e {
            if !self.live.down.swap(true, Ordering::Relaxed) {
                tracing::warn!(node = %self.name, op = op.as_str(), %command, error = %e, "the node's ACL refuses a command quorumlock needs; it counts as failed until the Redis user is granted it (quorumlock::guide::acl, docs/acl.md)");
            }
            return;
        }
        if !self.live.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(node = %self.name, op = op.as_str(), error = %e, "node unreachable; it counts as failed in every round until it answers again");
        }
    }

    /// Whether the node's last call failed (and none has answered since): rounds whose outcome
    /// is certain without it need not wait for it.
    pub(crate) fn is_down(&self) -> bool {
        self.live.down.load(Ordering::Relaxed)
    }

    /// The cause of the last failure, while the node is down.
    pub(crate) fn down_cause(&self) -> Option<NodeError> {
        if !self.is_down() {
            return None;
        }
        crate::core::lock(&self.live.last_failure).clone()
    }

    pub(super) fn mark_up(&self) {
        if self.live.down.load(Ordering::Relaxed) && self.live.down.swap(false, Ordering::Relaxed) {
            tracing::info!(node = %self.name, "node answers again");
        }
    }
}
