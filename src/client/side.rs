//! The features' door to the nodes: one engine call for each thing a feature asks of every
//! node (the election's leader record, its notices and their subscription, run-once's tick
//! markers), and the fenced write a holder sends to its own Redis. A feature names no command,
//! script or type of the node layer: the calls here build and send them.
//!
//! Each call to a lock node goes through the node's one connection
//! ([`Node::with_connection`]): the certificates, TCP settings, restart guard and one-server
//! check of the lock's own calls, in order with them, bounded by the node timeout (connecting
//! included).
//!
//! [`Node::with_connection`]: crate::node::Node::with_connection

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use redis::FromRedisValue;
use redis::aio::{ConnectionLike, PubSubSink};
use tokio::time::Instant;

use super::Engine;
use super::status::LockStatus;
use crate::core::quorum::{self, HolderView};
use crate::core::timing;
use crate::core::token::FencingToken;
use crate::error::{Error, NodeError, NodeFailure};
use crate::node::pubsub::{Subscriber, keep_subscribed};
use crate::node::scripts::{FENCED_WRITE, LEADER_RESIGN, LEADER_WRITE};
use crate::node::{HoldOut, Node, commands};

/// Each node's reply to one command, in node order.
#[derive(Debug)]
pub(crate) struct Replies<T> {
    nodes: Vec<(String, Result<T, NodeError>)>,
}

impl Engine {
    /// Writes an election's leader record `record` at `record_key` on every node where the
    /// term's lock value `value` stands at `lock_key` (a script checks the value and sets the
    /// record in one step; reply 1 there, 0 elsewhere), to a quorum
    /// ([`on_every_node_to_quorum`](Self::on_every_node_to_quorum)). The election's scripts are
    /// sent as `EVAL` with their body: they run once per term, and a body never meets
    /// `NOSCRIPT`.
    pub(crate) async fn write_leader_record(
        &self,
        lock_key: &str,
        record_key: &str,
        value: &str,
        record: &str,
    ) -> Replies<i64> {
        let keys = [lock_key, record_key];
        let cmd = commands::eval(LEADER_WRITE.code(), &keys, &[value, record]);
        self.on_every_node_to_quorum(&cmd, HoldOut::Ignore).await
    }

    /// Reads an election's leader record at `record_key` on every node.
    pub(crate) async fn read_leader_record(&self, record_key: &str) -> Replies<Option<String>> {
        let cmd = commands::get(record_key);
        self.on_every_node(&cmd, HoldOut::Ignore).await
    }

    /// Deletes an election's leader record at `record_key` where it is still exactly `ours`,
    /// then publishes `message` on `channel` (reply: subscribers reached), to a quorum.
    pub(crate) async fn resign_leader(
        &self,
        record_key: &str,
        ours: &str,
        channel: &str,
        message: &str,
    ) -> Replies<i64> {
        let cmd = commands::eval(
            LEADER_RESIGN.code(),
            &[record_key],
            &[ours, channel, message],
        );
        self.on_every_node_to_quorum(&cmd, HoldOut::Ignore).await
    }

    /// Publishes `message` on `channel` on every node (reply: subscribers reached), to a
    /// quorum.
    pub(crate) async fn publish_everywhere(&self, channel: &str, message: &str) -> Replies<i64> {
        let cmd = commands::publish(channel, message);
        self.on_every_node_to_quorum(&cmd, HoldOut::Ignore).await
    }

    /// Writes a marker: `value` at `key` where the key is absent (`SET NX PX`), expiring after
    /// `ttl`, on every node, to a quorum. A node's `OK` (written) and nil (already there) both
    /// leave the marker there; a node that counts toward no quorum (within its restart
    /// hold-out) answers with why.
    pub(crate) async fn write_marker(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Replies<Option<String>> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let cmd = commands::set_nx_px(key, value, ttl_ms);
        self.on_every_node_to_quorum(&cmd, HoldOut::Respect).await
    }

    /// Reads a marker written on a quorum with [`write_marker`](Self::write_marker), to a
    /// quorum: `Ok(Some(value))` when any node has it (the nodes that answer are a quorum),
    /// `Ok(None)` when its absence is proven, else [`Error::NoQuorum`] naming each node that
    /// did not answer and each whose absence proved nothing
    /// ([`NodeError::LostDataRecently`]).
    ///
    /// Absent needs a quorum of answers from nodes this client has not seen lose their data
    /// (a restart or failover without proof it survived) within `expiry`, the marker's: such a
    /// node may have lost the marker with the rest, so its "absent" proves nothing until every
    /// marker it may have lost has expired anyway. `may_hide` says which losses count, given
    /// when the loss was seen on the wall clock (`None`: earlier than the clock can say).
    pub(crate) async fn read_proving_absence(
        &self,
        key: &str,
        expiry: Duration,
        may_hide: impl Fn(Option<SystemTime>) -> bool,
    ) -> Result<Option<String>, Error> {
        let replies = self
            .on_every_node_to_quorum::<Option<String>>(&commands::get(key), HoldOut::Respect)
            .await;
        if let Some(value) = replies.answers().flatten().next() {
            return Ok(Some(value.clone()));
        }
        let now = SystemTime::now();
        let lost: Vec<Option<Duration>> = self
            .inner
            .nodes
            .iter()
            .map(|n| {
                n.lost_data_within(expiry)
                    .filter(|&ago| may_hide(now.checked_sub(ago)))
            })
            .collect();
        let proven = replies.answered_where(|i| lost.get(i).is_some_and(Option::is_none));
        let quorum = self.quorum();
        if quorum::marker_absent(proven, quorum) {
            return Ok(None);
        }
        let mut failures = replies.failures();
        for (node, ago) in self.inner.nodes.iter().zip(&lost) {
            if let Some(ago) = *ago
                && !failures.iter().any(|f| f.node == node.name())
            {
                failures.push(NodeFailure {
                    node: node.name().to_owned(),
                    cause: NodeError::LostDataRecently { ago },
                });
            }
        }
        Err(Error::no_quorum(
            key,
            proven,
            replies.len(),
            quorum,
            failures,
        ))
    }

    /// Subscribes to `channel` on every node, each subscription kept up by the node layer's
    /// pub/sub loop (reconnect pauses, `PING` checks) on `handle` until its handle is dropped.
    /// `heard` gets each message's payload, and a word when a node's subscription was made
    /// again (messages may have been missed meanwhile).
    pub(crate) fn subscribe_everywhere(
        &self,
        handle: &tokio::runtime::Handle,
        channel: &str,
        heard: impl Fn(Heard<'_>) + Clone + Send + 'static,
    ) -> Vec<tokio_util::task::AbortOnDropHandle<()>> {
        self.inner
            .nodes
            .iter()
            .map(|node| {
                let subscriber = OneChannel {
                    node: node.name().to_owned(),
                    channel: channel.to_owned(),
                    heard: heard.clone(),
                    subscribed_before: false,
                };
                let task = keep_subscribed(Arc::clone(node), subscriber);
                tokio_util::task::AbortOnDropHandle::new(handle.spawn(task))
            })
            .collect()
    }

    /// Sends `cmd` to every node at once, each call bounded by the node timeout. With
    /// [`HoldOut::Respect`], the answer of a node that counts toward no quorum (within its
    /// restart hold-out, a second URL of one server, evicting under the strict guard) is
    /// replaced by why: it neither confirms nor denies anything. (The command is sent all the
    /// same: the hold-out is known only once the connect has read the node's run id.)
    async fn on_every_node<T: FromRedisValue>(
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
    async fn on_every_node_to_quorum<T>(&self, cmd: &redis::Cmd, hold_out: HoldOut) -> Replies<T>
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
    let send = |mut conn: crate::node::Single| async move { cmd.query_async::<T>(&mut conn).await };
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

/// What a subscription of [`Engine::subscribe_everywhere`] hears from one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard<'a> {
    /// A message on the channel: its payload.
    Message(&'a str),
    /// The node's subscription was made again: messages may have been missed meanwhile.
    Resubscribed,
}

/// A feature's subscription to one channel on one node.
struct OneChannel<F> {
    /// The node's name, for log lines.
    node: String,
    channel: String,
    heard: F,
    /// Whether a subscription stood before: a re-established one may have missed messages.
    subscribed_before: bool,
}

impl<F: Fn(Heard<'_>) + Send> Subscriber for OneChannel<F> {
    async fn subscribe(&mut self, sink: &mut PubSubSink, timeout: Duration) -> Result<(), String> {
        match tokio::time::timeout(timeout, sink.subscribe(&self.channel)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("subscribe failed: {e}")),
            Err(_) => return Err("subscribe timed out".to_owned()),
        }
        tracing::debug!(node = %self.node, channel = %self.channel, "subscribed");
        if std::mem::replace(&mut self.subscribed_before, true) {
            (self.heard)(Heard::Resubscribed);
        }
        Ok(())
    }

    fn message(&mut self, msg: redis::Msg) {
        let payload: String = msg.get_payload().unwrap_or_default();
        (self.heard)(Heard::Message(&payload));
    }

    fn lost(&mut self, why: &str) {
        tracing::debug!(node = %self.node, channel = %self.channel, reason = %why, "subscription lost; resubscribing");
    }
}

/// The fenced write on a holder's own Redis (`conn`), never on a lock node: raises the highest
/// token seen at `"{data_key}:fence"` to `token` if none higher came before and, with a
/// `value`, writes it at `data_key` in the same step. Returns whether it was applied, and the
/// highest token the resource had seen.
pub(crate) async fn fenced_write<C, V>(
    conn: &mut C,
    data_key: &str,
    token: FencingToken,
    value: Option<V>,
) -> redis::RedisResult<(bool, FencingToken)>
where
    C: ConnectionLike + Send,
    V: redis::ToRedisArgs + Send + Sync,
{
    let fence_key = format!("{data_key}:fence");
    let script = FENCED_WRITE.script();
    let mut call = script.key(&fence_key);
    if let Some(value) = value {
        call.key(data_key).arg(token.get()).arg(value);
    } else {
        call.arg(token.get());
    }
    let (applied, highest): (i64, u64) = call.invoke_async(conn).await?;
    Ok((applied == 1, FencingToken::new(highest)))
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
