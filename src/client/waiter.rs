//! A waiting acquisition: its place in this client's queue for the key, the pauses between its
//! rounds and the notices that end them. `client/acquire.rs` makes the rounds; a [`Waiter`]
//! decides when the next one starts (`client/wait.rs` holds the queues and subscriptions it
//! waits on).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Engine;
use super::wait::{KeyWait, MARKER_REFRESH, Ticket, Turn, Woken};
use crate::core::keys::LockKeys;
use crate::core::timing;
use crate::metrics;

/// After this many rounds in a row lost after a notice, a waiter tries at once on the next
/// notice instead of deferring to other clients (`queue::defer`): no waiter starves.
const MAX_DEFERRED_LOSSES: u32 = 2;

/// The waiting of one acquisition between its rounds. With a wait (`acquire_timeout`), a
/// refused acquisition joins this client's queue for the key, subscribes to release notices and
/// marks the key as waited on, and makes its next round when a release is announced (or this
/// client released it), or when its timer fires (the crate's backoff: the fallback for lost
/// notices). Without one (`try_acquire`, `acquire`) it pauses between rounds after the same
/// policy.
pub(super) struct Waiter<'a> {
    client: &'a Engine,
    keys: &'a LockKeys,
    /// Whether the acquisition may wait (`acquire_timeout`): only then does it queue.
    waits: bool,
    /// When its wait is over.
    give_up_at: Instant,
    /// Its place in this client's queue for the key, once it has joined.
    queued: Option<(Arc<KeyWait>, Ticket)>,
    /// The notice epoch the current round started at (0 while this client never waited for
    /// the key).
    epoch: u64,
    /// Consecutive retries that the timer started (no notice): the backoff's attempt number.
    polls: u32,
    /// Consecutive rounds lost after a notice: past a few, this waiter stops deferring.
    losses: u32,
    /// When it was last woken, and by what (`release`: a notice; `expiry`: its timer, the
    /// holder's key gone or expiring): a won round after it is a takeover, timed from then.
    woken: Option<(Instant, &'static str)>,
}

impl<'a> Waiter<'a> {
    /// The waiting of an acquisition of `keys` that may wait until `give_up_at` (`waits`). A
    /// waiter queues at once behind this client's waiters for the key instead of trying first.
    pub(super) async fn new(
        client: &'a Engine,
        keys: &'a LockKeys,
        waits: bool,
        give_up_at: Instant,
    ) -> Self {
        let queued = if waits && client.inner.waiting.queued(keys.lock()).is_some() {
            Some(client.wait_for(keys.lock()).await)
        } else {
            None
        };
        Waiter {
            client,
            keys,
            waits,
            give_up_at,
            queued,
            epoch: 0,
            polls: 0,
            losses: 0,
            woken: None,
        }
    }

    /// The user key.
    pub(super) fn key(&self) -> &str {
        self.keys.key()
    }

    /// Whether it has joined the queue: a round it makes was woken by a notice or its timer.
    pub(super) fn is_queued(&self) -> bool {
        self.queued.is_some()
    }

    /// A round starts: the notice epoch it starts at (0 while this client never waited for
    /// the key).
    pub(super) fn start_round(&mut self) -> u64 {
        self.epoch = match &self.queued {
            Some((kw, _)) => kw.epoch(),
            None => self.client.inner.waiting.epoch(self.keys.lock()),
        };
        self.epoch
    }

    /// The round started last won with `value`: the queue learns it (the next waiter waits for
    /// that value's release).
    pub(super) fn won(mut self, value: &str) {
        if let Some((_, ticket)) = &mut self.queued {
            ticket.won(value);
        }
        if let Some((at, after)) = self.woken {
            metrics::takeover(after, at.elapsed());
        }
    }

    /// The crate's backoff after the retries the timer started so far.
    pub(super) fn backoff(&self) -> Duration {
        self.client.retry_pause_after(self.polls)
    }

    /// The pause after a refused round, `backoff` unless a registered waiter was refused by a
    /// holder: it sleeps until the holder's key expires (or a notice): the holder's lease, not
    /// a poll interval, is what it waits for.
    pub(super) async fn delay(&self, held: bool, backoff: Duration) -> Duration {
        if held && self.is_queued() {
            self.client
                .holder_pause(self.keys.lock())
                .await
                .unwrap_or(backoff)
        } else {
            backoff
        }
    }

    /// Before a round: a queued waiter waits for its turn (it is the oldest of this client's
    /// waiters for the key, and the lock its predecessor won has been released since), for at
    /// most `give_up_at`. The head waiting for that release makes a round only once the
    /// predecessor's key may have expired on a quorum (its `PTTL`, re-read after the crate's
    /// backoff, then at the expiry or within 1 s): polling it on the backoff cost a round every
    /// few milliseconds of a short hold. Another release announced meanwhile (after the last
    /// round started) is read the same way at once: the predecessor's lock may have ended
    /// without a notice (forgotten, expired, lost) and another holder's release is the one to
    /// act on. Returns true when the wait is over (the caller then makes its remaining rounds
    /// out of turn); false at once when not queued.
    pub(super) async fn turn(&mut self) -> bool {
        let Some((kw, ticket)) = &self.queued else {
            return false;
        };
        let mut next: Option<Instant> = None;
        let mut since = self.epoch;
        loop {
            let poll = next
                .take()
                .unwrap_or_else(|| Instant::now() + self.client.retry_pause_after(self.polls));
            let epoch = kw.epoch();
            let turn = kw
                .turn(ticket, Some(poll.min(self.give_up_at)), since)
                .await;
            tracing::trace!(?turn, "queued waiter's turn");
            match turn {
                Turn::Now => {
                    // Woken by a notice: take turns with other clients' waiters (`queue::defer`).
                    if kw.epoch() != epoch {
                        Self::defer(kw).await;
                    }
                    return false;
                }
                Turn::Changed => since = kw.epoch(),
                Turn::Timer if Instant::now() >= self.give_up_at => return true,
                Turn::Timer => {}
            }
            if kw.is_head(ticket) {
                if turn == Turn::Timer {
                    self.client.set_marker(kw, self.keys.waiters(), false).await;
                }
                match self.client.holder_pause(self.keys.lock()).await {
                    Some(pause) if pause > timing::HOLDER_READ_AGAIN => {
                        next = Some(match turn {
                            Turn::Changed => poll,
                            _ => Instant::now() + pause,
                        });
                    }
                    _ => {
                        // The lock the previous head won is gone without a notice: waiting
                        // for its release is over.
                        kw.handover_missed();
                        if turn == Turn::Changed {
                            Self::defer(kw).await;
                        } else {
                            self.polls = self.polls.saturating_add(1);
                        }
                        return false;
                    }
                }
            }
        }
    }

    /// After a notice, a head takes turns with other clients' waiters (`queue::defer`).
    async fn defer(kw: &KeyWait) {
        let defer = kw.deferral();
        if !defer.is_zero() {
            tokio::time::sleep(defer).await;
        }
    }

    /// Pauses after a failed round until the next one, `until` at the latest. The first
    /// refusal by a holder (`held`) of a wait joins the queue, then reads the holder's key: a
    /// release from the time the marker and subscriptions stand is announced, and one before
    /// shows as the key gone, so the next round follows at once only then; while the key
    /// stands, the waiter waits as a registered one (one refused round per hold, not two). A
    /// registered waiter waits for a notice whatever refused its round: a round that could not
    /// reach a quorum (a node hung, the others split between the holder's value and ours) is
    /// usually followed by the holder's release.
    pub(super) async fn pause(&mut self, held: bool, until: Instant) {
        match &self.queued {
            None if self.waits && held => {
                let (kw, ticket) = self.client.wait_for(self.keys.lock()).await;
                self.polls = 0;
                // Notices count from here: those before were not for this waiter's round.
                self.epoch = kw.epoch();
                let holder = self.client.holder_pause(self.keys.lock()).await;
                self.queued = Some((Arc::clone(&kw), ticket));
                if let Some(pause) = holder
                    && pause > timing::HOLDER_READ_AGAIN
                {
                    self.wait_registered(&kw, (Instant::now() + pause).min(self.give_up_at))
                        .await;
                }
            }
            Some((kw, _)) => {
                let kw = Arc::clone(kw);
                self.wait_registered(&kw, until).await;
            }
            None => {
                self.polls = self.polls.saturating_add(1);
                tokio::time::sleep_until(until).await;
            }
        }
    }

    /// A registered waiter's pause: until a release notice, the holder's expiry or `until`.
    async fn wait_registered(&mut self, kw: &KeyWait, until: Instant) {
        let woken = self.await_release_or_expiry(kw, until).await;
        tracing::trace!(key = self.keys.key(), ?woken, "waiter woken");
        let after = match woken {
            Woken::Notice => "release",
            Woken::Timer => "expiry",
        };
        self.woken = Some((Instant::now(), after));
        match woken {
            Woken::Notice => {
                self.polls = 0;
                // Other clients wait too: take turns with them (`queue::defer`), unless this
                // waiter has already lost twice in a row.
                self.losses += 1;
                let defer = kw.deferral();
                if self.losses <= MAX_DEFERRED_LOSSES && !defer.is_zero() {
                    tokio::time::sleep(defer).await;
                }
            }
            Woken::Timer => self.polls = self.polls.saturating_add(1),
        }
    }

    /// Waits for a release notice after the round's epoch or until `until`, refreshing the
    /// waiters marker while it waits.
    async fn await_release(&self, kw: &KeyWait, until: Instant) -> Woken {
        loop {
            self.client.set_marker(kw, self.keys.waiters(), false).await;
            let slice = (Instant::now() + MARKER_REFRESH).min(until);
            match kw.released_after(self.epoch, slice).await {
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
    async fn await_release_or_expiry(&self, kw: &KeyWait, mut until: Instant) -> Woken {
        let lock_key = self.keys.lock();
        loop {
            let woken = self.await_release(kw, until).await;
            if woken == Woken::Notice || Instant::now() >= self.give_up_at {
                return woken;
            }
            match self.client.holder_pause(lock_key).await {
                Some(pause) if pause > timing::HOLDER_READ_AGAIN => {
                    until = (Instant::now() + pause).min(self.give_up_at);
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
}
