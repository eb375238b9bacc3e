//! One attempt round's vote: the acquire call (the fenced script, its pipelined form, or a
//! plain `SET NX PX`) on every node, and what its verdict means: the value stood on a quorum
//! ([`Voted`]: the token is chosen next, `grant.rs`), or it did not ([`NotWon`]: held by
//! another owner, contenders split the nodes, or too few nodes answered), with what the undo
//! of the round needs to know.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Engine;
use super::round::Round;
use super::state::Seen;
use super::tail::Tail;
use crate::core::clock::{self, Stamp};
use crate::core::keys::LockKeys;
use crate::core::quorum::{self, Acquisition, Verdict};
use crate::core::timing;
use crate::error::{Error, FailureList, NodeError, NodeFailure};
use crate::metrics;
use crate::node::Op;
use crate::node::commands;
use crate::node::scripts::ScriptCall;

/// What one acquisition asks for: the same in all its rounds.
pub(super) struct Request<'a> {
    /// The user key.
    pub(super) key: &'a str,
    /// Every key of the lock, built once (one allocation) for all its rounds and its state.
    pub(super) keys: LockKeys,
    pub(super) ttl: Duration,
    /// The drift allowance of `ttl`.
    pub(super) drift: Duration,
    /// The span current when the acquisition was called: its background tasks (undo, handing)
    /// run in it, so that the acquisition's own span ends when the call returns.
    pub(super) caller: &'a tracing::Span,
}

/// A round whose value stood on a quorum: what its token is chosen from.
pub(super) struct Voted {
    pub(super) round: Round,
    /// When the round started, on the deadline clock.
    pub(super) started: Stamp,
    /// The ttl the nodes were told (whole milliseconds).
    pub(super) sent: Duration,
    /// The end of the round's validity budget: a raise must land before it.
    pub(super) budget_end: Instant,
    /// The connection generations taken before the round's first call, with fencing on.
    pub(super) generations: Seen,
}

/// A round that did not win: its error, and what its undo needs to know.
pub(super) struct NotWon {
    pub(super) err: Error,
    /// Refused although no value can stand on a quorum (contenders split the nodes).
    pub(super) contended: bool,
    /// The nodes that refused because another value holds the key, or were sent nothing
    /// (silent): the undo skips them (ours is not there).
    pub(super) held_elsewhere: Vec<bool>,
    /// The nodes that set our value (answered yes).
    pub(super) set_on: Vec<usize>,
    /// A refused round's unanswered calls: the undo learns their answers first.
    pub(super) tail: Option<Tail>,
}

impl Engine {
    /// One attempt round's vote: the acquire script (or its pipelined form) on every node.
    /// `Ok` when the value stood on a quorum; the token is then chosen by [`seal`](Self::seal).
    pub(super) async fn attempt(&self, req: &Request<'_>, value: &str) -> Result<Voted, NotWon> {
        metrics::attempt(self.metrics_lock(req.key));
        let start = Instant::now();
        let started = clock::now();
        // The nodes are told whole milliseconds: the validity counts only what they were told.
        let (ttl_ms, sent) = timing::sent_ttl(req.ttl);
        let budget_end = start + timing::budget(sent, req.drift);
        let round_time = timing::acquire_round(self.inner.cfg.node_timeout, sent, req.drift);
        let deadline = start + round_time;
        let call = self.acquire_call(&req.keys, value, ttl_ms);
        // Before any call: a node whose yes carries the token was answered on this connection
        // generation or a later one (`Node::process_generation`).
        let generations: Seen = if self.inner.cfg.fencing {
            self.inner
                .nodes
                .iter()
                .map(|n| n.process_generation())
                .collect()
        } else {
            Seen::new()
        };
        // The round's gate closes by itself at its deadline: none of its calls is sent after,
        // whichever task drives them (the round, the handing task, an undo).
        let round = self
            .round(
                Arc::new(call),
                deadline,
                // Calls queued behind this client's earlier ones wait on while their node
                // answers those, as long as a quorum could still leave validity.
                budget_end,
                Some(started.saturating_add(round_time)),
                Op::Acquire,
                &[],
            )
            .await;
        match quorum::acquisition(round.verdict, || round.refusal()) {
            Acquisition::Won => {}
            Acquisition::Held { contended } => return Err(self.refused(req.key, round, contended)),
            Acquisition::Unreachable => {
                let held_elsewhere = self.held_elsewhere(&round);
                let set_on = round.set_on();
                let err = self.unreachable(req.key, round);
                return Err(NotWon {
                    err,
                    contended: false,
                    held_elsewhere,
                    set_on,
                    tail: None,
                });
            }
        }
        if self.inner.outage.swap(false, Ordering::Relaxed) {
            tracing::info!(key = req.key, "a quorum of nodes answers again");
        }
        Ok(Voted {
            round,
            started,
            sent,
            budget_end,
            generations,
        })
    }

    /// The nodes of a lost round where our value cannot be: those that refused because
    /// another value holds the key, and those sent nothing because they were silent (none
    /// when the round won).
    fn held_elsewhere(&self, round: &Round) -> Vec<bool> {
        let spared = |f: &&NodeFailure| {
            matches!(f.cause, NodeError::HeldByAnother | NodeError::Silent { .. })
        };
        if round.verdict == Verdict::Quorum || !round.failures.iter().any(|f| spared(&f)) {
            return Vec::new();
        }
        let names = self.inner.nodes.iter().map(|n| n.name());
        let spare = |name| round.failures.iter().filter(spared).any(|f| f.node == name);
        names.map(spare).collect()
    }

    /// A round refused by a holder (or by contenders that split the nodes: `contended`).
    fn refused(&self, key: &str, round: Round, contended: bool) -> NotWon {
        tracing::debug!(
            key,
            yes = round.tally.yes(),
            refused = round.tally.no(),
            held = round.held_by_other(),
            failed = round.tally.failed(),
            contended,
            "lock held by another owner"
        );
        NotWon {
            err: self.held(key, round.held_by_other()),
            contended,
            held_elsewhere: self.held_elsewhere(&round),
            set_on: round.set_on(),
            // Nodes that had not answered: the undo learns their answers first.
            tail: (!contended).then_some(round.rest),
        }
    }

    /// The error of a round that could not reach a quorum for lack of answers: warned once per
    /// outage (the first such round), then logged at debug level until a quorum answers again.
    fn unreachable(&self, key: &str, round: Round) -> Error {
        let failures = FailureList(&round.failures);
        let t = &round.tally;
        if self.inner.outage.swap(true, Ordering::Relaxed) {
            tracing::debug!(key, yes = t.yes(), no = t.no(), failed = t.failed(), %failures, "too few nodes reachable to acquire");
        } else {
            tracing::warn!(key, yes = t.yes(), no = t.no(), failed = t.failed(), %failures, "too few nodes reachable to acquire; further failed rounds are logged at debug level until a quorum answers again");
        }
        self.no_quorum(key, &round.tally, round.failures)
    }

    /// The acquire call: with fencing on, the acquire-and-fence script (for nodes that run it:
    /// Redis 6, Cluster members) and/or its pipelined form (`SET NX PX GET` + `INCR`, for the
    /// others; `node/acquire_form.rs`), each built only if a node takes it; a plain `SET NX PX` with
    /// fencing off.
    ///
    /// A key this client has waited for is likely held: every node gets the script, which
    /// raises the counter only where it sets the key. The pipelined form raises the counter on
    /// a refusal too (its `INCR` does not depend on the `SET`), so each refused round of a
    /// waiter would raise the token that the next holder gets.
    fn acquire_call(&self, keys: &LockKeys, value: &str, ttl_ms: u64) -> ScriptCall {
        let (lock_key, fence_key) = (keys.lock(), keys.fence());
        if !self.inner.cfg.fencing {
            return ScriptCall::plain(commands::set_nx_px(lock_key, value, ttl_ms));
        }
        let nodes = &self.inner.nodes;
        let pipelined =
            !self.inner.waiting.has_waited(lock_key) && nodes.iter().any(|n| n.may_pipeline());
        ScriptCall::fenced_acquire(lock_key, fence_key, value, ttl_ms, pipelined)
    }
}
