//! The grant of a voted round: its fencing token chosen from the yes-answers (lagging
//! counters raised first when fewer than a quorum stand at it), its validity counted from the
//! round's end, and the lock's state made, with the round's unanswered calls kept by the lock
//! (handed to their connections first where they still wait for one).

use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use super::Engine;
use super::round::{Yeses, int_reply};
use super::state::{LockState, SeenAt};
use super::tail::Tail;
use super::vote::{Request, Voted};
use crate::core::clock::{self, Stamp};
use crate::core::timing;
use crate::core::token::{self, FencingToken};
use crate::error::{Error, NodeFailure};
use crate::node::scripts;
use crate::node::{HoldOut, Op};

/// A won round: its token, and the validity counted from its end.
pub(super) struct Won {
    token: FencingToken,
    seen: SeenAt,
    /// Where the validity ends, on the deadline clock.
    deadline: Stamp,
    /// The round's unanswered calls.
    tail: Tail,
}

impl Engine {
    /// The lock of a won round: counted, kept in a state with its token and validity, and its
    /// round's unanswered calls kept (`keep_granted`).
    pub(super) fn granted(
        &self,
        req: Request<'_>,
        value: String,
        won: Won,
        called: Instant,
    ) -> Arc<LockState> {
        self.count_acquire("acquired", called.elapsed(), req.key);
        let state = self.held_state(
            LockState::new(req.keys, value, won.token, won.seen, req.ttl, won.deadline)
                .won_by(won.tail.gate.clone()),
        );
        self.keep_granted(&state, won.tail, req.caller);
        state
    }

    /// The won round's unanswered calls: closed (no call of the round is sent once they are
    /// all handed) and kept by the lock, whose extensions and release read their late answers
    /// (where else its counter stands at the token). Calls to nodes whose connection was still
    /// being made at the grant are first driven by a task until they are handed, or until the
    /// round's deadline (the node timeout): the lock then stands on every node that answers in
    /// time, not only on the quorum that answered first, and a fresh client's lock is not left
    /// on a bare majority. Not to nodes known down (their last call failed): a call
    /// waiting for such a node's new connection is left unsent, as the round did not wait for
    /// it. The lock's extensions wait for that task (`LockState::until_handed`), so on every
    /// node they run after the acquisition; the release stops it (`LockState::stop_handing`):
    /// the calls not yet handed are then never sent, and the release skips their nodes.
    fn keep_granted(&self, state: &Arc<LockState>, tail: Tail, caller: &tracing::Span) {
        let Some(tail) = state.keep_or_start_handing(tail, &self.inner.nodes) else {
            return;
        };
        let state = Arc::clone(state);
        self.inner.tasks.spawn(
            // Ends the handing however the task ends (aborted with its runtime included), and
            // when the release stops it (`LockState::stop_handing`) at the latest.
            async move { state.hand_tail(tail).await }.instrument(caller.clone()),
        );
    }

    /// A voted round's token: the largest counter of its yes-nodes, raised first on enough of
    /// them when fewer than a quorum stand at it; then the grant.
    pub(super) async fn seal(
        &self,
        req: &Request<'_>,
        value: &str,
        voted: Voted,
    ) -> Result<Won, Error> {
        let counters: smallvec::SmallVec<[FencingToken; 8]> = if self.inner.cfg.fencing {
            let yes = voted.round.yes.iter();
            yes.map(|&(_, c)| FencingToken::of_counter(c)).collect()
        } else {
            smallvec::smallvec![FencingToken::new(0); voted.round.yes.len()]
        };
        let Some((token, settled)) = token::fencing_max(&counters, self.inner.nodes.len()) else {
            return Err(self.no_quorum(req.key, &voted.round.tally, voted.round.failures));
        };
        if !settled {
            self.raise_fence(req, value, token, &voted.round.yes, voted.budget_end)
                .await?;
        }
        self.grant(req, voted, token)
    }

    /// The end of a won round: the lock is granted if validity is left, counted from now (the
    /// end of the round, on the deadline clock).
    fn grant(&self, req: &Request<'_>, voted: Voted, token: FencingToken) -> Result<Won, Error> {
        let (key, ttl) = (req.key, req.ttl);
        let now = clock::now();
        let elapsed = now.saturating_duration_since(voted.started);
        let Some(validity) = timing::validity(voted.sent, elapsed, req.drift) else {
            tracing::warn!(key, ?elapsed, ?ttl, "quorum reached but no validity left");
            return Err(Error::ValidityExpired {
                key: key.to_owned(),
                elapsed,
                ttl,
            });
        };
        let round = voted.round;
        tracing::debug!(
            key,
            %token,
            yes = round.tally.yes(),
            no = round.tally.no(),
            failed = round.tally.failed(),
            ?elapsed,
            ?validity,
            "lock acquired"
        );
        // Where our own `INCR` returned the token, the counter stands at it for as long as that
        // connection lives: the release and extensions need not raise it there.
        let at_token = round
            .yes
            .iter()
            .filter(|&&(_, c)| SeenAt::shows(c, token))
            .map(|&(i, _)| i);
        let seen = SeenAt::new(voted.generations, at_token);
        // The deadline is `start + ttl − drift`: counted from the start, elapsed would count
        // twice.
        Ok(Won {
            token,
            seen,
            deadline: now.saturating_add(validity),
            tail: round.rest,
        })
    }

    /// Brings the counters of the yes-nodes below `token` up to it, by `budget_end` at the
    /// latest, so that a quorum stands at the token (only after different majorities won
    /// earlier rounds).
    async fn raise_fence(
        &self,
        req: &Request<'_>,
        value: &str,
        token: FencingToken,
        yes: &Yeses,
        budget_end: Instant,
    ) -> Result<(), Error> {
        let key = req.key;
        let digits = token.to_string();
        let call = Arc::new(scripts::RAISE_FENCE.call(
            &[req.keys.lock().as_bytes(), req.keys.fence().as_bytes()],
            &[value.as_bytes(), digits.as_bytes()],
        ));
        let deadline = (Instant::now() + self.inner.cfg.node_timeout).min(budget_end);
        let at_max = yes
            .iter()
            .filter(|&&(_, c)| FencingToken::of_counter(c) == token)
            .count();
        let raises = yes
            .iter()
            .filter(|&&(_, c)| FencingToken::of_counter(c) < token)
            .map(|&(i, _)| {
                let fut = Arc::clone(&self.inner.nodes[i]).run(
                    Arc::clone(&call),
                    deadline,
                    HoldOut::Respect,
                    Op::Raise,
                );
                async move { (i, fut.await) }
            });
        let mut raised = 0;
        let mut failures = Vec::new();
        for (i, r) in futures::future::join_all(raises).await {
            match r.and_then(int_reply) {
                Ok(1) => raised += 1,
                Ok(_) => {}
                Err(cause) => failures.push(NodeFailure {
                    node: self.inner.nodes[i].name().to_owned(),
                    cause,
                }),
            }
        }
        tracing::debug!(
            key,
            token = token.get(),
            at_max,
            raised,
            "raised fencing counters"
        );
        if token::raised_to_quorum(at_max, raised, self.node_count()) {
            return Ok(());
        }
        tracing::warn!(
            key,
            token = token.get(),
            at_max,
            raised,
            "could not bring a quorum to the fencing token"
        );
        Err(Error::NoQuorum {
            key: key.to_owned(),
            reached: at_max + raised,
            nodes: self.node_count(),
            needed: self.quorum(),
            failures,
        })
    }
}
