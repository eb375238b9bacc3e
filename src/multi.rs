//! Several resources at once: [`Redlock::acquire_all`] takes a lock on every key of a set, all or
//! nothing, and hands back one guard, [`MultiLock`], that extends and releases them together and
//! counts as lost as soon as any one of them is.
//!
//! Each key is an ordinary lock (its own quorum, its own fencing token), taken one after the other
//! in a canonical order: the keys sorted, duplicates removed. Two clients asking for overlapping
//! sets in different orders therefore ask in the same order, and a client waiting for a key holds
//! only keys that sort before it, so no circle of waiting clients can form (no deadlock). A lock
//! taken is kept alive while the later keys are awaited, and everything taken is released (and
//! the release awaited) before a failure is returned: all or nothing.
//!
//! Every call goes to one key's lock and fencing counter, which share one hash tag: with Redis
//! Cluster members, the keys of one request are split per key (never one script over several
//! user keys), so each call stays inside one hash slot.

use std::future::Future;
use std::time::Duration;

use futures::future::{join_all, select_all};
use tokio::time::Instant;

use crate::core::token::FencingToken;
use crate::error::{ArgumentError, Error, LostReason};
use crate::lock::guard::Lock;
use crate::lock::redlock::Redlock;

impl Redlock {
    /// Acquires every key of `keys`, all or nothing, with the configured retries for each key
    /// (as [`acquire`](Self::acquire)): [`acquire_all_timeout`](Self::acquire_all_timeout) with
    /// no extra wait.
    ///
    /// ```no_run
    /// # async fn run(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// // Move money between two accounts: both locked, or neither.
    /// let both = locks.acquire_all(["account:17", "account:4"], Duration::from_secs(10)).await?;
    /// let t17 = both.token("account:17").expect("asked for");
    /// let t4 = both.token("account:4").expect("asked for");
    /// // ... write to each account with its own token ...
    /// # let _ = (t17, t4);
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_all_timeout`](Self::acquire_all_timeout).
    ///
    /// # Cancellation safety
    ///
    /// As [`acquire_all_timeout`](Self::acquire_all_timeout).
    pub async fn acquire_all<I, S>(&self, keys: I, ttl: Duration) -> Result<MultiLock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.acquire_all_timeout(keys, ttl, Duration::ZERO).await
    }

    /// Acquires every key of `keys` (sorted, duplicates removed), one after the other, each as
    /// [`acquire_timeout`](Self::acquire_timeout) with what is left of `wait`; each lock keeps
    /// itself alive (extended every `ttl / 3`) from the moment it is taken, so the first keys do
    /// not expire while the later ones are awaited. If any key cannot be taken, the keys already
    /// taken are released (awaited) and the error of that key is returned: all or nothing.
    ///
    /// Taking the keys in one canonical order is what rules out deadlock between clients asking
    /// for overlapping sets (a client waiting for a key holds only keys that sort before it); `wait` bounds the whole
    /// call, not each key.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty set, or any key or ttl
    /// [`try_acquire`](Self::try_acquire) would refuse (checked for every key before any round);
    /// otherwise the error of the first key that could not be taken ([`Error::Held`],
    /// [`Error::NoQuorum`], [`Error::ValidityExpired`]), or [`Error::Lost`] when a key already
    /// taken was lost while a later one was awaited.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: if the future is dropped midway, the locks already taken are released in the
    /// background (as a dropped [`Lock`]), and so is the attempt in flight.
    pub async fn acquire_all_timeout<I, S>(
        &self,
        keys: I,
        ttl: Duration,
        wait: Duration,
    ) -> Result<MultiLock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let keys = canonical(keys);
        if keys.is_empty() {
            return Err(ArgumentError::InvalidKey {
                key: String::new(),
                reason: "acquire_all needs at least one key",
            }
            .into());
        }
        for key in &keys {
            self.engine().check(key, ttl)?;
        }
        let called = Instant::now();
        let mut held: Vec<Lock> = Vec::with_capacity(keys.len());
        for key in &keys {
            let left = wait.saturating_sub(called.elapsed());
            let taken = self.acquire_timeout(key, ttl, left).await;
            // A key taken earlier may have been lost while this one was awaited.
            let lost = held.iter().find(|l| l.is_lost()).map(|l| Error::Lost {
                key: l.key().to_owned(),
                reason: l.lost_reason().unwrap_or(LostReason::Expired),
            });
            let err = match (taken, lost) {
                (Ok(lock), None) => {
                    lock.keep_alive();
                    held.push(lock);
                    continue;
                }
                // The lock just taken is released with the rest.
                (Ok(lock), Some(lost)) => {
                    held.push(lock);
                    lost
                }
                (Err(e), None) => e,
                (Err(_), Some(lost)) => lost,
            };
            tracing::debug!(key, taken = held.len(), error = %err, "acquire_all failed; releasing what it took");
            let _ = release_all(held).await;
            return Err(err);
        }
        tracing::debug!(keys = held.len(), "acquired all keys");
        Ok(MultiLock { locks: held })
    }
}

/// The keys sorted, duplicates removed: the one order every client takes them in.
fn canonical<I, S>(keys: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut keys: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_owned()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Releases every lock at once; the first error, if any.
async fn release_all(locks: Vec<Lock>) -> Result<(), Error> {
    join_all(locks.into_iter().map(Lock::release))
        .await
        .into_iter()
        .collect()
}

/// Locks on several keys, held together: from [`Redlock::acquire_all`].
///
/// Each key has its own [`Lock`] (its own quorum and [`FencingToken`]); every one of them keeps
/// itself alive (extended every `ttl / 3`) until the guard is released or dropped. The guard is
/// lost as soon as any of its locks is: [`lost`](Self::lost) resolves and
/// [`is_lost`](Self::is_lost) turns true, and the holder must stop acting on every key (release
/// the guard to give the others back at once).
///
/// Dropping the guard releases every lock in the background, as a dropped [`Lock`] does.
#[must_use = "dropping the locks releases them at once (in the background); call .release().await to see the result"]
#[derive(Debug)]
pub struct MultiLock {
    /// In canonical (sorted) order.
    locks: Vec<Lock>,
}

impl MultiLock {
    /// The keys held, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.locks.iter().map(Lock::key)
    }

    /// The lock of each key, sorted by key.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// The fencing token of `key` (`None` if it is not one of the keys held): stamp writes to
    /// that resource with it.
    pub fn token(&self, key: &str) -> Option<FencingToken> {
        self.lock(key).map(Lock::token)
    }

    /// The lock of `key`, if it is one of the keys held.
    pub fn lock(&self, key: &str) -> Option<&Lock> {
        self.locks
            .binary_search_by(|l| l.key().cmp(key))
            .ok()
            .map(|i| &self.locks[i])
    }

    /// Validity left now: the least of the locks' (zero once any deadline has passed).
    pub fn validity(&self) -> Duration {
        self.locks
            .iter()
            .map(Lock::validity)
            .min()
            .unwrap_or_default()
    }

    /// True once any lock is lost or past its deadline. Never goes from true back to false.
    pub fn is_lost(&self) -> bool {
        self.locks.iter().any(Lock::is_lost)
    }

    /// Why the first lost lock was lost (`None` while every lock is held).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.locks.iter().find_map(Lock::lost_reason)
    }

    /// A future that resolves as soon as any of the locks is lost.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe; it only waits.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let all: Vec<_> = self.locks.iter().map(|l| Box::pin(l.lost())).collect();
        async move {
            select_all(all).await;
        }
    }

    /// Extends every lock to `ttl` from now, at once; returns the least validity. The lease
    /// length of every lock becomes `ttl`.
    ///
    /// # Errors
    ///
    /// The first error of any lock's [`Lock::extend`] ([`Error::Lost`] means the guard is lost).
    ///
    /// # Cancellation safety
    ///
    /// As [`Lock::extend`].
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        let validities: Result<Vec<Duration>, Error> =
            join_all(self.locks.iter().map(|l| l.extend(ttl)))
                .await
                .into_iter()
                .collect();
        Ok(validities?.into_iter().min().unwrap_or_default())
    }

    /// Releases every lock at once.
    ///
    /// # Errors
    ///
    /// The first error of any lock's [`Lock::release`] (every lock is released regardless).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: the locks not yet released are released in the background when dropped.
    pub async fn release(self) -> Result<(), Error> {
        release_all(self.locks).await
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn every_order_of_a_set_is_taken_in_one_order() {
        assert_eq!(canonical(["c", "a", "b", "a"]), ["a", "b", "c"]);
        assert_eq!(canonical(["b", "c", "a"]), canonical(["a", "c", "b"]));
        assert!(canonical(Vec::<String>::new()).is_empty());
    }
}
