//! Acquisition: attempt rounds with retries, contention resolution (a split vote is undone and
//! re-tried), and the undo of a failed or cancelled attempt. One round's vote is `vote.rs`,
//! the token and grant of a round that won `grant.rs`; waiting between rounds is a
//! [`Waiter`]'s (`waiter.rs`). The public entry points that wrap the result in a guard are in
//! `crate::lock::acquire`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, field::Empty};

use super::Engine;
use super::grant::Won;
use super::state::LockState;
use super::undo::UndoRelease;
use super::vote::Request;
use super::waiter::Waiter;
use crate::core::clock;
use crate::core::timing;
use crate::core::value::new_value_of;
use crate::error::Error;

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
}
