//! The public ways to acquire a lock: [`Redlock::builder`], [`Redlock::try_acquire`],
//! [`Redlock::acquire`], [`Redlock::acquire_timeout`]. Each asks the engine
//! (`crate::client::acquire`) and wraps the held state in a [`Lock`] guard.

use std::time::Duration;

use super::builder::RedlockBuilder;
use super::guard::Lock;
use crate::client::Redlock;
use crate::client::acquire::Patience;
use crate::core::token::FencingToken;
use crate::error::Error;

impl Redlock {
    /// Starts configuring a client for these node URLs: `redis://[user:pass@]host:port[/db]`,
    /// `rediss://...` (feature `tls`), `unix:///path/to.sock`.
    pub fn builder<I, S>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedlockBuilder::new(urls)
    }

    /// One attempt round, no retries: the lock, or why not at once.
    ///
    /// One exception: a round refused although no value can stand on a quorum (contenders that
    /// started at the same moment split the nodes between them, 2/2/1 of 5) is undone and
    /// re-tried after a short random pause, at most 6 times, so that one of them wins. Every
    /// acquisition does this, on top of its configured retries.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] (another owner: the refusals alone rule out a quorum),
    /// [`Error::WrongType`] (compat mode: the key holds an application's data of another type),
    /// [`Error::NoQuorum`] (too few nodes reachable, each failure named, and each refusal when
    /// refusals and failures together ruled out a quorum), [`Error::ValidityExpired`] (the round
    /// took too long), or [`Error::InvalidArgument`] (empty key, ttl not above the drift
    /// allowance).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: if the future is dropped midway, a release of the attempt's value is sent to
    /// every node in the background (when a tokio runtime is still running), after the acquire
    /// on each node's connection. Whatever is missed expires with the ttl.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        let patience = Patience {
            rounds: 1,
            wait: Duration::ZERO,
        };
        self.acquire_lock(key, ttl, patience).await
    }

    /// Acquires with the configured retries: up to `1 + retry_count` rounds, a pause after the
    /// retry policy between them (see [`RedlockBuilder::retry_delay`]).
    ///
    /// **Not a wait for ever**, unlike `tokio::sync::Mutex::lock`: with the defaults it makes 4
    /// rounds (3 retries after random pauses that double: 50–150, 100–200 and 200–300 ms) and
    /// gives up within about half a second with [`Error::Held`] while another owner holds the
    /// lock. To wait for a holder to finish, use [`acquire_timeout`](Self::acquire_timeout)
    /// with the longest wait you accept.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), from the last round.
    ///
    /// # Cancellation safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_timeout(key, ttl, Duration::ZERO).await
    }

    /// As [`acquire`](Self::acquire), and keeps trying until `wait` has passed since the call,
    /// then gives up with the last round's error. It always makes at least the rounds
    /// [`acquire`](Self::acquire) makes, so `wait = 0` is `acquire`. No round starts after
    /// `wait` (rounds resolving contention excepted, see [`try_acquire`](Self::try_acquire));
    /// the last one starts at `wait` at the latest and may end up to one node timeout later.
    ///
    /// While the lock is held by someone else it *waits* rather than polls: the release (by any
    /// client) announces itself on every node, and the next round starts then. Between
    /// announcements it reads the holder's key (`PTTL` on every node) and sleeps until the key
    /// has expired on a quorum, at most 1 s (or the retry delay, see
    /// [`RedlockBuilder::retry_delay`], when that is longer), then reads it again rather than
    /// trying while it stands: that is what acquires when an announcement is lost (a client
    /// that publishes nothing, compat mode) or the holder crashed, at its lock's expiry. A
    /// kept-alive lock costs each waiting client one `PTTL` per node a second and no round.
    /// The waiters of one client take turns
    /// (first come, first served); waiters in different clients get an equal chance at each
    /// release, and one that lost twice in a row goes first at the next. Waiting costs the
    /// client one pub/sub connection per node (opened at its first wait) and the nodes a small
    /// marker key per waited-for lock; a release that nobody waits for publishes nothing.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), from the last round.
    ///
    /// # Cancellation safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_timeout(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let patience = Patience {
            rounds: self.inner.cfg.retry_count.saturating_add(1),
            wait,
        };
        self.acquire_lock(key, ttl, patience).await
    }

    /// The acquisition, on the client's I/O thread when it has one (see
    /// [`RedlockBuilder::io_thread`](crate::RedlockBuilder::io_thread)). The guard is made
    /// there too: an acquisition whose caller has gone by the time it is won is released by
    /// the guard's `Drop`, as one cancelled inline is by its undo.
    async fn acquire_lock(
        &self,
        key: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<Lock, Error> {
        let (client, key) = (self.clone(), key.to_owned());
        self.on_engine(async move {
            let held = match client.acquire_held(&key, ttl, patience).await {
                Err(held @ Error::Held { .. }) => {
                    return Err(client.held_or_wrong_type(&key, held).await);
                }
                other => other?,
            };
            Ok(Lock::new(client, held))
        })
        .await
    }

    /// Takes over a lock that another process, or another client, acquired: a job queue's
    /// worker finishing what a dispatcher locked. Give it the [`Lock::key`], [`Lock::value`]
    /// and [`Lock::token`] of the lock to take over, and the lease to extend it to.
    ///
    /// It is checked by one extension round: only a lock whose value still stands on a quorum
    /// of nodes resumes, extended there to `ttl` from now (a node where the key expired or was
    /// taken is not re-set). The [`Lock`] it returns is then like any held lock:
    /// [`extend`](Lock::extend), [`keep_alive`](Lock::keep_alive), [`release`](Lock::release),
    /// dropped to release, with the same key, value and fencing token.
    ///
    /// The process that hands a lock over must stop using it and must let go of its guard
    /// with [`Lock::forget`]: dropping or releasing it would release the lock under the new
    /// holder, and two processes extending one value would both believe they hold it (the
    /// nodes, and the fencing token, cannot tell them apart). The token is taken as given: a
    /// wrong token weakens only this holder's fenced writes. See the guide
    /// [`safety`](crate::guide::safety), "Handing a lock over".
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use quorumlock::{FencingToken, Redlock};
    ///
    /// # async fn run(dispatcher: Redlock, worker: Redlock) -> Result<(), quorumlock::Error> {
    /// // The dispatcher locks the job and hands it over (through the job queue, say)...
    /// let lock = dispatcher.acquire("job-42", Duration::from_secs(30)).await?;
    /// let (key, value, token) = (lock.key().to_owned(), lock.value().to_owned(), lock.token());
    /// lock.forget(); // not drop: that would release it
    ///
    /// // ...and the worker, in another process, takes it over.
    /// let lock = worker.resume(&key, &value, token, Duration::from_secs(30)).await?;
    /// assert_eq!(lock.token(), token);
    /// lock.keep_alive();
    /// // ... the job, stamping its writes with `lock.token()` ...
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] with [`LostReason::NotOwner`](crate::LostReason::NotOwner) when the
    /// refusals alone rule out a quorum: the value stands on too few nodes (a wrong value, a
    /// lock that expired, was released or was taken by someone else since);
    /// [`Error::NoQuorum`] when too few nodes answered to tell (try again while the lock's
    /// validity lasts); [`Error::ValidityExpired`] when the round took too long for `ttl`;
    /// [`Error::InvalidArgument`] for an invalid key, ttl or value (empty, a space or control
    /// character, over 1024 bytes).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: a dropped resume may still extend the value where it stands, which is
    /// what its holder's ttl bounds anyway; nothing else is written.
    pub async fn resume(
        &self,
        key: &str,
        value: &str,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        Ok(Lock::new(
            self.clone(),
            self.resume_held(key, value, token, ttl).await?,
        ))
    }
}
