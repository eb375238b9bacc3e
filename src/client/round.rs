//! The fan-out round: one call sent to every node at once, answers folded into a verdict as
//! they arrive (the pure rules are [`crate::core::quorum`]), a decision as soon as the outcome
//! is certain, and the calls still unanswered then (the *tail*) kept until they reach their
//! nodes.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use redis::Value;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::Engine;
use super::patience::NodeWait;
use crate::core::clock::Stamp;
use crate::core::quorum::{self, Answer, Refusal, Tally, Verdict};
use crate::error::{NodeError, NodeFailure};
use crate::metrics;
use crate::node::scripts::ScriptCall;
use crate::node::{HoldOut, Node, NotSent, Op, RoundGate};

/// Per-node values of a round, inline (no allocation) up to this many nodes.
const INLINE: usize = 8;

/// The yes-answers of a round: node index, integer reply.
pub(crate) type Yeses = SmallVec<[(usize, i64); INLINE]>;

/// Which calls are over: answered, or stopped unsent by their round's gate ([`NotSent`]).
type Answered = SmallVec<[bool; INLINE]>;

/// A node's answer in a round: its index and its reply, or [`NotSent`] (nothing reached it).
type Reply = (usize, Result<Result<Value, NodeError>, NotSent>);

/// The unanswered calls of a finished round, behind one allocation per round (a call is not
/// boxed on its own: the round's calls are one `FuturesUnordered` of one concrete type).
trait Pending: Stream<Item = Reply> + Send + Unpin {
    fn len(&self) -> usize;
}

impl<F: Future<Output = Reply> + Send> Pending for FuturesUnordered<F> {
    fn len(&self) -> usize {
        FuturesUnordered::len(self)
    }
}

/// A round's outcome: the verdict, the yes-answers (node index, integer reply), the values
/// that refused (`None`: a refusal that does not say which value holds the key) and failures
/// (refusals included, as [`NodeError::HeldByAnother`], so a failed round names them all).
pub(crate) struct Round {
    pub(super) verdict: Verdict,
    pub(super) tally: Tally,
    pub(super) yes: Yeses,
    /// Yes-answers that do not count: their node reaches the same server as another (it set
    /// the value all the same).
    pub(super) revoked: Yeses,
    pub(super) refusals: Vec<Option<Vec<u8>>>,
    pub(super) failures: Vec<NodeFailure>,
    pub(super) rest: Tail,
}

impl Round {
    /// How a refused acquisition reads (see [`quorum::refusal`]).
    pub(super) fn refusal(&self) -> Refusal {
        quorum::refusal_of(
            self.tally.n(),
            &self.refusals,
            self.tally.failed(),
            self.tally.pending(),
        )
    }

    /// The nodes that answered yes (an acquisition: they set its value), counted or not.
    pub(super) fn set_on(&self) -> Vec<usize> {
        self.yes
            .iter()
            .chain(&self.revoked)
            .map(|&(i, _)| i)
            .collect()
    }

    /// Nodes holding the most common foreign value seen, or every refusal when values are
    /// unknown: what `Held` reports.
    pub(super) fn held_by_other(&self) -> usize {
        let (counts, unknown) = quorum::refusal_groups(&self.refusals);
        counts.into_iter().max().unwrap_or(0).max(unknown)
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

impl Engine {
    /// Sends `call` to every node at once and returns as soon as the verdict is certain. A call
    /// unanswered at `deadline` waits on, a node timeout at a time, while its node answers this
    /// client's earlier calls, never past `cap` (`patience.rs`). Unanswered calls are handed back in `rest`. With `closes_at`, no
    /// call of the round is sent (nor re-sent as `EVAL`) from that time on the deadline clock.
    /// What counts as a yes, and whether a held-out node is asked, follow from `op`
    /// ([`round_rule`]). The nodes `skip` marks get no call: each counts as answering `0` (a
    /// release: nothing of ours there).
    pub(super) async fn round(
        &self,
        call: Arc<ScriptCall>,
        deadline: Instant,
        cap: Instant,
        closes_at: Option<Stamp>,
        op: Op,
        skip: &[bool],
    ) -> Round {
        let (hold_out, yes) = round_rule(op);
        self.schedule_repairs();
        let nodes = &self.inner.nodes;
        let n = nodes.len();
        let start = Instant::now();
        let gate = RoundGate::new(n, closes_at);
        let skipped = |i: usize| skip.get(i).copied().unwrap_or(false);
        let mut rest: FuturesUnordered<_> = nodes
            .iter()
            .enumerate()
            .filter(|&(i, _)| !skipped(i))
            .map(|(i, node)| {
                // A combinator, not `async move { (i, fut.await) }`: an async block holds the
                // captured future and the awaited one in separate slots, twice its size, and a
                // round moves each call's future several times (`FuturesUnordered::push`).
                Arc::clone(node)
                    .call(Arc::clone(&call), hold_out, op, (gate.clone(), i))
                    .map(move |reply| (i, reply))
            })
            .collect();
        let mut answers = Answers::new(n);
        for i in (0..n).filter(|&i| skipped(i)) {
            answers.record(i, Ok(Value::Int(0)), yes, nodes[i].name());
        }
        // An acquisition refused by a quorum also waits until it is known whether that was
        // contention (see `quorum::refusal`); nothing else does.
        let classify = op == Op::Acquire;
        let mut patience = NodeWait::new(nodes, self.inner.cfg.node_timeout, start, deadline, cap);
        let decided = loop {
            let step = tokio::time::timeout_at(patience.until(), async {
                while let Some((i, reply)) = rest.next().await {
                    tracing::trace!(node = i, op = op.as_str(), since = ?start.elapsed(), "answer");
                    answers.take(i, reply, yes, nodes[i].name());
                    if hold_out == HoldOut::Respect {
                        answers.revoke_twins(nodes);
                    }
                    // An acquisition does not wait for nodes already known down (their last
                    // call failed): giving up a round is always safe (it is undone), and a hung
                    // node would otherwise hold every undecided round to its deadline.
                    let down = if classify {
                        answers.pending_down(nodes)
                    } else {
                        0
                    };
                    if let Some(verdict) = answers.decided(classify, down)
                        && !(verdict == Verdict::Quorum
                            && hold_out == HoldOut::Respect
                            && answers.identities_unsettled(nodes))
                        && !(verdict == Verdict::Quorum
                            && op == Op::Release
                            && !answers.release_told())
                    {
                        return verdict;
                    }
                }
                answers.tally.final_verdict()
            })
            .await;
            match step {
                Ok(verdict) => break Ok(verdict),
                Err(elapsed) => {
                    let answered = answers.answered.clone();
                    if !patience.renew(nodes, |i| !answered[i]).await {
                        break Err(elapsed);
                    }
                }
            }
        };
        let timed_out = decided.is_err();
        tracing::trace!(op = op.as_str(), took = ?start.elapsed(), timed_out, "round decided");
        // Without a verdict by the deadline, whoever has not answered failed: one timer for
        // the round.
        let verdict = decided.unwrap_or_else(|_| {
            answers.time_out(
                nodes,
                op,
                &patience,
                patience.until().saturating_duration_since(start),
            )
        });
        if !timed_out {
            answers.abandon(nodes, op, verdict);
        }
        // A connection made during the round may have revealed a restart.
        self.schedule_repairs();
        let calls = (!rest.is_empty()).then(|| Box::new(rest) as Box<dyn Pending>);
        let deadline = patience.until();
        let patience = (op == Op::Release && calls.is_some()).then(|| Box::new(patience));
        answers.into_round(verdict, calls, gate, deadline, patience)
    }
}

/// The answers of a round so far.
struct Answers {
    tally: Tally,
    /// The yes-answers: node index, integer reply.
    yes: Yeses,
    /// Yes-answers revoked: their node reaches the same server as another.
    revoked: Yeses,
    refusals: Vec<Option<Vec<u8>>>,
    failures: Vec<NodeFailure>,
    answered: Answered,
}

impl Answers {
    /// The round these answers decided with `verdict`; `calls`, the calls still unanswered,
    /// go to its tail.
    fn into_round(
        self,
        verdict: Verdict,
        calls: Option<Box<dyn Pending>>,
        gate: RoundGate,
        deadline: Instant,
        patience: Option<Box<NodeWait>>,
    ) -> Round {
        Round {
            verdict,
            tally: self.tally,
            yes: self.yes,
            revoked: self.revoked,
            refusals: self.refusals,
            failures: self.failures,
            rest: Tail {
                calls,
                answered: self.answered,
                gate,
                deadline,
                patience,
            },
        }
    }

    fn new(n: usize) -> Self {
        Answers {
            tally: Tally::new(n),
            yes: Yeses::new(),
            revoked: Yeses::new(),
            refusals: Vec::new(),
            failures: Vec::new(),
            answered: Answered::from_elem(false, n),
        }
    }

    /// Records node `i`'s reply (named `name` in failures).
    fn record(
        &mut self,
        i: usize,
        reply: Result<Value, NodeError>,
        yes: fn(i64) -> bool,
        name: &str,
    ) {
        self.answered[i] = true;
        // The acquire script refuses with the value that holds the key.
        let reply = match reply {
            Ok(Value::BulkString(holder)) => {
                self.refusals.push(Some(holder));
                Ok(None)
            }
            other => other.and_then(int_reply).map(Some),
        };
        match reply {
            Ok(Some(v)) if yes(v) => {
                self.tally.record(Answer::Yes);
                self.yes.push((i, v));
            }
            Ok(refused) => {
                if refused.is_some() {
                    self.refusals.push(None);
                }
                self.tally.record(Answer::No);
                self.failure(name, NodeError::HeldByAnother);
            }
            Err(cause) => {
                self.tally.record(Answer::Failed);
                self.failure(name, cause);
            }
        }
    }

    /// Takes node `i`'s call as it ended: its reply recorded, or [`not_sent`](Self::not_sent).
    fn take(
        &mut self,
        i: usize,
        reply: Result<Result<Value, NodeError>, NotSent>,
        yes: fn(i64) -> bool,
        name: &str,
    ) {
        match reply {
            Ok(reply) => self.record(i, reply, yes, name),
            Err(NotSent) => self.not_sent(i),
        }
    }

    /// Records that node `i`'s call was stopped unsent by the round's gate (closed by itself,
    /// at its time, before the verdict): no answer, so never a yes, and no failure of the node
    /// (nothing reached it).
    fn not_sent(&mut self, i: usize) {
        self.answered[i] = true;
        self.tally.record(Answer::Failed);
    }

    /// Turns the yes of every node that reaches the same server as another into a failure
    /// naming both: one server is one vote at most, and a pair counts for nothing.
    fn revoke_twins(&mut self, nodes: &[Arc<Node>]) {
        let mut k = 0;
        while k < self.yes.len() {
            let (i, v) = self.yes[k];
            if let Some(cause) = nodes[i].same_server() {
                self.yes.remove(k);
                self.revoked.push((i, v));
                self.tally.revoke_yes();
                self.failure(nodes[i].name(), cause);
            } else {
                k += 1;
            }
        }
    }

    /// Whether the yes-answers might not make a quorum once the nodes still unanswered whose
    /// server is not known yet (never connected, not known down) have connected: each may turn
    /// out to reach the server of a yes, which then counts for nothing.
    fn identities_unsettled(&self, nodes: &[Arc<Node>]) -> bool {
        let unknown = nodes
            .iter()
            .zip(&self.answered)
            .filter(|&(node, &answered)| !answered && !node.identity_known() && !node.is_down())
            .count();
        self.tally.yes().saturating_sub(unknown) < quorum::quorum(self.tally.n())
    }

    /// Whether a release's answers tell if our value stood on a quorum (`quorum::release_told`):
    /// its script answers 1 where it deleted our value, 0 where the value was gone.
    fn release_told(&self) -> bool {
        let deleted = self.yes.iter().filter(|&&(_, v)| v == 1).count();
        let absent = self.yes.iter().filter(|&&(_, v)| v == 0).count();
        quorum::release_told(self.tally.n(), deleted, absent)
    }

    fn failure(&mut self, node: &str, cause: NodeError) {
        self.failures.push(NodeFailure {
            node: node.to_owned(),
            cause,
        });
    }

    /// The verdict, once certain when `down` of the pending nodes count as failed (nodes known
    /// down, not waited for); with `classify`, a refusal also waits until it is known whether
    /// it was contention.
    fn decided(&self, classify: bool, down: usize) -> Option<Verdict> {
        let mut t = self.tally;
        for _ in 0..down.min(t.pending()) {
            t.record(Answer::Failed);
        }
        let verdict = t.verdict()?;
        let undecided = classify
            && verdict == Verdict::Refused
            && quorum::refusal_of(t.n(), &self.refusals, t.failed(), t.pending())
                == Refusal::Undecided;
        (!undecided).then_some(verdict)
    }

    /// How many of the nodes that have not answered are known down.
    fn pending_down(&self, nodes: &[Arc<Node>]) -> usize {
        nodes
            .iter()
            .zip(&self.answered)
            .filter(|&(node, &answered)| !answered && node.is_down())
            .count()
    }

    /// The round's deadline passed undecided: every node that has not answered failed, for
    /// its silence or for the client's backlog (`NodeWait::failure`).
    fn time_out(
        &mut self,
        nodes: &[Arc<Node>],
        op: Op,
        patience: &NodeWait,
        waited: Duration,
    ) -> Verdict {
        for (i, node) in nodes.iter().enumerate() {
            if !self.answered[i] {
                let cause = patience.failure(nodes, i, waited);
                node.timed_out(op, &cause);
                self.tally.record(Answer::Failed);
                self.failure(node.name(), cause);
            }
        }
        self.tally.final_verdict()
    }

    /// The nodes still pending when the outcome was certain.
    fn abandon(&mut self, nodes: &[Arc<Node>], op: Op, verdict: Verdict) {
        for (i, node) in nodes.iter().enumerate() {
            if !self.answered[i] {
                // Invisible in latency figures otherwise (a node always slower than the quorum).
                metrics::node_abandoned(node.name(), op.as_str());
                // A failed round names every node that counts toward no quorum, not just those
                // that had answered: a user who just (re)started a cluster sees them all.
                if verdict != Verdict::Quorum {
                    if let Some(cause) = node.held_out() {
                        self.failure(node.name(), cause);
                    } else if let Some(cause) = node.down_cause() {
                        // Not waited for (known down): it failed as far as this round goes.
                        self.tally.record(Answer::Failed);
                        self.failure(node.name(), cause);
                    }
                }
            }
        }
    }
}

/// A yes for acquire and extend: a counter (>= 1), `1` extended or `2` re-set.
pub(crate) fn positive(v: i64) -> bool {
    v > 0
}

/// How a round of `op` reads its nodes: an acquisition and an extension count only a positive
/// reply as a yes and ask no node the restart guard holds out; a release asks every node (our
/// value must go wherever it may stand) and counts deleted (1) and absent (0) alike, only
/// another owner's value (-1) refusing.
fn round_rule(op: Op) -> (HoldOut, fn(i64) -> bool) {
    match op {
        Op::Release => (HoldOut::Ignore, |v| v >= 0),
        _ => (HoldOut::Respect, positive),
    }
}

/// A script's integer reply; a plain `SET NX` answers `OK` (yes) or nil (held).
pub(crate) fn int_reply(v: Value) -> Result<i64, NodeError> {
    match v {
        Value::Int(i) => Ok(i),
        Value::Okay => Ok(1),
        Value::Nil => Ok(0),
        other => Err(NodeError::unexpected("an integer", &other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_not_sent_is_no_answer_and_blames_no_node() {
        let mut answers = Answers::new(3);
        answers.not_sent(1);
        assert!(answers.answered[1]);
        assert_eq!((answers.tally.yes(), answers.tally.failed()), (0, 1));
        assert!(answers.failures.is_empty(), "{:?}", answers.failures);
    }
}
