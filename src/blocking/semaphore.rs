//! A counting semaphore, blocking: [`Redlock::semaphore`], [`Semaphore`] and its [`Permit`].

use std::time::Duration;

use super::{Lock, Redlock};
use crate::error::Error;

impl Redlock {
    /// A semaphore named `name` with `permits` permits on this client's nodes, as
    /// [`crate::Redlock::semaphore`]: at most `permits` holders at once across every client.
    ///
    /// ```no_run
    /// # fn demo(locks: &quorumlock::blocking::Redlock) -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let exports = locks.semaphore("exports", 3)?; // at most 3 exports at once
    /// let permit = exports.acquire_timeout(Duration::from_secs(60), Duration::from_secs(30))?;
    /// permit.keep_alive();
    /// // ... the export, stamping writes with permit.token() ...
    /// permit.release()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::new`].
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore, Error> {
        Ok(Semaphore {
            inner: self.locks.semaphore(name, permits)?,
            client: self.clone(),
        })
    }
}

/// A counting semaphore from [`Redlock::semaphore`]: the blocking form of
/// [`crate::Semaphore`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Semaphore {
    inner: crate::Semaphore,
    client: Redlock,
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.inner.permits()
    }

    /// One sweep over the permits, as [`crate::Semaphore::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::try_acquire`].
    pub fn try_acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        let permit = self.client.runtime.block_on(self.inner.try_acquire(ttl))?;
        Ok(self.permit(permit))
    }

    /// With the configured retries, as [`crate::Semaphore::acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::acquire`].
    pub fn acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        let permit = self.client.runtime.block_on(self.inner.acquire(ttl))?;
        Ok(self.permit(permit))
    }

    /// Waits up to `wait` for a permit, as [`crate::Semaphore::acquire_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::acquire_timeout`].
    pub fn acquire_timeout(&self, ttl: Duration, wait: Duration) -> Result<Permit, Error> {
        let permit = self
            .client
            .runtime
            .block_on(self.inner.acquire_timeout(ttl, wait))?;
        Ok(self.permit(permit))
    }

    fn permit(&self, permit: crate::Permit) -> Permit {
        let index = permit.index();
        Permit {
            lock: self.client.guard(permit.into_lock()),
            index,
        }
    }
}

/// One held permit of a [`Semaphore`]: a blocking [`Lock`] on the permit's key (it derefs to
/// it: [`token`](Lock::token), [`extend`](Lock::extend), [`keep_alive`](Lock::keep_alive),
/// [`is_lost`](Lock::is_lost)). Dropped, it is released before `drop` returns.
#[derive(Debug)]
#[must_use = "dropping the permit releases it (blocking until a quorum answered); call .release() to see the result"]
pub struct Permit {
    lock: Lock,
    index: u32,
}

impl Permit {
    /// Which permit this is, `0..permits`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Releases the permit, as [`Lock::release`].
    ///
    /// # Errors
    ///
    /// As [`Lock::release`].
    pub fn release(self) -> Result<(), Error> {
        self.lock.release()
    }

    /// The permit's lock, to hold (and release) as any other.
    pub fn into_lock(self) -> Lock {
        self.lock
    }
}

impl std::ops::Deref for Permit {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        &self.lock
    }
}
