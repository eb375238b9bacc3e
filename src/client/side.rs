//! One command on every node, for what the lock client does not say itself: the election's
//! leader record and announcements, run-once's tick markers.
//!
//! Each call goes through the node's one connection ([`Node::with_connection`]): the
//! certificates, TCP settings, restart guard and one-server check of the lock's own calls, in
//! order with them, bounded by the node timeout (connecting included).
//!
//! [`Node::with_connection`]: crate::node::Node::with_connection

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use redis::FromRedisValue;
use tokio::time::Instant;

use super::Engine;
use super::status::LockStatus;
use crate::core::quorum::HolderView;
use crate::core::timing;
use crate::error::{Error, NodeError, NodeFailure};
use crate::node::Node;
// What a feature names to talk to the nodes through the engine: whether a call respects the
// restart hold-out, the commands and scripts it sends (built in `node/`), and the subscriber of
// a per-node subscription. Features import these from here, never from `node/`.
pub(crate) use crate::node::HoldOut;
pub(crate) use crate::node::commands;
pub(crate) use crate::node::pubsub::Subscriber;
pub(crate) use crate::node::scripts::{FENCED_WRITE, LEADER_RESIGN, LEADER_WRITE};

/// Each node's reply to one command, in node order.
#[derive(Debug)]
pub(crate) struct Replies<T> {
    nodes: Vec<(String, Result<T, NodeError>)>,
}

impl Engine {
    /// For each node, in configuration order: how long ago this client last saw it lose its
    /// data (a restart or failover without proof the data survived), when that is less than
    /// `within` ago. A node's "absent" for a key written with an expiry of `within` proves
    /// absence only where this is `None`.
    pub(crate) fn lost_data_within(
        &self,
        within: std::time::Duration,
    ) -> Vec<Option<std::time::Duration>> {
        self.inner
            .nodes
            .iter()
            .map(|n| n.lost_data_within(within))
            .collect()
    }

    /// One subscription per node, each kept up by the node layer's pub/sub loop (reconnect
    /// pauses, `PING` checks) on `handle` until its handle is dropped. `subscriber` makes the
    /// subscriber of the node it is given the name of.
    pub(crate) fn subscribe_everywhere<S>(
        &self,
        handle: &tokio::runtime::Handle,
        mut subscriber: impl FnMut(&str) -> S,
    ) -> Vec<tokio_util::task::AbortOnDropHandle<()>>
    where
        S: Subscriber + Send + 'static,
    {
        self.inner
            .nodes
            .iter()
            .map(|node| {
                let task =
                    crate::node::pubsub::keep_subscribed(Arc::clone(node), subscriber(node.name()));
                tokio_util::task::AbortOnDropHandle::new(handle.spawn(task))
            })
            .collect()
    }

    /// Sends `cmd` to every node at once, each call bounded by the node timeout. With
    /// [`HoldOut::Respect`], the answer of a node that counts toward no quorum (within its
    /// restart hold-out, a second URL of one server, evicting under the strict guard) is
    /// replaced by why: it neither confirms nor denies anything. (The command is sent all the
    /// same: the hold-out is known only once the connect has read the node's run id.)
    pub(crate) async fn on_every_node<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        hold_out: HoldOut,
    ) -> Replies<T> {
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let calls = self.inner.nodes.iter().map(|node| async move {
            let reply = command_on(node, cmd, hold_out, deadline).await;
            (node.name().to_owned(), reply)
        });
        Replies {
            nodes: futures::future::join_all(calls).await,
        }
    }

    /// `held`, or [`Error::WrongType`] when the key is held by data of another type: in compat
    /// mode the lock is the plain key, and a `SET NX` refused by an application's hash, list or
    /// set reads as a holder that never leaves. Asked only when an acquisition gives up held,
    /// with one `TYPE` per node.
    pub(crate) async fn held_or_wrong_type(&self, key: &str, held: Error) -> Error {
        if !self.keys().is_compat() {
            return held;
        }
        let cmd = commands::key_type(self.keys().lock_keys(key).lock());
        let replies = self.on_every_node::<String>(&cmd, HoldOut::Ignore).await;
        let mut others = replies
            .nodes
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter(|t| t != "string" && t != "none");
        match others.next() {
            Some(kind) => Error::WrongType {
                key: key.to_owned(),
                kind,
                nodes: 1 + others.count(),
            },
            None => held,
        }
    }

    /// [`on_every_node`](Self::on_every_node) for a write or an announcement whose caller needs
    /// only a quorum's answers (an election's leader record, its notices): it returns once a
    /// quorum has answered and the others have had as long again as that took
    /// ([`until_quorum`]). Each call runs in a task of the client's, so a call still running
    /// then goes on in the background, bounded by the node timeout: every node still gets the
    /// command, in order on its connection, but a hung node costs the caller no timeout. A
    /// node not waited for reads as timed out after the time the caller waited. `hold_out` as
    /// for `on_every_node` (a held-out node's answer does not count toward the quorum).
    pub(crate) async fn on_every_node_to_quorum<T>(
        &self,
        cmd: &redis::Cmd,
        hold_out: HoldOut,
    ) -> Replies<T>
    where
        T: FromRedisValue + Send + 'static,
    {
        let start = Instant::now();
        let deadline = start + self.inner.cfg.node_timeout;
        let calls = self.inner.nodes.iter().map(|node| {
            let (node, cmd) = (Arc::clone(node), cmd.clone());
            let task = self
                .inner
                .tasks
                .spawn(async move { command_on(&node, &cmd, hold_out, deadline).await });
            async move {
                task.await
                    .unwrap_or_else(|_| Err(NodeError::Timeout(start.elapsed())))
            }
        });
        let answers = until_quorum(calls, self.quorum(), deadline).await;
        Replies {
            nodes: self
                .inner
                .nodes
                .iter()
                .zip(answers)
                .map(|(node, answer)| {
                    let reply = answer.unwrap_or_else(|| Err(NodeError::Timeout(start.elapsed())));
                    (node.name().to_owned(), reply)
                })
                .collect(),
        }
    }
}

/// `cmd` on one node's connection, bounded by `deadline`. With [`HoldOut::Respect`], the answer
/// of a node that counts toward no quorum is replaced by why (see
/// [`Engine::on_every_node`]).
async fn command_on<T: FromRedisValue>(
    node: &Arc<Node>,
    cmd: &redis::Cmd,
    hold_out: HoldOut,
    deadline: Instant,
) -> Result<T, NodeError> {
    let send = |mut conn: redis::aio::MultiplexedConnection| async move {
        cmd.query_async::<T>(&mut conn).await
    };
    let reply = node.with_connection(send, deadline).await;
    match node.held_out() {
        Some(why) if hold_out == HoldOut::Respect && reply.is_ok() => Err(why),
        _ => reply,
    }
}

/// The results of one call per node, in the calls' order (`None`: not ended), collected until
/// every call has ended, or a quorum has answered (`Ok`) and the others have had as long again
/// as that took (`timing::stragglers_until`), or `deadline`. Calls still running then are
/// dropped: for reads and marks whose caller can decide on a quorum's answers, a hung node
/// costs the quorum's own time, not the node timeout.
pub(crate) async fn until_quorum<T, E, F>(
    calls: impl IntoIterator<Item = F>,
    quorum: usize,
    deadline: Instant,
) -> Vec<Option<Result<T, E>>>
where
    F: Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    let mut pending: futures::stream::FuturesUnordered<_> = calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| async move { (i, call.await) })
        .collect();
    let mut results: Vec<Option<Result<T, E>>> = (0..pending.len()).map(|_| None).collect();
    let mut answered = 0;
    let mut until = deadline;
    while let Ok(Some((i, result))) = tokio::time::timeout_at(until, pending.next()).await {
        if result.is_ok() {
            answered += 1;
            if answered == quorum {
                until = timing::stragglers_until(start, Instant::now(), until);
            }
        }
        results[i] = Some(result);
    }
    results
}

impl<T> Replies<T> {
    /// How many nodes answered.
    pub(crate) fn answered(&self) -> usize {
        self.nodes.iter().filter(|(_, r)| r.is_ok()).count()
    }

    /// How many nodes were asked.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// How many of the nodes for which `counts(i)` holds answered (`i` the node's index).
    pub(crate) fn answered_where(&self, counts: impl Fn(usize) -> bool) -> usize {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, (_, r))| r.is_ok() && counts(*i))
            .count()
    }

    /// The answers, in node order.
    pub(crate) fn answers(&self) -> impl Iterator<Item = &T> {
        self.nodes.iter().filter_map(|(_, r)| r.as_ref().ok())
    }

    /// The nodes that did not answer, and why.
    pub(crate) fn failures(&self) -> Vec<NodeFailure> {
        self.nodes
            .iter()
            .filter_map(|(node, r)| {
                r.as_ref().err().map(|cause| NodeFailure {
                    node: node.clone(),
                    cause: cause.clone(),
                })
            })
            .collect()
    }
}

impl LockStatus {
    /// The election's split-vote check, after an attempt was refused as held: this read shows
    /// nobody holding the lock (no value on a quorum, and the nodes that did not answer could
    /// not complete one), so contenders that tried together split the nodes and a short retry
    /// can win. The acquisition resolves the splits its refusals prove; this catches those it
    /// could not prove (a node failed in the round) or that outlast its rounds. A partial view
    /// ([`HolderView::Unknown`]) is not a split: the holder may stand on the nodes not reached.
    /// (Run-once retries on a partial view too: a skipped tick has no second chance.)
    pub(crate) fn is_split_vote(&self) -> bool {
        self.holder_view() == HolderView::Vacant && self.answered() >= self.quorum
    }
}
