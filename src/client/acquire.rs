//! Acquisition: attempt rounds with retries, contention resolution (a split vote is undone and
//! re-tried), the fencing token chosen from the yes-answers (and lagging counters raised), and
//! the undo of a failed or cancelled attempt. Waiting between rounds is a [`Waiter`]'s
//! (`waiter.rs`). The public entry points that wrap the result in a guard are in
//! `crate::lock::acquire`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, field::Empty};

use super::Engine;
use super::round::{Round, Yeses, int_reply};
use super::state::{Handing, LockState, Seen, SeenAt};
use super::tail::Tail;
use super::undo::UndoRelease;
use super::waiter::Waiter;
use crate::core::clock::{self, Stamp};
use crate::core::keys::LockKeys;
use crate::core::quorum::{self, Acquisition, Verdict};
use crate::core::timing;
use crate::core::token::{self, FencingToken};
use crate::core::value::new_value_of;
use crate::error::{Error, FailureList, NodeError, NodeFailure};
use crate::metrics;
use crate::node::commands;
use crate::node::scripts::{self, ScriptCall};
use crate::node::{HoldOut, Op};

/// How many extra rounds an acquisition makes, beyond its retries, to resolve contention:
/// rounds refused although no value stood on a quorum (contenders that started together split
/// the nodes). Each undoes its partial acquisition first, then pauses at random.
const CONTENTION_ROUNDS: u32 = 6;

/// How long an acquisition keeps trying: it gives up once it has made `rounds` attempt rounds
/// *and* the next one would start more than `wait` after the call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    pub(crate) rounds: u32,
    pub(crate) wait: Duration,
}

/// What one acquisition asks for: the same in all its rounds.
struct Request<'a> {
    /// The user key.
    key: &'a str,
    /// Every key of the lock, built once (one allocation) for all its rounds and its state.
    keys: LockKeys,
    ttl: Duration,
    /// The drift allowance of `ttl`.
    drift: Duration,
    /// The span current when the acquisition was called: its background tasks (undo, handing)
    /// run in it, so that the acquisition's own span ends when the call returns.
    caller: &'a tracing::Span,
}

/// How far an acquisition is along its [`Patience`].
struct Tries {
    patience: Patience,
    called: Instant,
    /// When a wait is over (`called + patience.wait`, saturating).
    give_up_at: Instant,
    /// Attempt rounds made, those that resolved contention left out.
    rounds: u32,
    /// Rounds made to resolve contention.
    contention: u32,
    /// The error of the last round that failed.
    last_err: Option<Error>,
}

impl Tries {
    fn new(patience: Patience) -> Self {
        let called = Instant::now();
        Tries {
            patience,
            called,
            // Saturating: `acquire_timeout(.., Duration::MAX)` waits "for ever" (safety s12).
            give_up_at: clock::tokio_after(called, patience.wait),
            rounds: 0,
            contention: 0,
            last_err: None,
        }
    }

    /// Whether the acquisition waits between its rounds (`acquire_timeout`).
    fn waits(&self) -> bool {
        !self.patience.wait.is_zero()
    }

    /// Whether the rounds the patience promises have all been made.
    fn made_all(&self) -> bool {
        self.rounds >= self.patience.rounds
    }

    /// A split vote: one more round to resolve it, numbered, unless those are used up (the
    /// failed round then counts as a retry).
    fn contend(&mut self) -> Option<u32> {
        if self.contention >= CONTENTION_ROUNDS {
            return None;
        }
        self.contention += 1;
        self.rounds -= 1;
        Some(self.contention)
    }

    /// Whether to give up after a round failed with `err`, with `backoff` as the next pause.
    fn give_up(&self, err: &Error, backoff: Duration) -> bool {
        !err.is_retryable()
            || (self.made_all()
                && if self.waits() {
                    Instant::now() >= self.give_up_at
                } else {
                    self.called.elapsed().saturating_add(backoff) > self.patience.wait
                })
    }

    /// When the next round starts after a pause until `at`: the last rounds of a wait start
    /// before it is over.
    fn next_round_at(&self, at: Instant) -> Instant {
        if self.waits() && self.made_all() {
            at.min(self.give_up_at)
        } else {
            at
        }
    }
}

/// A round whose value stood on a quorum: what its token is chosen from.
struct Voted {
    round: Round,
    /// When the round started, on the deadline clock.
    started: Stamp,
    /// The ttl the nodes were told (whole milliseconds).
    sent: Duration,
    /// The end of the round's validity budget: a raise must land before it.
    budget_end: Instant,
    /// The connection generations taken before the round's first call, with fencing on.
    generations: Seen,
}

/// A round that did not win: its error, and what its undo needs to know.
struct NotWon {
    err: Error,
    /// Refused although no value can stand on a quorum (contenders split the nodes).
    contended: bool,
    /// The nodes that refused because another value holds the key: the undo skips them (ours
    /// is not there).
    held_elsewhere: Vec<bool>,
    /// The nodes that set our value (answered yes).
    set_on: Vec<usize>,
    /// A refused round's unanswered calls: the undo learns their answers first.
    tail: Option<Tail>,
}

/// A won round: its token, and the validity counted from its end.
struct Won {
    token: FencingToken,
    seen: SeenAt,
    /// Where the validity ends, on the deadline clock.
    deadline: Stamp,
    /// The round's unanswered calls.
    tail: Tail,
}

/// How one attempt round ended.
enum RoundEnd {
    Won(Won),
    /// A split vote, undone: the next round follows after a random pause.
    Undone,
    Failed(Error),
}

impl Engine {
    /// Acquires `key` with this patience: the engine behind the public `try_acquire`,
    /// `acquire` and `acquire_timeout` (`crate::lock::acquire`), which wrap the state in a guard.
    /// Between rounds it pauses, or waits for a release, as its [`Waiter`] decides.
    ///
    /// In a `quorumlock.acquire` span; its background tasks (undo, handing) run in the caller's
    /// span, so that the acquisition's span ends when the call returns (`docs/design.md`).
    pub(crate) async fn acquire_held(
        &self,
        key: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<Arc<LockState>, Error> {
        let caller = tracing::Span::current();
        let span = tracing::info_span!(
            "quorumlock.acquire",
            key,
            ttl_ms = super::millis(ttl),
            rounds = Empty,
            outcome = Empty,
            token = Empty,
        );
        let outcome = super::SpanOutcome::new(&span);
        let result = async {
            let drift = self.check(key, ttl)?;
            let keys = self.keys().lock_keys(key);
            let req = Request {
                key,
                keys,
                ttl,
                drift,
                caller: &caller,
            };
            self.acquire_rounds(req, patience, &span).await
        }
        .instrument(span.clone())
        .await;
        if let Ok(state) = &result {
            span.record("token", state.token().get());
        }
        outcome.finish(&result, "acquired");
        result
    }

    /// The rounds of [`acquire_held`](Self::acquire_held), counted on its `span`.
    async fn acquire_rounds(
        &self,
        req: Request<'_>,
        patience: Patience,
        span: &tracing::Span,
    ) -> Result<Arc<LockState>, Error> {
        self.inner.max_ttl.observe(req.ttl);
        let mut tries = Tries::new(patience);
        let mut waiter = Waiter::new(self, &req.keys, tries.waits(), tries.give_up_at).await;
        loop {
            if waiter.turn().await
                && tries.made_all()
                && let Some(err) = tries.last_err.take()
            {
                self.count_acquire(super::outcome_label(&err), tries.called.elapsed(), req.key);
                return Err(err);
            }
            tries.rounds += 1;
            // Every attempt round, those resolving contention included.
            span.record("rounds", tries.rounds + tries.contention);
            let epoch = waiter.start_round();
            let value = new_value_of(&self.inner.cfg.owner_suffix);
            tracing::trace!(key = req.key, round = tries.rounds, epoch, "attempt round");
            let err = match self.round_of(&req, &value, &mut tries, &waiter).await {
                RoundEnd::Won(won) => {
                    waiter.won(&value);
                    return Ok(self.granted(req, value, won, tries.called));
                }
                RoundEnd::Undone => continue,
                RoundEnd::Failed(err) => err,
            };
            self.retry_or_give_up(err, &mut tries, &mut waiter).await?;
        }
    }

    /// One attempt round with its undo armed before the first await: a round that fails or is
    /// cancelled is released everywhere. A split vote, and a failed round that another
    /// follows, is first released, awaited, on the nodes that set its value
    /// (`UndoRelease::release_set`; the rest of the undo in the background): the pause may
    /// read the holder's key and the next round may follow at once (a notice), and neither
    /// may meet this round's value.
    /// A retry refused by it read as held by another owner, the undo announced nothing, and the
    /// waiter slept until its timer.
    async fn round_of(
        &self,
        req: &Request<'_>,
        value: &str,
        tries: &mut Tries,
        waiter: &Waiter<'_>,
    ) -> RoundEnd {
        let mut undo = UndoRelease::arm(self, &req.keys, value, req.ttl, req.caller);
        let round_start = Instant::now();
        let voted = match self.attempt(req, value).await {
            Ok(voted) => voted,
            Err(lost) => {
                undo.skip = lost.held_elsewhere;
                undo.set_on = lost.set_on;
                undo.tail = lost.tail;
                if lost.contended
                    && let Some(contention_round) = tries.contend()
                {
                    let round_trip = round_start.elapsed();
                    // Awaited where our value was set; the nodes that failed or had not
                    // answered (a hung one among them) get the rest of the undo in the
                    // background, as after any failed round (lock t27).
                    undo.release_set().await;
                    drop(undo);
                    self.split_pause(req.key, round_trip, contention_round, waiter.is_queued())
                        .await;
                    return RoundEnd::Undone;
                }
                // Another round follows: our value goes first where it was set (the rest of
                // the undo, to nodes that failed or had not answered, in the background).
                if !tries.give_up(&lost.err, waiter.backoff()) {
                    undo.release_set().await;
                }
                return RoundEnd::Failed(lost.err);
            }
        };
        // The value stood on a quorum: the round won, whatever follows (the undo announces).
        undo.stood = true;
        match self.seal(req, value, voted).await {
            Ok(won) => {
                undo.disarm();
                RoundEnd::Won(won)
            }
            Err(err) => RoundEnd::Failed(err),
        }
    }

    /// After a failed round: gives up (its error), or pauses as the waiter decides until the
    /// next round.
    async fn retry_or_give_up(
        &self,
        err: Error,
        tries: &mut Tries,
        waiter: &mut Waiter<'_>,
    ) -> Result<(), Error> {
        let backoff = waiter.backoff();
        if tries.give_up(&err, backoff) {
            self.count_acquire(
                super::outcome_label(&err),
                tries.called.elapsed(),
                waiter.key(),
            );
            return Err(err);
        }
        let held = err.is_held();
        let delay = waiter.delay(held, backoff).await;
        let now = Instant::now();
        tracing::debug!(key = waiter.key(), round = tries.rounds, ?delay, error = %err, "retrying acquisition");
        tries.last_err = Some(err);
        waiter.pause(held, tries.next_round_at(now + delay)).await;
        Ok(())
    }

    /// The lock of a won round: counted, kept in a state with its token and validity, and its
    /// round's unanswered calls kept (`keep_granted`).
    fn granted(
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
    fn keep_granted(&self, state: &Arc<LockState>, mut tail: Tail, caller: &tracing::Span) {
        // Closing leaves unsent the calls not yet handed: here only calls to nodes known down,
        // on which the lock then does not stand (as if they had not answered in time).
        if tail.can_park() || tail.unhanded_only_to_down(&self.inner.nodes) {
            tail.gate.close();
            state.keep_tail(tail);
            return;
        }
        state.start_handing(tail.deadline);
        let state = Arc::clone(state);
        self.inner.tasks.spawn(
            async move {
                // Ends the handing however the task ends (aborted with its runtime included).
                let _handing = Handing(Arc::clone(&state));
                // Until the release stops it (`LockState::stop_handing`), at the latest.
                tokio::select! {
                    () = tail.hand(|i, counter| state.late_yes(i, counter)) => {}
                    () = state.handing_stopped() => {}
                }
                tail.gate.close();
                state.keep_tail(tail);
            }
            .instrument(caller.clone()),
        );
    }

    /// The pause after a split vote was undone (awaited, so it has landed by the time our own
    /// pause starts): random, over several round trips, so that one contender re-tries alone
    /// and finds the nodes free. Waiters woken by a release spread over four round trips only:
    /// they met at the notice, and a pause of the retry jitter (100 ms by default) would leave
    /// the lock to a client that defers (`queue::defer`) instead of to them.
    async fn split_pause(
        &self,
        key: &str,
        round_trip: Duration,
        contention_round: u32,
        woken: bool,
    ) {
        let spread = if woken {
            round_trip * 4
        } else {
            self.inner.cfg.retry_jitter.max(round_trip * 4)
        };
        let delay = timing::retry_delay(round_trip, spread, rand::random::<f64>());
        tracing::debug!(
            key,
            round = contention_round,
            ?delay,
            "contenders split the nodes; undone, re-trying"
        );
        tokio::time::sleep(delay).await;
    }

    /// One attempt round's vote: the acquire script (or its pipelined form) on every node.
    /// `Ok` when the value stood on a quorum; the token is then chosen by [`seal`](Self::seal).
    async fn attempt(&self, req: &Request<'_>, value: &str) -> Result<Voted, NotWon> {
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

    /// The nodes of a refused round that refused because another value holds the key (none
    /// when nobody refused, or the round won).
    fn held_elsewhere(&self, round: &Round) -> Vec<bool> {
        if round.tally.no() == 0 || round.verdict == Verdict::Quorum {
            return Vec::new();
        }
        self.inner
            .nodes
            .iter()
            .map(|node| {
                round
                    .failures
                    .iter()
                    .any(|f| f.node == node.name() && matches!(f.cause, NodeError::HeldByAnother))
            })
            .collect()
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

    /// A voted round's token: the largest counter of its yes-nodes, raised first on enough of
    /// them when fewer than a quorum stand at it; then the grant.
    async fn seal(&self, req: &Request<'_>, value: &str, voted: Voted) -> Result<Won, Error> {
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
