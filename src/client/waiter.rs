//! A waiting acquisition: its patience (how many rounds, how long), its place in this client's
//! queue, the pauses between its rounds and the notices that end them. A waiter waits on a set
//! of keys: a lock's one key, or every permit's key of a semaphore (a release of any of them
//! wakes it; the first key's queue orders this client's waiters). `client/acquire.rs` makes a
//! lock's rounds and `semaphore.rs` a semaphore's sweeps; a [`Waiter`] decides when the next one
//! starts and when to give up (`client/wait.rs` holds the queues and subscriptions it waits on).

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use super::Engine;
use super::queue::{self, KeyWait, Ticket, Turn, Woken};
use super::wait::MARKER_REFRESH;
use crate::core::clock;
use crate::core::timing;
use crate::error::Error;
use crate::metrics;

/// After this many rounds in a row lost after a notice, a waiter tries at once on the next
/// notice instead of deferring to other clients (`queue::defer`): no waiter starves.
const MAX_DEFERRED_LOSSES: u32 = 2;

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

/// A registered waiter: the waiters of each of its keys (their release notices), and its place
/// in this client's queue for the first key.
struct Queued {
    kws: SmallVec<[Arc<KeyWait>; 1]>,
    ticket: Ticket,
}

/// The patience of one acquisition and its waiting between rounds. With a wait
/// (`acquire_timeout`), a refused acquisition joins this client's queue, subscribes to the
/// release notices of its keys and marks them as waited on, and makes its next round when a
/// release is announced (or this client released one), or when its timer fires (the crate's
/// backoff: the fallback for lost notices). Without one (`try_acquire`, `acquire`) it pauses
/// between rounds after the same policy.
pub(crate) struct Waiter<'a> {
    client: &'a Engine,
    /// What is acquired, for log lines: a lock's user key, a semaphore's name.
    name: &'a str,
    /// The lock keys waited on, at least one.
    keys: &'a [&'a str],
    tries: Tries,
    /// Its registration and place in the queue, once it has joined.
    queued: Option<Queued>,
    /// The notice epochs (one per key) the current round started at, once queued.
    epochs: SmallVec<[u64; 1]>,
    /// Consecutive retries that the timer started (no notice): the backoff's attempt number.
    polls: u32,
    /// Consecutive rounds lost after a notice: past a few, this waiter stops deferring.
    losses: u32,
    /// When it was last woken, and by what (`release`: a notice; `expiry`: its timer, the
    /// holder's key gone or expiring): a won round after it is a takeover, timed from then.
    woken: Option<(Instant, &'static str)>,
    /// The key whose release notice woke it last, until the next round takes it.
    released: Option<usize>,
}

impl<'a> Waiter<'a> {
    /// The waiting of an acquisition of `keys` (at least one) with `patience`. With a wait, it
    /// queues at once behind this client's waiters for the first key instead of trying first.
    pub(crate) async fn new(
        client: &'a Engine,
        name: &'a str,
        keys: &'a [&'a str],
        patience: Patience,
    ) -> Self {
        let tries = Tries::new(patience);
        let queued = match keys.first() {
            Some(first) if tries.waits() && client.inner.waiting.has_queue(first) => {
                let (kws, ticket) = client.wait_for(keys).await;
                Some(Queued { kws, ticket })
            }
            _ => None,
        };
        Waiter {
            client,
            name,
            keys,
            tries,
            queued,
            epochs: SmallVec::new(),
            polls: 0,
            losses: 0,
            woken: None,
            released: None,
        }
    }

    /// Before a round: waits for its turn, and gives up (with the last round's error) when the
    /// wait is over and every promised round was made. Otherwise counts the round.
    pub(crate) async fn next_round(&mut self) -> Result<(), Error> {
        if self.turn().await
            && self.tries.made_all()
            && let Some(err) = self.tries.last_err.take()
        {
            return Err(err);
        }
        self.tries.rounds += 1;
        if let Some(q) = &self.queued {
            self.epochs = epochs(&q.kws);
        }
        Ok(())
    }

    /// The key whose release notice woke this waiter, if one did since the last round: a round
    /// over several keys starts there.
    pub(crate) fn released_key(&mut self) -> Option<usize> {
        self.released.take()
    }

    /// The round started last won with `value`. When the waiter waits on one key, its queue
    /// learns the value (the next waiter waits for that lock's release); with several, the
    /// next waiter tries at once (another key may be free).
    pub(crate) fn won(mut self, value: &str) {
        if let Some(q) = &mut self.queued
            && self.keys.len() == 1
        {
            q.ticket.won(value);
        }
        if let Some((at, after)) = self.woken {
            metrics::takeover(after, at.elapsed());
        }
    }

    /// After a failed round: gives up (`Err` with its error), or pauses until the next round as
    /// the waiting decides.
    pub(crate) async fn retry(&mut self, err: Error) -> Result<(), Error> {
        let backoff = self.backoff();
        if self.tries.give_up(&err, backoff) {
            return Err(err);
        }
        let held = err.is_held();
        let delay = self.delay(held, backoff).await;
        let now = Instant::now();
        tracing::debug!(key = self.name, round = self.tries.rounds, ?delay, error = %err, "retrying acquisition");
        self.tries.last_err = Some(err);
        let until = self.tries.next_round_at(now + delay);
        self.pause(held, until).await;
        Ok(())
    }

    /// Attempt rounds made, those that resolved contention left out.
    pub(super) fn rounds(&self) -> u32 {
        self.tries.rounds
    }

    /// Every attempt round made, those that resolved contention included.
    pub(super) fn all_rounds(&self) -> u32 {
        self.tries.rounds + self.tries.contention
    }

    /// When the acquisition was called.
    pub(super) fn called(&self) -> Instant {
        self.tries.called
    }

    /// A split vote: one more round to resolve it, numbered, unless those are used up (the
    /// failed round then counts as a retry).
    pub(super) fn contend(&mut self) -> Option<u32> {
        if self.tries.contention >= CONTENTION_ROUNDS {
            return None;
        }
        self.tries.contention += 1;
        self.tries.rounds -= 1;
        Some(self.tries.contention)
    }

    /// Whether a round failed with `err` is the last.
    pub(super) fn gives_up(&self, err: &Error) -> bool {
        self.tries.give_up(err, self.backoff())
    }

    /// The notice epoch of the first key the current round started at (0 while this client
    /// never waited for it).
    pub(super) fn epoch(&self) -> u64 {
        match self.epochs.first() {
            Some(&e) if self.queued.is_some() => e,
            _ => self
                .keys
                .first()
                .map_or(0, |k| self.client.inner.waiting.epoch(k)),
        }
    }

    /// Whether it has joined the queue: a round it makes was woken by a notice or its timer.
    pub(super) fn is_queued(&self) -> bool {
        self.queued.is_some()
    }

    /// The crate's backoff after the retries the timer started so far.
    fn backoff(&self) -> Duration {
        self.client.retry_pause_after(self.polls)
    }

    /// The pause after a refused round, `backoff` unless a registered waiter was refused by a
    /// holder: it sleeps until the first holder's key expires (or a notice): the holders'
    /// leases, not a poll interval, are what it waits for.
    async fn delay(&self, held: bool, backoff: Duration) -> Duration {
        if held && self.is_queued() {
            self.holder_pause().await.unwrap_or(backoff)
        } else {
            backoff
        }
    }

    /// Until the first of its keys may be free on a quorum (`Engine::holder_pause` of each);
    /// `None` when no key's nodes can tell.
    async fn holder_pause(&self) -> Option<Duration> {
        let pauses =
            futures::future::join_all(self.keys.iter().map(|k| self.client.holder_pause(k))).await;
        pauses.into_iter().flatten().min()
    }

    /// Before a round: a queued waiter waits for its turn (it is the oldest of this client's
    /// waiters for the first key, and the lock its predecessor won has been released since),
    /// for at most `give_up_at`. The head waiting for that release makes a round only once the
    /// predecessor's key may have expired on a quorum (its `PTTL`, re-read after the crate's
    /// backoff, then at the expiry or within 1 s): polling it on the backoff cost a round every
    /// few milliseconds of a short hold. Another release announced meanwhile (after the last
    /// round started) is read the same way at once: the predecessor's lock may have ended
    /// without a notice (forgotten, expired, lost) and another holder's release is the one to
    /// act on. Returns true when the wait is over (the caller then makes its remaining rounds
    /// out of turn); false at once when not queued.
    async fn turn(&mut self) -> bool {
        let Some(q) = &self.queued else {
            return false;
        };
        let kw = &q.kws[0];
        let give_up_at = self.tries.give_up_at;
        let mut next: Option<Instant> = None;
        let mut since = self.epochs.first().copied().unwrap_or(0);
        loop {
            let poll = next
                .take()
                .unwrap_or_else(|| Instant::now() + self.client.retry_pause_after(self.polls));
            let before = epochs(&q.kws);
            let turn = kw.turn(&q.ticket, Some(poll.min(give_up_at)), since).await;
            tracing::trace!(?turn, "queued waiter's turn");
            match turn {
                Turn::Now => {
                    // Woken by a notice: take turns with other clients' waiters (`queue::defer`).
                    if let Some(i) = queue::first_released(&q.kws, &before) {
                        self.released = Some(i);
                        defer(&q.kws[i]).await;
                    }
                    return false;
                }
                Turn::Changed => since = kw.epoch(),
                Turn::Timer if Instant::now() >= give_up_at => return true,
                Turn::Timer => {}
            }
            if kw.is_head(&q.ticket) {
                if turn == Turn::Timer {
                    self.mark(&q.kws).await;
                }
                match self.holder_pause().await {
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
                            defer(kw).await;
                        } else {
                            self.polls = self.polls.saturating_add(1);
                        }
                        return false;
                    }
                }
            }
        }
    }

    /// Refreshes the waiters marker of every key, where due.
    async fn mark(&self, kws: &[Arc<KeyWait>]) {
        for kw in kws {
            self.client.set_marker(kw, false).await;
        }
    }

    /// Pauses after a failed round until the next one, `until` at the latest. The first
    /// refusal by a holder (`held`) of a wait joins the queue, then reads the holders' keys: a
    /// release from the time the markers and subscriptions stand is announced, and one before
    /// shows as a key gone, so the next round follows at once only then; while the keys stand,
    /// the waiter waits as a registered one (one refused round per hold, not two). A
    /// registered waiter waits for a notice whatever refused its round: a round that could not
    /// reach a quorum (a node hung, the others split between the holder's value and ours) is
    /// usually followed by the holder's release.
    async fn pause(&mut self, held: bool, until: Instant) {
        match &self.queued {
            None if self.tries.waits() && held => {
                let (kws, ticket) = self.client.wait_for(self.keys).await;
                self.polls = 0;
                // Notices count from here: those before were not for this waiter's round.
                self.epochs = epochs(&kws);
                self.queued = Some(Queued { kws, ticket });
                if let Some(pause) = self.holder_pause().await
                    && pause > timing::HOLDER_READ_AGAIN
                {
                    let until = (Instant::now() + pause).min(self.tries.give_up_at);
                    self.wait_registered(until).await;
                }
            }
            Some(_) => self.wait_registered(until).await,
            None => {
                self.polls = self.polls.saturating_add(1);
                tokio::time::sleep_until(until).await;
            }
        }
    }

    /// A registered waiter's pause: until a release notice, the first holder's expiry or
    /// `until`.
    async fn wait_registered(&mut self, until: Instant) {
        let Some(q) = &self.queued else {
            return;
        };
        let woken = self.await_release_or_expiry(q, until).await;
        tracing::trace!(key = self.name, ?woken, "waiter woken");
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
                let released = queue::first_released(&q.kws, &self.epochs);
                self.released = released;
                let defer = released.map_or(Duration::ZERO, |i| q.kws[i].deferral());
                if self.losses <= MAX_DEFERRED_LOSSES && !defer.is_zero() {
                    tokio::time::sleep(defer).await;
                }
            }
            Woken::Timer => self.polls = self.polls.saturating_add(1),
        }
    }

    /// Waits for a release notice of any key after the round's epochs or until `until`,
    /// refreshing the waiters markers while it waits.
    async fn await_release(&self, q: &Queued, until: Instant) -> Woken {
        loop {
            self.mark(&q.kws).await;
            let slice = (Instant::now() + MARKER_REFRESH).min(until);
            match queue::released_after_any(&q.kws, &self.epochs, slice).await {
                Woken::Timer if slice < until => {}
                woken => return woken,
            }
        }
    }

    /// [`await_release`](Self::await_release), and when the timer fires before `give_up_at`,
    /// reads the holders' keys (`PTTL`) first: while each still stands on a quorum and will for
    /// a while yet, the waiter sleeps again instead of making a round that would be refused.
    /// A round is made on a notice, once a quorum may be free of a key, when the nodes cannot
    /// tell, or once `give_up_at` has passed (the rounds an `acquire` makes are owed).
    async fn await_release_or_expiry(&self, q: &Queued, mut until: Instant) -> Woken {
        let give_up_at = self.tries.give_up_at;
        loop {
            let woken = self.await_release(q, until).await;
            if woken == Woken::Notice || Instant::now() >= give_up_at {
                return woken;
            }
            match self.holder_pause().await {
                Some(pause) if pause > timing::HOLDER_READ_AGAIN => {
                    until = (Instant::now() + pause).min(give_up_at);
                    tracing::trace!(
                        key = self.name,
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

/// The release notices counted so far, per key.
fn epochs(kws: &[Arc<KeyWait>]) -> SmallVec<[u64; 1]> {
    kws.iter().map(|kw| kw.epoch()).collect()
}

/// After a notice, a head takes turns with other clients' waiters (`queue::defer`).
async fn defer(kw: &KeyWait) {
    let defer = kw.deferral();
    if !defer.is_zero() {
        tokio::time::sleep(defer).await;
    }
}
