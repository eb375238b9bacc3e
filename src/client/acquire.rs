//! Acquisition: attempt rounds with retries, contention resolution (a split vote is undone and
//! re-tried), the fencing token chosen from the yes-answers (and lagging counters raised), and
//! the undo of a failed or cancelled attempt. The public entry points that wrap the result in a
//! guard are in `crate::lock::acquire`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, field::Empty};

use super::Redlock;
use super::round::{Round, Tail, int_reply, positive};
use super::state::{LockState, Seen, SeenAt};
use super::undo::UndoRelease;
use super::wait::{KeyWait, MARKER_REFRESH, Ticket, Woken};
use crate::core::clock::{self, Stamp};
use crate::core::keys::{LockKeys, new_value_of, waiters_key_of};
use crate::core::quorum::{self, Acquisition, Verdict};
use crate::core::timing;
use crate::core::token::{self, FencingToken};
use crate::error::{Error, FailureList, NodeError, NodeFailure};
use crate::metrics;
use crate::node::scripts::{self, ScriptCall};
use crate::node::{HoldOut, Op};

/// How many extra rounds an acquisition makes, beyond its retries, to resolve contention:
/// rounds refused although no value stood on a quorum (contenders that started together split
/// the nodes). Each undoes its partial acquisition first, then pauses at random.
const CONTENTION_ROUNDS: u32 = 6;

/// After this many rounds in a row lost after a notice, a waiter tries at once on the next
/// notice instead of deferring to other clients (`queue::defer`): no waiter starves.
const MAX_DEFERRED_LOSSES: u32 = 2;

/// A granted round's token, and where the counter was seen at it.
type Granted = (FencingToken, SeenAt);

/// Ends a won round's handing (`LockState::end_handing`) when dropped.
struct Handing(Arc<LockState>);

impl Drop for Handing {
    fn drop(&mut self) {
        self.0.end_handing();
    }
}

/// How long an acquisition keeps trying: it gives up once it has made `rounds` attempt rounds
/// *and* the next one would start more than `wait` after the call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    pub(crate) rounds: u32,
    pub(crate) wait: Duration,
}

impl Redlock {
    /// Acquires `key` with this patience: the engine behind the public `try_acquire`,
    /// `acquire` and `acquire_timeout` (`crate::lock::acquire`), which wrap the state in a guard.
    ///
    /// With a `wait` (`acquire_timeout`), a refused acquisition *waits* (`wait.rs`): it joins
    /// this client's queue for the key, subscribes to release notices and marks the key as
    /// waited on, and makes its next round when a release is announced (or this client released
    /// it), or when its timer fires (the crate's backoff: the fallback for lost notices).
    /// Without one (`try_acquire`, `acquire`) it pauses between rounds after the same policy.
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
        let result = self
            .acquire_rounds(key, ttl, patience, (&caller, &span))
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
        key: &str,
        ttl: Duration,
        patience: Patience,
        (caller, span): (&tracing::Span, &tracing::Span),
    ) -> Result<Arc<LockState>, Error> {
        let drift = self.check(key, ttl)?;
        self.inner.max_ttl.observe(ttl);
        let called = Instant::now();
        // Saturating: `acquire_timeout(.., Duration::MAX)` waits "for ever" (safety s12).
        let give_up_at = clock::tokio_after(called, patience.wait);
        let waits = !patience.wait.is_zero();
        // Every key of the lock, built once (one allocation) for all its rounds and its state.
        let keys = self.keys().lock_keys(key);
        let (lock_key, fence_key) = (keys.lock(), keys.fence());
        // A waiter queues behind this client's waiters for the key instead of trying first.
        let mut waiter: Option<(Arc<KeyWait>, Ticket)> = None;
        if waits && self.inner.waiting.queued(lock_key).is_some() {
            waiter = Some(self.wait_for(lock_key).await);
        }
        let mut round_no = 0u32;
        let mut contention_rounds = 0u32;
        // Consecutive retries that the timer started (no notice): the backoff's attempt number.
        let mut polls = 0u32;
        let mut last_err: Option<Error> = None;
        // Consecutive rounds lost after a notice: past a few, this waiter stops deferring.
        let mut losses = 0u32;
        loop {
            if let Some((kw, ticket)) = &waiter
                && self
                    .wait_turn((kw, ticket), lock_key, give_up_at, &mut polls)
                    .await
                && round_no >= patience.rounds
                && let Some(err) = last_err.take()
            {
                self.count_acquire(super::outcome_label(&err), called.elapsed(), key);
                return Err(err);
            }
            round_no += 1;
            // Every attempt round, those resolving contention included.
            span.record("rounds", round_no + contention_rounds);
            let epoch = waiter.as_ref().map_or(0, |(kw, _)| kw.epoch());
            let value = new_value_of(&self.inner.cfg.owner_suffix);
            // Armed before the first await: a cancelled or failed round is released everywhere.
            let mut undo = UndoRelease::arm(self, (lock_key, fence_key), &value, caller);
            let mut contended = false;
            let round_start = Instant::now();
            tracing::trace!(key, round = round_no, epoch, "attempt round");
            let result = self
                .attempt(
                    key,
                    &keys,
                    &value,
                    ttl,
                    drift,
                    (
                        &mut contended,
                        &mut undo.skip,
                        &mut undo.tail,
                        &mut undo.stood,
                    ),
                )
                .await;
            let err = match result {
                Ok(((token, seen), measured, validity, tail)) => {
                    undo.disarm();
                    if let Some((_, ticket)) = &mut waiter {
                        ticket.won(epoch);
                    }
                    drop(waiter);
                    self.count_acquire("acquired", called.elapsed(), key);
                    let state = self.held_state(LockState::new(
                        keys,
                        value,
                        (token, seen),
                        ttl,
                        measured.saturating_add(validity),
                    ));
                    self.keep_granted(&state, tail, caller);
                    return Ok(state);
                }
                Err(e) => e,
            };
            if contended && contention_rounds < CONTENTION_ROUNDS {
                contention_rounds += 1;
                round_no -= 1;
                self.undo_split_vote(
                    key,
                    (lock_key, fence_key, &value),
                    &undo.skip,
                    round_start.elapsed(),
                    contention_rounds,
                    waiter.is_some(),
                )
                .await;
                undo.disarm();
                continue;
            }
            drop(undo);
            let backoff = self.retry_pause_after(polls);
            let give_up = !err.is_retryable()
                || (round_no >= patience.rounds
                    && if waits {
                        Instant::now() >= give_up_at
                    } else {
                        called.elapsed().saturating_add(backoff) > patience.wait
                    });
            if give_up {
                self.count_acquire(super::outcome_label(&err), called.elapsed(), key);
                return Err(err);
            }
            let held = err.is_held();
            // A registered waiter refused by a holder sleeps until the holder's key expires
            // (or a notice): the holder's lease, not a poll interval, is what it waits for.
            let delay = if held && waiter.is_some() {
                self.holder_pause(lock_key).await.unwrap_or(backoff)
            } else {
                backoff
            };
            let now = Instant::now();
            tracing::debug!(key, round = round_no, ?delay, error = %err, "retrying acquisition");
            last_err = Some(err);
            // The last rounds of a wait: none starts after it.
            let until = if waits && round_no >= patience.rounds {
                (now + delay).min(give_up_at)
            } else {
                now + delay
            };
            match &waiter {
                // The first refusal of a wait: join the queue, then try once more at once (the
                // lock may have been released before the marker stood).
                None if waits && held => {
                    waiter = Some(self.wait_for(lock_key).await);
                    polls = 0;
                }
                // A registered waiter waits for a notice whatever refused its round: a round
                // that could not reach a quorum (a node hung, the others split between the
                // holder's value and ours) is usually followed by the holder's release.
                Some((kw, _)) => {
                    let woken = self
                        .await_release_or_expiry(kw, lock_key, epoch, (until, give_up_at))
                        .await;
                    tracing::trace!(key, ?woken, "waiter woken");
                    match woken {
                        Woken::Notice => {
                            polls = 0;
                            // Other clients wait too: take turns with them (`queue::defer`),
                            // unless this waiter has already lost twice in a row.
                            losses += 1;
                            let defer = kw.deferral();
                            if losses <= MAX_DEFERRED_LOSSES && !defer.is_zero() {
                                tokio::time::sleep(defer).await;
                            }
                        }
                        Woken::Timer => polls = polls.saturating_add(1),
                    }
                }
                _ => {
                    polls = polls.saturating_add(1);
                    tokio::time::sleep_until(until).await;
                }
            }
        }
    }

    /// The won round's unanswered calls: closed (no call of the round is sent once they are
    /// all handed) and kept by the lock, whose extensions and release read their late answers
    /// (where else its counter stands at the token). Calls to nodes whose connection was still
    /// being made at the grant are first driven by a task until they are handed, or until the
    /// round's deadline (the node timeout): the lock then stands on every node that answers in
    /// time, not only on the quorum that answered first, and a fresh client's lock is not left
    /// on a bare majority (issue 27). The lock's extensions and release wait for that task
    /// (`LockState::until_handed`), so on every node they run after the acquisition.
    fn keep_granted(&self, state: &Arc<LockState>, mut tail: Tail, caller: &tracing::Span) {
        if tail.can_park() {
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
                tail.hand(|i, counter| state.late_yes(i, counter)).await;
                tail.gate.close();
                state.keep_tail(tail);
            }
            .instrument(caller.clone()),
        );
    }

    /// Before a queued waiter's round: waits for its turn (it is the oldest of this client's
    /// waiters for the key, and the lock its predecessor won has been released since), for at
    /// most `give_up_at`. The head waiting for that release makes a round only once the
    /// predecessor's key may have expired on a quorum (its `PTTL`, re-read after the crate's
    /// backoff, then at the expiry or within 1 s): polling it on the backoff cost a round every
    /// few milliseconds of a short hold. Returns true when the wait is over (the caller then
    /// makes its remaining rounds out of turn).
    async fn wait_turn(
        &self,
        (kw, ticket): (&KeyWait, &Ticket),
        lock_key: &str,
        give_up_at: Instant,
        polls: &mut u32,
    ) -> bool {
        let mut next: Option<Instant> = None;
        loop {
            let poll = next
                .take()
                .unwrap_or_else(|| Instant::now() + self.retry_pause_after(*polls));
            let epoch = kw.epoch();
            let turn = kw.turn(ticket, Some(poll.min(give_up_at))).await;
            tracing::trace!(turn, "queued waiter's turn");
            if turn {
                // Woken by a notice: take turns with other clients' waiters (`queue::defer`).
                let defer = kw.deferral();
                if kw.epoch() != epoch && !defer.is_zero() {
                    tokio::time::sleep(defer).await;
                }
                return false;
            }
            if Instant::now() >= give_up_at {
                return true;
            }
            if kw.is_head(ticket) {
                self.set_marker(kw, &waiters_key_of(lock_key), false).await;
                match self.holder_pause(lock_key).await {
                    Some(pause) if pause > timing::HOLDER_READ_AGAIN => {
                        next = Some(Instant::now() + pause);
                    }
                    _ => {
                        *polls = polls.saturating_add(1);
                        return false;
                    }
                }
            }
        }
    }

    /// Waits for a release notice after `epoch` or until `until`, refreshing the waiters
    /// marker while it waits.
    async fn await_release(
        &self,
        kw: &KeyWait,
        lock_key: &str,
        epoch: u64,
        until: Instant,
    ) -> Woken {
        let channel = waiters_key_of(lock_key);
        loop {
            self.set_marker(kw, &channel, false).await;
            let slice = (Instant::now() + MARKER_REFRESH).min(until);
            match kw.released_after(epoch, slice).await {
                Woken::Timer if slice < until => {}
                woken => return woken,
            }
        }
    }

    /// [`await_release`](Self::await_release), and when the timer fires before `give_up_at`,
    /// reads the holder's key (`PTTL`) first: while it still stands on a quorum and will for
    /// a while yet, the waiter sleeps again instead of making a round that would be refused.
    /// A round is made on a notice, once a quorum may be free, when the nodes cannot tell, or
    /// once `give_up_at` has passed (the rounds an `acquire` makes are owed).
    async fn await_release_or_expiry(
        &self,
        kw: &KeyWait,
        lock_key: &str,
        epoch: u64,
        (mut until, give_up_at): (Instant, Instant),
    ) -> Woken {
        loop {
            let woken = self.await_release(kw, lock_key, epoch, until).await;
            if woken == Woken::Notice || Instant::now() >= give_up_at {
                return woken;
            }
            match self.holder_pause(lock_key).await {
                Some(pause) if pause > timing::HOLDER_READ_AGAIN => {
                    until = (Instant::now() + pause).min(give_up_at);
                    tracing::trace!(
                        lock_key,
                        ?pause,
                        "the holder's key still stands; waiting on"
                    );
                }
                // About to expire: the round once it has (the pause counts the millisecond
                // `PTTL` rounds off), not a round trip early.
                Some(pause) => {
                    tokio::time::sleep(pause).await;
                    return woken;
                }
                None => return woken,
            }
        }
    }

    /// Nobody won a split vote: undo our part before anyone re-tries (awaited, so it has landed
    /// by the time our own pause starts), then pause at random for several round trips, so that
    /// one contender re-tries alone and finds the nodes free. Waiters woken by a release
    /// spread over four round trips only: they met at the notice, and a pause of the retry
    /// jitter (100 ms by default) would leave the lock to a client that defers
    /// (`queue::defer`) instead of to them.
    async fn undo_split_vote(
        &self,
        key: &str,
        (lock_key, fence_key, value): (&str, &str, &str),
        skip: &[bool],
        round_trip: Duration,
        contention_round: u32,
        woken: bool,
    ) {
        self.release_on((lock_key, fence_key), value, skip, false)
            .await;
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

    /// One attempt round: the acquire script on every node, then (rarely) a raise of the fencing
    /// counters. Returns the token, the instant its validity counts from (the end of the round, on
    /// the deadline clock) and the validity.
    /// `contended` is set when the round was refused but no value can stand on a quorum
    /// (contenders split the nodes); `held_elsewhere` marks the nodes that refused because
    /// another value holds the key (the undo of the round skips them: ours is not there);
    /// `stood` is set when the value stood on a quorum (the round won, whatever follows).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn attempt(
        &self,
        key: &str,
        keys: &LockKeys,
        value: &str,
        ttl: Duration,
        drift: Duration,
        (contended, held_elsewhere, tail, stood): (
            &mut bool,
            &mut Vec<bool>,
            &mut Option<Tail>,
            &mut bool,
        ),
    ) -> Result<(Granted, Stamp, Duration, Tail), Error> {
        metrics::attempt(self.metrics_lock(key));
        let start = Instant::now();
        let started = clock::now();
        // The nodes are told whole milliseconds: the validity counts only what they were told.
        let (ttl_ms, sent) = timing::sent_ttl(ttl);
        let budget_end = start + timing::budget(sent, drift);
        let deadline = start + timing::acquire_round(self.inner.cfg.node_timeout, sent, drift);
        let fencing = self.inner.cfg.fencing;
        let (lock_key, fence_key) = (keys.lock(), keys.fence());
        // A key this client has waited for is likely held: the script form, which raises the
        // counter only where it sets the key, so refused rounds do not make tokens jump.
        let likely_held = self.inner.waiting.has_waited(lock_key);
        let call = self.acquire_call(fencing, (lock_key, fence_key), value, (ttl_ms, likely_held));
        // Before any call: a node whose yes carries the token was answered on this connection
        // generation or a later one (`Node::process_generation`).
        let generations: Seen = if fencing {
            self.inner
                .nodes
                .iter()
                .map(|n| n.process_generation())
                .collect()
        } else {
            Seen::new()
        };
        let round = self
            .round(
                Arc::new(call),
                deadline,
                None,
                HoldOut::Respect,
                Op::Acquire,
                positive,
            )
            .await;
        if round.tally.no() > 0 && round.verdict != Verdict::Quorum {
            *held_elsewhere = self
                .inner
                .nodes
                .iter()
                .map(|node| {
                    round.failures.iter().any(|f| {
                        f.node == node.name() && matches!(f.cause, NodeError::HeldByAnother)
                    })
                })
                .collect();
        }
        match quorum::acquisition(round.verdict, || round.refusal()) {
            Acquisition::Won => *stood = true,
            Acquisition::Held { contended: split } => {
                *contended = split;
                tracing::debug!(
                    key,
                    yes = round.tally.yes(),
                    refused = round.tally.no(),
                    held = round.held_by_other(),
                    failed = round.tally.failed(),
                    contended = split,
                    "lock held by another owner"
                );
                let err = self.held(key, round.held_by_other());
                // Nodes that had not answered: the undo learns their answers first.
                if !split {
                    *tail = Some(round.rest);
                }
                return Err(err);
            }
            Acquisition::Unreachable => return Err(self.unreachable(key, round)),
        }
        if self.inner.outage.swap(false, Ordering::Relaxed) {
            tracing::info!(key, "a quorum of nodes answers again");
        }
        let counters: smallvec::SmallVec<[u64; 8]> = if fencing {
            round.yes.iter().map(|&(_, c)| c.max(0) as u64).collect()
        } else {
            smallvec::smallvec![0; round.yes.len()]
        };
        let Some((max, settled)) = token::fencing_max(&counters, self.inner.nodes.len()) else {
            return Err(self.no_quorum(key, &round.tally, round.failures));
        };
        if !settled {
            self.raise_fence(key, lock_key, fence_key, value, max, &round.yes, budget_end)
                .await?;
        }
        // Where our own `INCR` returned the token, the counter stands at it for as long as that
        // connection lives: the release and extensions need not raise it there.
        let at_token = round
            .yes
            .iter()
            .filter(|&&(_, c)| SeenAt::shows(c, max))
            .map(|&(i, _)| i);
        let seen = SeenAt::new(generations, at_token);
        self.grant(
            key,
            (FencingToken::new(max), seen),
            round,
            started,
            (ttl, sent, drift),
        )
    }

    /// The end of a won round: the lock is granted if validity is left, counted from now (the
    /// end of the round, on the deadline clock).
    fn grant(
        &self,
        key: &str,
        (token, seen): (FencingToken, SeenAt),
        round: Round,
        started: Stamp,
        (ttl, sent, drift): (Duration, Duration, Duration),
    ) -> Result<(Granted, Stamp, Duration, Tail), Error> {
        let now = clock::now();
        let elapsed = now.saturating_duration_since(started);
        let Some(validity) = timing::validity(sent, elapsed, drift) else {
            tracing::warn!(key, ?elapsed, ?ttl, "quorum reached but no validity left");
            return Err(Error::ValidityExpired {
                key: key.to_owned(),
                elapsed,
                ttl,
            });
        };
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
        // The deadline is `start + ttl − drift`: counted from the start, elapsed would count
        // twice.
        Ok(((token, seen), now, validity, round.rest))
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

    /// Brings the counters of the yes-nodes below `max` up to it, so that a quorum stands at the
    /// token (only after different majorities won earlier rounds).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn raise_fence(
        &self,
        key: &str,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        max: u64,
        yes: &[(usize, i64)],
        budget_end: Instant,
    ) -> Result<(), Error> {
        let token = max.to_string();
        let call = Arc::new(scripts::RAISE_FENCE.call(
            &[lock_key.as_bytes(), fence_key.as_bytes()],
            &[value.as_bytes(), token.as_bytes()],
        ));
        let deadline = (Instant::now() + self.inner.cfg.node_timeout).min(budget_end);
        let at_max = yes.iter().filter(|&&(_, c)| c.max(0) as u64 == max).count();
        let raises = yes
            .iter()
            .filter(|&&(_, c)| (c.max(0) as u64) < max)
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
        tracing::debug!(key, token = max, at_max, raised, "raised fencing counters");
        if token::raised_to_quorum(at_max, raised, self.node_count()) {
            Ok(())
        } else {
            tracing::warn!(
                key,
                token = max,
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
}

impl Redlock {
    /// The acquire call: with fencing on, the acquire-and-fence script (for nodes that run it:
    /// Redis 6, Cluster members) and/or its pipelined form (`SET NX PX GET` + `INCR`, for the
    /// others; `node/fence.rs`), each built only if a node takes it; a plain `SET NX PX` with
    /// fencing off.
    ///
    /// With `likely_held` (a key this client has waited for) every node gets the script: the
    /// pipelined form raises the counter on a refusal too (its `INCR` does not depend on the
    /// `SET`), so each refused round of a waiter would raise the token that the next holder
    /// gets; the script raises it only where it sets the key.
    fn acquire_call(
        &self,
        fencing: bool,
        (lock_key, fence_key): (&str, &str),
        value: &str,
        (ttl_ms, likely_held): (u64, bool),
    ) -> ScriptCall {
        if fencing {
            let nodes = &self.inner.nodes;
            let pipelined = if likely_held {
                0
            } else {
                nodes.iter().filter(|n| n.pipelines()).count()
            };
            ScriptCall::fenced_acquire(
                (lock_key, fence_key),
                value,
                ttl_ms,
                (pipelined < nodes.len(), pipelined > 0),
            )
        } else {
            ScriptCall::plain(scripts::set_nx_px(lock_key, value, ttl_ms))
        }
    }
}
