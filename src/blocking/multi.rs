//! Several locks at once, blocking: [`Redlock::acquire_all`] and its [`MultiLock`].

use std::time::Duration;

use super::{Held, Redlock};
use crate::error::Error;
use crate::{FencingToken, LostReason};

impl Redlock {
    /// Acquires every key of `keys`, all or nothing, as [`crate::Redlock::acquire_all`]: in
    /// one canonical order (no deadlock between clients asking for overlapping sets), each lock
    /// kept alive in the background from the moment it is taken.
    ///
    /// ```no_run
    /// # fn demo(locks: &quorumlock::blocking::Redlock) -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// // Move money between two accounts: both locked, or neither.
    /// let both = locks.acquire_all(["account:17", "account:4"], Duration::from_secs(10))?;
    /// let t17 = both.token("account:17").expect("asked for");
    /// // ... write to each account with its own token ...
    /// # let _ = t17;
    /// both.release()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::acquire_all`].
    pub fn acquire_all<I, S>(&self, keys: I, ttl: Duration) -> Result<MultiLock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.acquire_all_timeout(keys, ttl, Duration::ZERO)
    }

    /// As [`acquire_all`](Self::acquire_all), waiting up to `wait` in all, as
    /// [`crate::Redlock::acquire_all_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::acquire_all_timeout`].
    pub fn acquire_all_timeout<I, S>(
        &self,
        keys: I,
        ttl: Duration,
        wait: Duration,
    ) -> Result<MultiLock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let keys: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_owned()).collect();
        let locks = self
            .runtime
            .block_on(self.locks.acquire_all_timeout(keys, ttl, wait))?;
        Ok(MultiLock {
            held: Held::new(locks, &self.runtime),
        })
    }
}

/// Several locks held together, from [`Redlock::acquire_all`]; each is kept alive in the
/// background, and the set counts as lost as soon as any of them is. Dropped without
/// [`release`](Self::release), every lock is released before `drop` returns (as a blocking
/// [`Lock`](super::Lock)).
#[derive(Debug)]
#[must_use = "dropping the locks releases them (blocking until a quorum answered); call .release() to see the result"]
pub struct MultiLock {
    held: Held<crate::MultiLock>,
}

impl MultiLock {
    fn inner(&self) -> &crate::MultiLock {
        self.held.get()
    }

    /// The keys held, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.inner().keys()
    }

    /// The fencing token of `key` (`None` if it is not one of the keys held).
    pub fn token(&self, key: &str) -> Option<FencingToken> {
        self.inner().token(key)
    }

    /// Validity left now: the least of the locks'.
    pub fn validity(&self) -> Duration {
        self.inner().validity()
    }

    /// True once any lock is lost or past its deadline.
    pub fn is_lost(&self) -> bool {
        self.inner().is_lost()
    }

    /// Why the first lost lock was lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.inner().lost_reason()
    }

    /// Extends every lock to `ttl` from now, as [`crate::MultiLock::extend`].
    ///
    /// # Errors
    ///
    /// As [`crate::MultiLock::extend`], and [`ConfigError::Runtime`](crate::ConfigError::Runtime)
    /// from inside an async runtime.
    pub fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        self.held.runtime().block_on(self.inner().extend(ttl))
    }

    /// Releases every lock, as [`crate::MultiLock::release`].
    ///
    /// # Errors
    ///
    /// As [`crate::MultiLock::release`].
    pub fn release(self) -> Result<(), Error> {
        self.held.end()
    }
}
