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

/// Tasks waiting in the runtime's shared queue beyond which this client counts as too busy to
/// tell a silent node from answers it has not read yet.
const QUEUED_TASKS: usize = 32;

/// The waiting windows of one operation's calls to every node.
#[derive(Debug)]
pub(crate) struct NodeWait {
    /// One window: the node timeout.
    window: Duration,
    /// The operation's own bound: no window goes past it.
    cap: Instant,
    /// Where the current window ends.
    until: Instant,
    /// When the current window began (`seen` was read).
    since: Instant,
    /// Each node's answer count when the current window began.
    seen: SmallVec<[u64; 8]>,
    /// Whether this client was too busy to tell at the last judgement: its tasks (the callers
    /// that count the nodes' answers among them) waited long for their turn, so answers
    /// already arrived may not have been counted.
    starved: bool,
}

impl NodeWait {
    /// Windows of `window` over `nodes`, the first begun at `since` (the calls were made) and
    /// ending at `first`, none past `cap`.
    pub(crate) fn new(
        nodes: &[Arc<Node>],
        window: Duration,
        since: Instant,
        first: Instant,
        cap: Instant,
    ) -> Self {
        NodeWait {
            window,
            cap: cap.max(first),
            until: first,
            since,
            seen: nodes.iter().map(|n| n.answers()).collect(),
            starved: false,
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

    /// At the end of a window: another one starts, unless the cap is reached, when a node
    /// `waiting` names answered something during this one, when this one was shorter than a
    /// node timeout (its end was set before the calls were made), or when this client is too
    /// busy to tell: its tasks wait long for their turn (an answer is counted when its
    /// caller's task runs), or this timer came late. Lets the tasks that hold answers already
    /// arrived run first.
    pub(crate) async fn renew(
        &mut self,
        nodes: &[Arc<Node>],
        waiting: impl Fn(usize) -> bool,
    ) -> bool {
        // How long this task waits for its turn is about how long any task of this client
        // does, the callers that would count the answers among them.
        let queued = Instant::now();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        // On the multi-thread runtime this task may wait less than the others (each worker
        // has a queue of its own): tasks left waiting in the runtime's shared queue (spawned
        // from outside it, or overflowing the workers' own) say the same.
        let shared =
            tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().global_queue_depth());
        let lagged = queued.elapsed() > self.window / 20 || shared > QUEUED_TASKS;
        self.judge(nodes, waiting, lagged)
    }

    /// [`renew`](Self::renew) without letting other tasks run first: for a caller that cannot
    /// wait (a sweep of parked calls).
    pub(crate) fn renew_now(
        &mut self,
        nodes: &[Arc<Node>],
        waiting: impl Fn(usize) -> bool,
    ) -> bool {
        self.judge(nodes, waiting, false)
    }

    /// The judgement of [`renew`](Self::renew); `lagged`: this client's tasks wait long for
    /// their turn.
    fn judge(
        &mut self,
        nodes: &[Arc<Node>],
        waiting: impl Fn(usize) -> bool,
        lagged: bool,
    ) -> bool {
        let now = Instant::now();
        self.starved = lagged || now.saturating_duration_since(self.until) > self.window / 4;
        if self.until >= self.cap {
            return false;
        }
        let busy = (0..nodes.len()).any(|i| waiting(i) && self.busy(nodes, i));
        if busy {
            for (seen, node) in self.seen.iter_mut().zip(nodes) {
                *seen = node.answers();
            }
            self.since = now;
            self.until = now + self.window;
        } else if self.starved {
            self.until = now + self.window;
        } else if now < self.since + self.window {
            self.until = self.since + self.window;
        } else {
            return false;
        }
        self.until = self.until.min(self.cap);
        true
    }

    /// The failure of node `i`, which had not answered when the waiting ended after `waited`:
    /// the client's backlog when the node was still answering during the last window (or the
    /// client was too busy to tell), a timeout otherwise.
    pub(crate) fn failure(&self, nodes: &[Arc<Node>], i: usize, waited: Duration) -> NodeError {
        if self.busy(nodes, i) || self.starved {
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
    let mut patience = NodeWait::new(nodes, window, start, (start + window).min(cap), cap);
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
