//! The public face of the crate: [`Redlock`], a handle on the engine (`crate::client`) with
//! every public client method as a short delegation. Acquiring wraps the engine's held state in
//! a [`Lock`] guard. Features add their own methods from their own files (`multi.rs`,
//! `semaphore.rs`).

use std::future::Future;
use std::time::Duration;

use super::builder::RedlockBuilder;
use super::guard::Lock;
use super::scoped::{self, LockContext};
use crate::client::Engine;
use crate::client::check::TokenCheck;
use crate::client::inventory::Inventory;
use crate::client::revoke::Revocation;
use crate::client::status::LockStatus;
use crate::client::waiter::Patience;
use crate::core::token::FencingToken;
use crate::error::{ConfigError, Error};

/// A Redlock client over N independent Redis masters. Cheap to clone (one `Arc`); clones share
/// the node connections.
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock::Redlock;
///
/// # async fn run() -> Result<(), quorumlock::Error> {
/// let locks = Redlock::builder([
///     "redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003",
///     "redis://127.0.0.1:7004", "redis://127.0.0.1:7005",
/// ])
/// .build()?;
///
/// match locks.try_acquire("payout-batch-42", Duration::from_secs(10)).await {
///     Ok(lock) => {
///         println!("token {} valid for {:?}", lock.token(), lock.validity());
///         // ... do the work, stamping writes with lock.token() ...
///         if let Err(e) = lock.release().await {
///             // `Lost`: the work outlived the validity (the fencing token guarded its writes);
///             // `NoQuorum`: the keys the release missed expire with the ttl.
///             tracing::warn!("{e}");
///         }
///     }
///     Err(e) if e.is_held() => { /* another instance is doing it: skip quietly */ }
///     Err(e) => tracing::warn!("lock service degraded: {e}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Redlock {
    engine: Engine,
}

impl Redlock {
    /// The face over an assembled engine (`RedlockBuilder::build`).
    pub(crate) fn from_engine(engine: Engine) -> Self {
        Redlock { engine }
    }

    /// The engine: what features call for rounds, node commands and settings.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

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
            rounds: self.engine.retry_count().saturating_add(1),
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
        let (engine, key) = (self.engine.clone(), key.to_owned());
        self.engine
            .on_io_thread(async move {
                let held = match engine.acquire_held(&key, ttl, patience).await {
                    Err(held @ Error::Held { .. }) => {
                        return Err(engine.held_or_wrong_type(&key, held).await);
                    }
                    other => other?,
                };
                Ok(Lock::new(engine, held))
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
            self.engine.clone(),
            self.engine.resume_held(key, value, token, ttl).await?,
        ))
    }

    /// The configured number of nodes.
    pub fn node_count(&self) -> usize {
        self.engine.node_count()
    }

    /// The quorum: `nodes / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.engine.quorum()
    }

    /// The owner name this client's locks carry
    /// ([`RedlockBuilder::owner`](crate::RedlockBuilder::owner)), if one was set.
    pub fn owner(&self) -> Option<&str> {
        self.engine.owner()
    }

    /// The node addresses (passwords redacted), in configuration order.
    pub fn node_names(&self) -> Vec<String> {
        self.engine.node_names()
    }

    /// Waits until the work this client does in the background has finished: releases of failed,
    /// cancelled or dropped acquisitions, the unanswered part of a release, and calls still in
    /// flight after a won round. Call it before a short-lived process exits, so its releases
    /// are not cut off.
    ///
    /// A release call waits for its node a node timeout at a time, for as long as the node
    /// keeps answering this client's earlier calls (a burst of thousands of releases is
    /// delivered, however long the client's queue to a node), and at most until the lock's key
    /// has expired on its own. It is given up when its node answers nothing for a whole node
    /// timeout (down, hung, unreachable) or fails the call. The [`FlushReport`](crate::FlushReport) counts the
    /// release calls given up since the previous `flush`: each leaves a key that expires with
    /// its ttl.
    ///
    /// ```no_run
    /// # async fn run(locks: quorumlock::Redlock) {
    /// let report = locks.flush().await;
    /// if report.undelivered() > 0 {
    ///     tracing::warn!("{report}");
    /// }
    /// # }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only waits; the background work goes on (what a cancelled flush would
    /// have reported is reported by the next). Concurrent calls run one after the other.
    pub async fn flush(&self) -> crate::FlushReport {
        self.engine.flush().await
    }

    /// Whether `token` is the current token of `key`: a quorum read shows the key held and its
    /// highest fencing counter at exactly `token`. A resource that cannot keep a token of its
    /// own ([`fenced_claim`](crate::fenced_claim)) can ask this before it acts; `false` means
    /// do not act. It is a read: a holder can lose the lock right after it, so prefer a claim
    /// at the resource where one is possible. See [`check_token`](Self::check_token) for why.
    ///
    /// ```no_run
    /// # async fn demo(locks: &quorumlock::Redlock, token: quorumlock::FencingToken) -> Result<(), quorumlock::Error> {
    /// if !locks.is_current("payout:42", token).await? {
    ///     return Ok(()); // superseded, revoked or expired: refuse the write
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check_token`](Self::check_token).
    pub async fn is_current(&self, key: &str, token: FencingToken) -> Result<bool, Error> {
        self.engine.is_current(key, token).await
    }

    /// What a quorum of nodes says about `token` for `key` ([`TokenCheck`]). Waits for every
    /// node (each bounded by the node timeout), as [`status`](Self::status) does; a node held
    /// out by the restart guard does not count toward the quorum.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when fewer than a quorum of nodes answered;
    /// [`Error::Config`] ([`ConfigError::FencingRequired`]) for a client without fencing tokens
    /// (`fencing(false)`, `compat(true)`); [`Error::InvalidArgument`] for an invalid key.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn check_token(&self, key: &str, token: FencingToken) -> Result<TokenCheck, Error> {
        self.engine.check_token(key, token).await
    }

    /// Every lock held under `prefix` (user keys starting with it; `""` for all): its holder,
    /// on how many nodes, the time left on a quorum, the fencing counter, and when it was
    /// acquired ([`HeldLock::acquired_at`](crate::HeldLock::acquired_at): read from the value,
    /// which records the acquiring host's wall clock to the millisecond, so clock skew between
    /// that host and this one applies; unknown for values of other clients). Each node is
    /// scanned (`SCAN`, 1,000 keys a page, each page bounded by the node timeout or 1 s,
    /// whichever is longer; a Redis Cluster member master by master), then each lock key read
    /// (values and counters by `MGET`, a `PTTL` per key), and the answers merged: a key is
    /// listed when a value stands on a quorum of the nodes that answered, or could with the
    /// nodes that did not ([`HeldLock::certain`](crate::HeldLock::certain)). A value on fewer nodes (a remnant of an
    /// expired or undone lock) is not listed. Memory: at most [`MAX_LOCKS`](crate::MAX_LOCKS) keys per node.
    ///
    /// ```no_run
    /// # async fn demo(locks: &quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// for lock in locks.locks("jobs:").await?.locks {
    ///     println!("{} held by {} on {} nodes", lock.key, lock.value, lock.held_on);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when fewer than a quorum of nodes could be scanned to the end;
    /// [`Error::Config`] ([`ConfigError::FencingRequired`]) in compat mode, where lock keys
    /// are the users' own keys and cannot be told from others.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn locks(&self, prefix: &str) -> Result<Inventory, Error> {
        self.engine.locks(prefix).await
    }

    /// Revokes whoever holds `key` on a quorum: raises the key's fencing counter past the
    /// holder's token on a quorum of nodes, then deletes the holder's value (one atomic script
    /// per node) and notifies waiters, who take over with a larger token. From then on the
    /// holder's fenced writes are refused by resources that checked the counter
    /// ([`is_current`](Self::is_current)) or were claimed with [`Revocation::token`] or a later
    /// holder's token, its next extension fails and its `lost()` fires with
    /// [`LostReason::Revoked`](crate::LostReason::Revoked). A key that nobody holds on a quorum
    /// (released meanwhile, expired) is left alone.
    ///
    /// ```no_run
    /// # async fn demo(locks: &quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let revocation = locks.revoke("nightly").await?;
    /// if revocation.revoked() {
    ///     println!("revoked; tokens below {} are refused", revocation.token);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when fewer than a quorum of nodes answered the read or raised their
    /// counter (a partial revoke: where it ran, the counter is raised and the value deleted,
    /// which is always safe; run it again); [`Error::Config`]
    /// ([`ConfigError::FencingRequired`]) for a client without fencing tokens;
    /// [`Error::InvalidArgument`] for an invalid key.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future may leave the revoke done on some nodes: as a partial revoke.
    pub async fn revoke(&self, key: &str) -> Result<Revocation, Error> {
        self.engine.revoke(key).await
    }

    /// [`revoke`](Self::revoke) of one value only (`redlock break --value V`): nothing is
    /// deleted where another value holds the key, so a revoke aimed at a stuck holder cannot
    /// take the lock from the one that followed it. The counters are raised all the same (it
    /// only makes later tokens larger).
    ///
    /// # Errors
    ///
    /// As [`revoke`](Self::revoke); [`Error::InvalidArgument`] for a value that cannot be a
    /// lock's.
    pub async fn revoke_value(&self, key: &str, value: &str) -> Result<Revocation, Error> {
        self.engine.revoke_value(key, value).await
    }

    /// Every node's view of `key`: value, remaining ttl and fencing counter. Waits for every node
    /// (each bounded by the node timeout).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an invalid key; node failures are reported per node.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<LockStatus, Error> {
        self.engine.status(key).await
    }
    /// Acquires `key` (with the configured retries), keeps it alive while `work` runs, and
    /// releases it when `work` finishes.
    ///
    /// If the lock is lost first, `work`'s future is dropped (cancelled at its current await)
    /// and the call returns [`Error::Lost`]; `work` can also watch [`LockContext::lost`] to stop
    /// at a point of its choosing. Work that finishes but only after the lock was lost (it
    /// never yielded, or the release finds the lock gone) also returns [`Error::Lost`]: its
    /// result cannot be trusted to have run under the lock.
    ///
    /// ```no_run
    /// # async fn run(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let total = locks
    ///     .with_lock("nightly-report", Duration::from_secs(30), |ctx| async move {
    ///         // stamp every write with ctx.token()
    ///         ctx.token().get()
    ///     })
    ///     .await?;
    /// # let _ = total; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`acquire`](Self::acquire), and [`Error::Lost`] when the lock is lost while
    /// `work` runs.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future drops `work` and the guard, which releases in the background.
    pub async fn with_lock<F, Fut, T>(&self, key: &str, ttl: Duration, work: F) -> Result<T, Error>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = T>,
    {
        scoped::with_lock(self.acquire(key, ttl).await?, key, work).await
    }
}

impl RedlockBuilder {
    /// Checks the configuration and builds the client. No connection is made: nodes may be down,
    /// they are connected (and reconnected) in the background when first needed.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for no nodes, an invalid or duplicate URL, a drift factor outside `[0, 0.5)`,
    /// an invalid key prefix or owner name, a zero timeout, or a timing above [`MAX_TIMING`](RedlockBuilder::MAX_TIMING) (a max ttl above
    /// [`MAX_TTL`](RedlockBuilder::MAX_TTL)). An even node count is accepted with a warning: its quorum
    /// tolerates no more failures than one node fewer. A single node is accepted with a
    /// warning too: it tolerates no failure.
    pub fn build(self) -> Result<Redlock, ConfigError> {
        Ok(Redlock::from_engine(self.engine()?))
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::time::Duration;

    use super::Redlock;

    /// Two `flush` calls at once both return once the background work is done. The order that
    /// stranded the second: the first's wait ends (task A done) but it has not run since; task
    /// B starts and the second flush waits for it; the first then ends and reopens the tracker;
    /// B ends on an open tracker, which wakes no one. No node is asked: a flush with nothing
    /// parked only waits for the client's tasks.
    #[tokio::test]
    async fn concurrent_flushes_both_return() {
        let client = Redlock::builder(["redis://127.0.0.1:1"]).build().unwrap();
        let tasks = &client.engine().inner.tasks;
        let (a_done, a) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn(async move {
            let _ = a.await;
        });
        let mut first = pin!(client.flush());
        assert!(futures::poll!(first.as_mut()).is_pending(), "A runs");
        a_done.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !tasks.is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("task A ends");
        let (b_done, b) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn(async move {
            let _ = b.await;
        });
        let mut second = pin!(client.flush());
        assert!(futures::poll!(second.as_mut()).is_pending(), "B runs");
        tokio::time::timeout(Duration::from_secs(5), first)
            .await
            .expect("the first flush returns (A is done)");
        b_done.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the second flush returns once B is done");
    }
}
