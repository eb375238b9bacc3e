//! Acquisition: attempt rounds with retries, contention resolution (a split vote is undone and
//! re-tried), and the undo of a failed or cancelled attempt. One round's vote is `vote.rs`,
//! the token and grant of a round that won `grant.rs`; the patience (when to give up) and the
//! waiting between rounds are a [`Waiter`]'s (`waiter.rs`). The public entry points that wrap the result in a guard are in
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
use super::waiter::{Patience, Waiter};
use crate::core::timing;
use crate::core::value::new_value_of;
use crate::error::Error;

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
        let lock_key = [req.keys.lock()];
        let mut waiter = Waiter::new(self, req.key, &lock_key, patience).await;
        match self.rounds_until_won(&req, &mut waiter, span).await {
            Ok((value, won)) => {
                let called = waiter.called();
                waiter.won(&value);
                Ok(self.granted(req, value, won, called))
            }
            Err(err) => {
                let waited = waiter.called().elapsed();
                self.count_acquire(super::outcome_label(&err), waited, req.key);
                Err(err)
            }
        }
    }

    /// Attempt rounds until one wins (its value) or the `waiter` gives up (the last error).
    async fn rounds_until_won(
        &self,
        req: &Request<'_>,
        waiter: &mut Waiter<'_>,
        span: &tracing::Span,
    ) -> Result<(String, Won), Error> {
        loop {
            waiter.next_round().await?;
            // Every attempt round, those resolving contention included.
            span.record("rounds", waiter.all_rounds());
            let value = new_value_of(&self.inner.cfg.owner_suffix);
            let (round, epoch) = (waiter.rounds(), waiter.epoch());
            tracing::trace!(key = req.key, round, epoch, "attempt round");
            let err = match self.round_of(req, &value, waiter).await {
                RoundEnd::Won(won) => return Ok((value, won)),
                RoundEnd::Undone => continue,
                RoundEnd::Failed(err) => err,
            };
            waiter.retry(err).await?;
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
    async fn round_of(&self, req: &Request<'_>, value: &str, waiter: &mut Waiter<'_>) -> RoundEnd {
        let mut undo = UndoRelease::arm(self, &req.keys, value, req.ttl, req.caller);
        let round_start = Instant::now();
        let voted = match self.attempt(req, value).await {
            Ok(voted) => voted,
            Err(lost) => {
                undo.skip = lost.held_elsewhere;
                undo.set_on = lost.set_on;
                undo.tail = lost.tail;
                if lost.contended
                    && let Some(contention_round) = waiter.contend()
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
                if !waiter.gives_up(&lost.err) {
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
