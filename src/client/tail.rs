//! The late answers of a round: its calls still unanswered at the verdict (the *tail*), kept
//! until they reach their nodes (see `docs/design.md`, "Late answers"). A won acquisition's
//! tail is handed to its connections and kept by its lock (`LockState`), which reads its late
//! counters; every other tail is settled here: collected without a waker, parked on the engine
//! (no task, no timer) when keeping its futures is enough, else driven by a task of its own. A
//! release's calls given up are counted for the next `flush`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

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

/// A node's answer in a round: its index and its reply, or [`NotSent`] (nothing reached it).
pub(super) type Reply = (usize, Result<Result<Value, NodeError>, NotSent>);

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
    pub(super) fn can_park(&self) -> bool {
        self.gate.is_closed() || self.all_handed()
    }

    /// Whether every call neither answered nor handed goes to a node known down (its last call
    /// failed), whose connection is being made again: nothing waits for such a node (a round
    /// does not, `Answers::pending_down`), so the lock need not stand there either, and the
    /// round may be closed at once instead of handed (its release would otherwise wait for the
    /// handing, up to the node timeout, on every lock while such a node is hung).
    pub(super) fn unhanded_only_to_down(&self, nodes: &[Arc<Node>]) -> bool {
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
    /// for nothing: the round is over and it reads the tail only here). True once every call
    /// has answered: nothing is left that must be kept.
    pub(super) fn collect(&mut self) -> bool {
        self.collect_granted(|_, _| {})
    }

    /// [`collect`](Self::collect), reporting each late integer answer (node, counter) of a won
    /// acquisition's round to `on_counter` (the lock it granted: `LockState::late_yes`, where
    /// else its counter stands at the token).
    pub(super) fn collect_granted(&mut self, mut on_counter: impl FnMut(usize, i64)) -> bool {
        if let Some(calls) = &mut self.calls {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            while let std::task::Poll::Ready(Some((i, reply))) = calls.poll_next_unpin(&mut cx) {
                self.answered[i] = true;
                if let Ok(Ok(Value::Int(counter))) = &reply {
                    on_counter(i, *counter);
                }
            }
        }
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

    /// Drives a won acquisition's calls (its round still open) until each has been handed to
    /// its connection, or answered, or the round's deadline has passed, reporting their
    /// integer answers (node, counter) to `on_counter` (the lock: `LockState::late_yes`). A call to a node whose connection was
    /// still being made at the verdict is sent once it is up, instead of giving up: the lock
    /// then stands on every node that answers within the node timeout, not only on the quorum
    /// that answered first. When this returns, every call handed was handed in one
    /// of its polls, so it is queued on its connection before anything sent afterwards.
    pub(super) async fn hand(&mut self, mut on_counter: impl FnMut(usize, i64)) {
        let deadline = self.deadline;
        let _ = tokio::time::timeout_at(
            deadline,
            std::future::poll_fn(|cx| {
                // Never handed after the deadline, even on a first poll that comes late (a
                // runtime too busy to run this task meanwhile).
                if Instant::now() >= deadline {
                    return std::task::Poll::Ready(());
                }
                if let Some(calls) = &mut self.calls {
                    loop {
                        match calls.poll_next_unpin(cx) {
                            std::task::Poll::Ready(Some((i, reply))) => {
                                self.answered[i] = true;
                                if let Ok(Ok(Value::Int(counter))) = &reply {
                                    on_counter(i, *counter);
                                }
                            }
                            std::task::Poll::Ready(None) => return std::task::Poll::Ready(()),
                            std::task::Poll::Pending => break,
                        }
                    }
                }
                if self.all_handed() {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            }),
        )
        .await;
    }

    /// Drives the unanswered calls to their answer, bounded by the round's deadline, and
    /// returns the answers that came (node index, reply); a call not sent has none.
    pub(super) async fn answers(self) -> Vec<(usize, Result<Value, NodeError>)> {
        let mut got = Vec::new();
        let Some(mut calls) = self.calls else {
            return got;
        };
        let _ = tokio::time::timeout_at(self.deadline, async {
            while let Some((i, reply)) = calls.next().await {
                if let Ok(reply) = reply {
                    got.push((i, reply));
                }
            }
        })
        .await;
        got
    }

    /// Drives the unanswered calls to their answer, bounded by the round's deadline (a
    /// release's, renewed while its nodes work through this client's earlier calls); not those
    /// of a closed round still waiting for their connection (they will never be sent). A
    /// release's calls given up are counted as undelivered (`Redlock::flush`).
    pub(super) async fn drive(mut self, client: Engine) {
        let nodes = &client.inner.nodes;
        loop {
            let deadline = self.deadline;
            let done = tokio::time::timeout_at(
                deadline,
                std::future::poll_fn(|cx| {
                    let Some(calls) = &mut self.calls else {
                        return std::task::Poll::Ready(());
                    };
                    loop {
                        match calls.poll_next_unpin(cx) {
                            std::task::Poll::Ready(Some((i, _))) => self.answered[i] = true,
                            std::task::Poll::Ready(None) => return std::task::Poll::Ready(()),
                            std::task::Poll::Pending => break,
                        }
                    }
                    if self.only_unsent_left() {
                        std::task::Poll::Ready(())
                    } else {
                        std::task::Poll::Pending
                    }
                }),
            )
            .await
            .is_ok();
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
    /// redis-rs to write them, so they are parked (no task, no timer). A parked tail is dropped
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
        if tail.collect() {
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
                if !front.collect()
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
