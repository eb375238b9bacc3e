//! The late answers of a round: its calls still unanswered at the verdict (the *tail*), kept
//! until they reach their nodes (see `docs/design.md`, "Late answers"), all driven by one
//! loop. A won acquisition's tail is handed to its connections and kept by its lock, in a
//! [`WonTail`] that feeds it its late counters; every other tail is settled here: collected
//! without a waker, parked on the engine (no task, no timer) when keeping its futures is
//! enough, else driven by a task of its own. A release's calls given up are counted for the
//! next `flush`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use redis::Value;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::Engine;
use super::patience::NodeWait;
use crate::core::lock;
use crate::error::NodeError;
use crate::node::{Node, NotSent, RoundGate};

/// Per-node values of a round, inline (no allocation) up to this many nodes.
pub(super) const INLINE: usize = 8;

/// Which calls are over: answered, or stopped unsent by their round's gate ([`NotSent`]).
pub(super) type Answered = SmallVec<[bool; INLINE]>;

/// What became of one call of a round: its node's reply, or [`NotSent`] (nothing reached it).
pub(super) type Outcome = Result<Result<Value, NodeError>, NotSent>;

/// A node's answer in a round: its index and what became of its call.
pub(super) type Reply = (usize, Outcome);

/// Hands an integer answer of node `i` (an acquisition's counter) to `on_counter`.
fn counter_of(i: usize, outcome: &Outcome, on_counter: &mut impl FnMut(usize, i64)) {
    if let Ok(Ok(Value::Int(counter))) = outcome {
        on_counter(i, *counter);
    }
}

/// The unanswered calls of a finished round, behind one allocation per round (a call is not
/// boxed on its own: the round's calls are one `FuturesUnordered` of one concrete type).
pub(super) trait Pending: Stream<Item = Reply> + Send + Unpin {
    fn len(&self) -> usize;
}

impl<F: Future<Output = Reply> + Send> Pending for FuturesUnordered<F> {
    fn len(&self) -> usize {
        FuturesUnordered::len(self)
    }
}

/// The calls of a round still unanswered when its verdict was taken.
///
/// They are parked or driven until the round's deadline so that their queued commands reach
/// the nodes (see `Engine::settle` and `docs/design.md`, "Late answers").
pub(crate) struct Tail {
    /// `None` when every call had answered by the verdict.
    calls: Option<Box<dyn Pending>>,
    answered: Answered,
    pub(super) gate: RoundGate,
    pub(super) deadline: Instant,
    /// A release's waiting windows (`None` for other rounds, and when every call answered by
    /// the verdict): its calls still queued behind busy nodes wait on, up to its bound
    /// (`patience.rs`); given up unanswered, they are counted as undelivered.
    patience: Option<Box<NodeWait>>,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("unanswered", &self.unanswered())
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl Tail {
    /// The tail of a round: its unanswered `calls` (`None` when every call had answered),
    /// which calls are over, its gate and deadline, and a release's waiting windows.
    pub(super) fn new(
        calls: Option<Box<dyn Pending>>,
        answered: Answered,
        gate: RoundGate,
        deadline: Instant,
        patience: Option<Box<NodeWait>>,
    ) -> Self {
        Tail {
            calls,
            answered,
            gate,
            deadline,
            patience,
        }
    }

    /// Whether keeping the calls without polling them is enough: every unanswered call is
    /// queued on its connection (a kept future keeps it from being skipped), or the round is
    /// closed (the others must not be sent).
    fn can_park(&self) -> bool {
        self.gate.is_closed() || self.all_handed()
    }

    /// Whether every call neither answered nor handed goes to a node known down (its last call
    /// failed), whose connection is being made again: nothing waits for such a node (a round
    /// does not, `Answers::pending_down`), so the lock need not stand there either, and the
    /// round may be closed at once instead of handed (its release would otherwise wait for the
    /// handing, up to the node timeout, on every lock while such a node is hung).
    fn unhanded_only_to_down(&self, nodes: &[Arc<Node>]) -> bool {
        self.settled_but(|i| nodes[i].is_down())
    }

    /// Whether node `i` had answered when the round's verdict was taken.
    pub(super) fn answered_by_verdict(&self, i: usize) -> bool {
        self.answered.get(i).copied().unwrap_or(false)
    }

    /// How many calls have not answered.
    fn unanswered(&self) -> usize {
        self.calls.as_ref().map_or(0, |c| c.len())
    }

    /// Whether every call has answered: nothing is left that must be kept.
    pub(super) fn is_empty(&self) -> bool {
        self.unanswered() == 0
    }

    /// Collects the answers that have arrived since the round ended, without waiting, and
    /// leaves the calls' wake-ups to nobody: polled with a no-op waker, the calls no longer
    /// wake the task that ran the round (before the first such poll, every late answer woke it
    /// for nothing: the round is over and it reads the tail only here). Each integer answer
    /// (node, counter) goes to `on_counter` (a won acquisition's lock: where else its counter
    /// stands at the token). True once every call has answered: nothing is left that must be
    /// kept.
    pub(super) fn collect(&mut self, mut on_counter: impl FnMut(usize, i64)) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let _ = self.poll_answers(&mut cx, &mut |i, reply| {
            counter_of(i, &reply, &mut on_counter)
        });
        self.is_empty()
    }

    /// Whether every call that has not answered by the verdict has been handed to its
    /// connection since (a call that answered later was handed too).
    fn all_handed(&self) -> bool {
        self.settled_but(|_| false)
    }

    /// Whether every call has answered, but for those that were never sent and never will be
    /// (not handed when the round was closed): nothing is left to wait for.
    fn only_unsent_left(&self) -> bool {
        self.answered
            .iter()
            .enumerate()
            .all(|(i, &answered)| answered || self.gate.never_sent(i))
    }

    /// Whether every call has answered or been handed, but for those to the nodes `excused`
    /// names.
    fn settled_but(&self, excused: impl Fn(usize) -> bool) -> bool {
        self.answered
            .iter()
            .enumerate()
            .all(|(i, &answered)| answered || self.gate.handed(i) || excused(i))
    }

    /// Polls the unanswered calls once with `cx`: each answer that came marks its call answered
    /// and goes to `on_reply`. Ready once no call is left.
    fn poll_answers(
        &mut self,
        cx: &mut Context<'_>,
        on_reply: &mut impl FnMut(usize, Outcome),
    ) -> Poll<()> {
        let Some(calls) = &mut self.calls else {
            return Poll::Ready(());
        };
        loop {
            match calls.poll_next_unpin(cx) {
                Poll::Ready(Some((i, reply))) => {
                    self.answered[i] = true;
                    on_reply(i, reply);
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The one loop that drives a tail's calls: until `until`, each answer marks its call
    /// answered and goes to `on_reply`, and the loop ends once no call is left or `done`
    /// holds (checked before the calls are polled, and after). True when it ended before
    /// `until`.
    async fn run_until(
        &mut self,
        until: Instant,
        mut on_reply: impl FnMut(usize, Outcome),
        done: impl Fn(&Tail) -> bool,
    ) -> bool {
        let run = std::future::poll_fn(|cx| {
            if done(self) || self.poll_answers(cx, &mut on_reply).is_ready() || done(self) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        tokio::time::timeout_at(until, run).await.is_ok()
    }

    /// Drives a won acquisition's calls (its round still open) until each has been handed to
    /// its connection, or answered, or the round's deadline has passed, reporting their
    /// integer answers (node, counter) to `on_counter` (the lock: `LockState::late_yes`). A
    /// call to a node whose connection was still being made at the verdict is sent once it is
    /// up, instead of giving up: the lock then stands on every node that answers within the
    /// node timeout, not only on the quorum that answered first. When this returns, every call
    /// handed was handed in one of its polls, so it is queued on its connection before
    /// anything sent afterwards.
    pub(super) async fn hand(&mut self, mut on_counter: impl FnMut(usize, i64)) {
        let deadline = self.deadline;
        // Never handed after the deadline, even on a first poll that comes late (a runtime too
        // busy to run this task meanwhile).
        let done = |tail: &Tail| Instant::now() >= deadline || tail.all_handed();
        let on_reply = |i, reply| counter_of(i, &reply, &mut on_counter);
        self.run_until(deadline, on_reply, done).await;
    }

    /// Drives the unanswered calls to their answer, bounded by the round's deadline, and
    /// returns the answers that came (node index, reply); a call not sent has none.
    pub(super) async fn answers(mut self) -> Vec<(usize, Result<Value, NodeError>)> {
        let mut got = Vec::new();
        let on_reply = |i, reply: Outcome| {
            if let Ok(reply) = reply {
                got.push((i, reply));
            }
        };
        self.run_until(self.deadline, on_reply, |_| false).await;
        got
    }

    /// Drives the unanswered calls to their answer, bounded by the round's deadline (a
    /// release's, renewed while its nodes work through this client's earlier calls); not those
    /// of a closed round still waiting for their connection (they will never be sent). A
    /// release's calls given up are counted as undelivered (`Redlock::flush`).
    pub(super) async fn drive(mut self, client: Engine) {
        let nodes = &client.inner.nodes;
        loop {
            let done = self
                .run_until(self.deadline, |_, _| {}, Tail::only_unsent_left)
                .await;
            let Some(patience) = self.patience.as_mut().filter(|_| !done) else {
                break;
            };
            let answered = &self.answered;
            if !patience.renew(nodes, |i| !answered[i]).await {
                break;
            }
            self.deadline = patience.until();
        }
        client.count_undelivered(&self);
    }

    /// A parked release tail past its deadline: whether it waits another window (its nodes
    /// are still answering this client's earlier calls, and its bound has not come).
    pub(super) fn renew_parked(&mut self, nodes: &[Arc<Node>]) -> bool {
        let Some(patience) = &mut self.patience else {
            return false;
        };
        let answered = &self.answered;
        if !patience.renew_now(nodes, |i| !answered[i]) {
            return false;
        }
        self.deadline = patience.until();
        true
    }

    /// How many of a release's calls were given up: neither answered nor left unsent by a
    /// closed round.
    pub(super) fn undelivered(&self) -> usize {
        if self.patience.is_none() {
            return 0;
        }
        self.answered
            .iter()
            .enumerate()
            .filter(|&(i, &answered)| !answered && !self.gate.never_sent(i))
            .count()
    }
}

/// The late answers of the round that won a lock, kept by the lock (`LockState`) from the
/// grant to its release: the round's gate, its calls still unanswered, and the handing of
/// those calls to their connections (`hand`). The lock reads their integer answers (its
/// counter on each node) through a callback, `on_counter`.
///
/// # Invariants
///
/// - **After the acquisition on every node.** While the handing runs (`handing` set, by
///   [`start_handing`] before its task is spawned), extensions wait for it to end
///   ([`until_handed`]): each call the lock sends next is queued, on each node's connection,
///   after the acquisition's own call there. The handing ends once, however its task ends (a
///   drop guard clears `handing` and notifies `handed`), and hands nothing after the round's
///   deadline.
/// - **Closed before the release.** [`stop_handing`] closes the round's gate before it returns
///   (and before the release is sent): a call not handed by then was never sent and never will
///   be, so the release may skip its node; a call handed is queued before the release.
/// - **Every late counter reaches the lock.** The calls are kept (closed) until each has
///   answered or the release takes them for the engine's parked list ([`take`]); each answer is
///   read, without a waker, before the lock builds an extension or its release
///   ([`collect`]), and each integer answer goes to `on_counter`.
///
/// # Lock order
///
/// Its std mutexes (`tail`, `handing`) are never nested with each other or with the lock's
/// own, and none is held across an `await`, a log line or a metric.
///
/// [`start_handing`]: Self::start_handing
/// [`until_handed`]: Self::until_handed
/// [`stop_handing`]: Self::stop_handing
/// [`take`]: Self::take
/// [`collect`]: Self::collect
#[derive(Debug, Default)]
pub(crate) struct WonTail {
    /// The gate of the round that won the lock (none for a lock resumed from elsewhere): which
    /// of its calls were handed to their connections.
    gate: Option<RoundGate>,
    /// The winning round's calls still unanswered (closed once all were handed: none is sent
    /// any more), kept here rather than parked on the client so that their answers can be
    /// read when the release or an extension is built.
    tail: Mutex<Option<Tail>>,
    /// While the winning round's calls to nodes still connecting at the grant are being handed
    /// ([`Tail::hand`]): until when at the latest (the round's deadline).
    handing: Mutex<Option<Instant>>,
    /// Notified when the handing ends.
    handed: tokio::sync::Notify,
    /// Notified when the release stops the handing ([`stop_handing`](Self::stop_handing)).
    stop: tokio::sync::Notify,
}

impl WonTail {
    /// The late answers of the round behind `gate`.
    pub(crate) fn won_by(gate: RoundGate) -> Self {
        WonTail {
            gate: Some(gate),
            ..WonTail::default()
        }
    }

    /// Takes the won round's unanswered calls: kept at once, closed (reading the answers
    /// already in), when keeping their futures is enough or only calls to nodes known down
    /// are neither answered nor handed (`Tail::unhanded_only_to_down`: closing leaves those
    /// unsent, and the lock does not stand there, as if they had not answered in time).
    /// Otherwise the handing starts, until the round's deadline at the latest, and the tail
    /// is returned for a task to [`hand`](Self::hand).
    pub(crate) fn keep_or_start(
        &self,
        tail: Tail,
        nodes: &[Arc<Node>],
        on_counter: impl FnMut(usize, i64),
    ) -> Option<Tail> {
        if tail.can_park() || tail.unhanded_only_to_down(nodes) {
            self.keep(tail, on_counter);
            return None;
        }
        *lock(&self.handing) = Some(tail.deadline);
        Some(tail)
    }

    /// The handing task's work: hands the calls to their connections ([`Tail::hand`]) until
    /// the release stops it ([`stop_handing`](Self::stop_handing)) at the latest, then keeps
    /// them, closed. The handing ends however this ends (dropped with its runtime included).
    pub(crate) async fn hand(&self, mut tail: Tail, mut on_counter: impl FnMut(usize, i64)) {
        let _handing = EndsHanding(self);
        tokio::select! {
            () = tail.hand(&mut on_counter) => {}
            () = self.stop.notified() => {}
        }
        self.keep(tail, on_counter);
    }

    /// Closes the round and keeps its unanswered calls; the answers already in are read, and
    /// the later ones no longer wake the task that acquired ([`Tail::collect`]).
    fn keep(&self, mut tail: Tail, on_counter: impl FnMut(usize, i64)) {
        tail.gate.close();
        if !tail.collect(on_counter) {
            *lock(&self.tail) = Some(tail);
        }
    }

    /// Reads the answers the kept calls have given since, without waiting; once all have
    /// answered, the calls are dropped.
    pub(crate) fn collect(&self, on_counter: impl FnMut(usize, i64)) {
        let mut tail = lock(&self.tail);
        if let Some(t) = tail.as_mut()
            && t.collect(on_counter)
        {
            *tail = None;
        }
    }

    /// The kept calls still unanswered, for the client's parked list.
    pub(crate) fn take(&self) -> Option<Tail> {
        lock(&self.tail).take()
    }

    /// The handing has ended (or was never needed): extensions and the release may be sent.
    fn end_handing(&self) {
        *lock(&self.handing) = None;
        self.handed.notify_waiters();
    }

    /// Waits until the handing has ended (it hands nothing after the round's deadline), so
    /// that a call sent next to a node runs after the acquisition there. At once in the common
    /// case (every call was handed by the grant). Bounded: one second past the round's
    /// deadline at most, should the task never run (its runtime gone). `key` names the lock in
    /// the log line of that case.
    pub(crate) async fn until_handed(&self, key: &str) {
        loop {
            let handed = self.handed.notified();
            tokio::pin!(handed);
            handed.as_mut().enable();
            let Some(until) = *lock(&self.handing) else {
                return;
            };
            let bound = until + Duration::from_secs(1);
            if tokio::time::timeout_at(bound, handed).await.is_err() {
                tracing::debug!(key, "the acquisition's late calls were not handed in time");
                return;
            }
        }
    }

    /// Before the release: closes the winning round, so that its calls not yet handed to their
    /// connections are never sent, stops the handing and waits until it has ended (its last
    /// poll queued every call it handed), and returns the nodes where the acquisition was
    /// never sent: the release skips them, as nothing of ours can stand there. A node whose
    /// connection is still being made (a fresh client's, to a hung node) is thus never waited
    /// for; one whose call was handed gets the release, queued after the acquisition. `n`: how
    /// many nodes the client has; `key` as for [`until_handed`](Self::until_handed).
    pub(crate) async fn stop_handing(&self, n: usize, key: &str) -> SmallVec<[bool; INLINE]> {
        let Some(gate) = &self.gate else {
            return SmallVec::new();
        };
        gate.close();
        if lock(&self.handing).is_some() {
            self.stop.notify_one();
        }
        self.until_handed(key).await;
        (0..n).map(|i| gate.never_sent(i)).collect()
    }
}

/// Ends a won round's handing ([`WonTail::end_handing`]) when dropped, however the task that
/// hands the round's calls ends.
struct EndsHanding<'a>(&'a WonTail);

impl Drop for EndsHanding<'_> {
    fn drop(&mut self) {
        self.0.end_handing();
    }
}

/// Finished rounds' unanswered calls, kept (unpolled) until their deadline so that the
/// queued commands are written: much cheaper than a task per round (see `Engine::settle`).
#[derive(Debug, Default)]
pub(crate) struct Parked(Mutex<VecDeque<Tail>>);

impl Parked {
    /// Every parked tail, taken out (`flush` drives them).
    pub(super) fn take_all(&self) -> Vec<Tail> {
        lock(&self.0).drain(..).collect()
    }
}

/// How many finished rounds may be parked at once; beyond, a round's calls get a task of their
/// own. Bounds what parked calls hold (a few KB each) under high throughput or long node
/// timeouts.
const MAX_PARKED: usize = 4096;

/// How many parked tails a settle drops at most: more than the one it parks, so the queue
/// drains, and few enough that the caller does not pay for a whole idle spell's backlog.
const SWEEP: usize = 4;

impl Engine {
    /// Counts a release tail's calls given up (`FlushReport::undelivered`).
    pub(crate) fn count_undelivered(&self, tail: &Tail) {
        self.count_undelivered_calls(tail.undelivered());
    }

    /// Counts `n` release calls given up (`FlushReport::undelivered`).
    pub(crate) fn count_undelivered_calls(&self, n: usize) {
        if n > 0 {
            self.inner
                .undelivered
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Makes sure a finished round's unanswered calls reach their nodes: a dropped call may be
    /// skipped by its connection. `close` (acquire and extend): calls still waiting for their
    /// connection give up instead of being sent late, where they could land after a later
    /// extension or the release. The rest are queued on their connections, in order before
    /// anything sent later; keeping their futures until the round's deadline is enough for
    /// their connections to write them, so they are parked (no task, no timer). A parked tail is dropped
    /// once all its calls have answered (collected, oldest first, without a waker, whenever a
    /// round settles), at its deadline at the latest: kept until the deadline, hundreds of
    /// tails piled up under load and their frees cost the client a fifth of its time.
    /// A release's calls still waiting for a connection, or a full parking queue, get a task
    /// that drives them, in `span` (the span of the operation's caller: the operation's own
    /// span ends when it returns).
    pub(crate) fn settle(&self, mut tail: Tail, close: bool, span: &tracing::Span) {
        if close {
            tail.gate.close();
        }
        // Collected at once: what has answered is dropped, and the calls' later answers no
        // longer wake the task that ran the round (`Tail::collect`).
        if tail.collect(|_, _| {}) {
            return;
        }
        if tail.can_park() {
            // At most `SWEEP` tails leave per settle, dropped once the lock is let go: after
            // an idle spell every parked tail has expired, and dropping them all at once (a
            // few hundred, each with a call still pending to a hung node) cost the first
            // operation after it 0.5–0.9 ms (`tools/compare --bin tail --gap-ms 200 --paused`).
            let mut done: [Option<Tail>; SWEEP] = Default::default();
            let mut parked = lock(&self.inner.parked.0);
            let now = Instant::now();
            for slot in &mut done {
                let Some(front) = parked.front_mut() else {
                    break;
                };
                if !front.collect(|_, _| {})
                    && (front.deadline > now || front.renew_parked(&self.inner.nodes))
                {
                    break;
                }
                *slot = parked.pop_front();
            }
            for tail in done.iter().flatten() {
                self.count_undelivered(tail);
            }
            if parked.len() < MAX_PARKED {
                parked.push_back(tail);
                return;
            }
        }
        self.inner.tasks.spawn(tracing::Instrument::instrument(
            tail.drive(self.clone()),
            span.clone(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tail of `n` calls: `ready` were sent and answer at once (node, counter), the others
    /// are never sent and never answer.
    fn tail_of(n: usize, ready: &[(usize, i64)], gate: &RoundGate) -> Tail {
        for &(i, _) in ready {
            assert!(crate::node::Gate::pass(&(gate.clone(), i)).is_ok());
        }
        let calls: FuturesUnordered<futures::future::Either<_, _>> = (0..n)
            .map(|i| match ready.iter().find(|&&(j, _)| j == i) {
                Some(&(_, c)) => futures::future::Either::Left(futures::future::ready((
                    i,
                    Ok(Ok(Value::Int(c))),
                ))),
                None => futures::future::Either::Right(futures::future::pending::<Reply>()),
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        let answered = std::iter::repeat_n(false, n).collect();
        Tail::new(
            Some(Box::new(calls)),
            answered,
            gate.clone(),
            deadline,
            None,
        )
    }

    #[test]
    fn collecting_reads_the_counters_in_and_keeps_the_rest() {
        let gate = RoundGate::new(3, None);
        let mut tail = tail_of(3, &[(1, 7)], &gate);
        let mut seen = Vec::new();
        assert!(!tail.collect(|i, c| seen.push((i, c))));
        assert_eq!(seen, [(1, 7)]);
        assert!(tail.answered_by_verdict(1) && !tail.answered_by_verdict(0));
        assert_eq!(tail.unanswered(), 2);
    }

    #[tokio::test]
    async fn a_handing_task_dropped_midway_ends_the_handing() {
        let gate = RoundGate::new(1, None);
        let won = WonTail::won_by(gate.clone());
        let tail = tail_of(1, &[], &gate);
        *lock(&won.handing) = Some(tail.deadline);
        {
            let hand = won.hand(tail, |_, _| {});
            tokio::pin!(hand);
            assert!(futures::poll!(hand.as_mut()).is_pending());
            assert!(lock(&won.handing).is_some());
        }
        assert!(lock(&won.handing).is_none());
        // Returns at once: nothing is handing any more.
        won.until_handed("k").await;
    }

    #[tokio::test]
    async fn stopping_the_handing_closes_the_round_and_names_the_calls_never_sent() {
        let gate = RoundGate::new(2, None);
        let won = WonTail::won_by(gate.clone());
        let tail = tail_of(2, &[(0, 3)], &gate);
        *lock(&won.handing) = Some(tail.deadline);
        let mut counters = Vec::new();
        let (_, never_sent) = tokio::join!(won.hand(tail, |i, c| counters.push((i, c))), async {
            tokio::task::yield_now().await;
            won.stop_handing(2, "k").await
        });
        assert!(gate.is_closed());
        // Node 0 answered (its call was sent); node 1's call was never handed, and never will be.
        assert_eq!(never_sent.as_slice(), [false, true]);
        assert_eq!(counters, [(0, 3)]);
        assert!(lock(&won.handing).is_none());
        // The call still unanswered is kept for the release to park.
        assert!(won.take().is_some());
    }
}
