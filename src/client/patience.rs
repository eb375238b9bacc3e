//! How long a call waits for its node: the node timeout measures the node, not this client's
//! own queue to it.
//!
//! A node answers a connection's calls in order. Under a burst from this client, a call sits
//! behind thousands of earlier ones, and a timeout counted from when it was queued measures
//! that queue: healthy nodes were named as failed and background releases were given up
//! unsent. So a call still unanswered at the end of a node timeout waits one more while its
//! node answered anything during the last one (it is working through what this client sent
//! before), up to the operation's own bound (`cap`: the lock's validity, or the time by which
//! its keys have expired anyway). A node that answered nothing for a whole node timeout while
//! a call waited has failed ([`NodeError::Timeout`]); a call whose node was still answering
//! when the bound came failed for the client's backlog ([`NodeError::Backlog`]), which never
//! marks the node down.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::error::NodeError;
use crate::node::{Node, Op};

/// The waiting windows of one operation's calls to every node.
#[derive(Debug)]
pub(crate) struct Patience {
    /// One window: the node timeout.
    window: Duration,
    /// The operation's own bound: no window goes past it.
    cap: Instant,
    /// Where the current window ends.
    until: Instant,
    /// Each node's answer count when the current window began.
    seen: SmallVec<[u64; 8]>,
}

impl Patience {
    /// Windows of `window` over `nodes`, the first ending at `first`, none past `cap`.
    pub(crate) fn new(nodes: &[Arc<Node>], window: Duration, first: Instant, cap: Instant) -> Self {
        Patience {
            window,
            cap: cap.max(first),
            until: first,
            seen: nodes.iter().map(|n| n.answers()).collect(),
        }
    }

    /// Where the current window ends.
    pub(crate) fn until(&self) -> Instant {
        self.until
    }

    /// Whether node `i` answered anything (any of this client's calls) since the current
    /// window began.
    pub(crate) fn busy(&self, nodes: &[Arc<Node>], i: usize) -> bool {
        self.seen
            .get(i)
            .is_some_and(|&seen| nodes[i].answers() != seen)
    }

    /// At the end of a window: another one starts when a node `waiting` names answered
    /// something during this one, unless the cap is reached. Lets the tasks that hold answers
    /// already arrived run first (on a busy runtime, an answer is counted when its caller's
    /// task runs, which may come after this timer's).
    pub(crate) async fn renew(
        &mut self,
        nodes: &[Arc<Node>],
        waiting: impl Fn(usize) -> bool,
    ) -> bool {
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        self.renew_now(nodes, waiting)
    }

    /// [`renew`](Self::renew) without letting other tasks run first: for a caller that cannot
    /// wait (a sweep of parked calls).
    pub(crate) fn renew_now(
        &mut self,
        nodes: &[Arc<Node>],
        waiting: impl Fn(usize) -> bool,
    ) -> bool {
        if self.until >= self.cap {
            return false;
        }
        if !(0..nodes.len()).any(|i| waiting(i) && self.busy(nodes, i)) {
            return false;
        }
        for (seen, node) in self.seen.iter_mut().zip(nodes) {
            *seen = node.answers();
        }
        self.until = (Instant::now() + self.window).min(self.cap);
        true
    }

    /// The failure of node `i`, which had not answered when the waiting ended after `waited`:
    /// the client's backlog when the node was still answering during the last window, a
    /// timeout otherwise.
    pub(crate) fn failure(&self, nodes: &[Arc<Node>], i: usize, waited: Duration) -> NodeError {
        if self.busy(nodes, i) {
            NodeError::Backlog(waited)
        } else {
            NodeError::Timeout(waited)
        }
    }
}

/// Runs `call` (a future of a call to `node`) with windows of `window` from now, none past
/// `cap` (see the module's text); a failure is recorded on the node as a timed-out call.
pub(crate) async fn patiently(
    node: &Arc<Node>,
    call: impl Future<Output = Result<Value, NodeError>>,
    op: Op,
    window: Duration,
    cap: Instant,
) -> Result<Value, NodeError> {
    let start = Instant::now();
    let nodes = std::slice::from_ref(node);
    let mut patience = Patience::new(nodes, window, (start + window).min(cap), cap);
    let mut call = std::pin::pin!(call);
    loop {
        if let Ok(reply) = tokio::time::timeout_at(patience.until(), call.as_mut()).await {
            return reply;
        }
        let renewed = patience.renew(nodes, |_| true).await;
        if let std::task::Poll::Ready(reply) = futures::poll!(call.as_mut()) {
            return reply;
        }
        if !renewed {
            let e = patience.failure(nodes, 0, start.elapsed());
            node.timed_out(op, &e);
            return Err(e);
        }
    }
}
