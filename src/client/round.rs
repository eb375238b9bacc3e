//! The fan-out round: one call sent to every node at once, answers folded into a verdict as
//! they arrive (the pure rules are [`crate::core::quorum`]), a decision as soon as the outcome
//! is certain, and the calls still unanswered then (the *tail*) kept until they reach their
//! nodes.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use redis::Value;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::Engine;
use super::patience::NodeWait;
use super::tail::{Answered, INLINE, Pending, Tail};
use crate::core::clock::Stamp;
use crate::core::quorum::{self, Answer, Refusal, Tally, Verdict};
use crate::error::{NodeError, NodeFailure};
use crate::metrics;
use crate::node::scripts::ScriptCall;
use crate::node::{HoldOut, Node, NotSent, Op, RoundGate};

/// The yes-answers of a round: node index, integer reply.
pub(crate) type Yeses = SmallVec<[(usize, i64); INLINE]>;

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
            rest: Tail::new(calls, self.answered, gate, deadline, patience),
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
