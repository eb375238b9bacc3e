//! (Feature `blocking`.) The lock for programs without a tokio runtime: every call blocks the
//! calling thread, and a small runtime of the client's own (one worker thread) runs the node
//! connections, keep-alive extensions and background releases meanwhile.
//!
//! ```no_run
//! use std::time::Duration;
//! use quorumlock::blocking::Redlock;
//!
//! # fn main() -> Result<(), quorumlock::Error> {
//! let locks = Redlock::new(
//!     quorumlock::Redlock::builder([
//!         "redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003",
//!     ])
//!     .build()?,
//! )?;
//! let lock = locks.acquire("nightly-report", Duration::from_secs(30))?;
//! lock.keep_alive(); // extended in the background while this thread works
//! // ... blocking work, stamping writes with lock.token() ...
//! if lock.is_lost() {
//!     eprintln!("lost the lock; the fencing token guarded the writes");
//! }
//! let _ = lock.release();
//! # Ok(()) }
//! ```
//!
//! Besides single locks: several at once ([`Redlock::acquire_all`]), a counting semaphore
//! ([`Redlock::semaphore`]), leader election ([`Redlock::election`]), run-once jobs
//! ([`Redlock::run_once`]) and a lock handed over by another process ([`Redlock::resume`]),
//! each a thin blocking wrapper over the async API of the same name.
//!
//! Do not call these from inside a tokio runtime (they would block one of its threads, and
//! tokio refuses to `block_on` there): use the async [`crate::Redlock`] instead.

mod election;
mod held;
mod multi;
mod run_once;
mod semaphore;

use std::sync::Arc;
use std::time::Duration;

pub use election::{Election, Leadership};
pub use multi::MultiLock;
pub use run_once::RunOnce;
pub use semaphore::{Permit, Semaphore};

use held::Held;

use crate::error::{ConfigError, Error};
use crate::{FencingToken, LockStatus, LostReason};

/// A blocking Redlock client: the async [`crate::Redlock`] driven by a runtime of its own.
/// Cheap to clone; clones share the runtime and the node connections.
#[derive(Debug, Clone)]
pub struct Redlock {
    locks: crate::Redlock,
    runtime: Arc<Runtime>,
}

/// The client's runtime; flushes background releases before it shuts down.
#[derive(Debug)]
struct Runtime {
    /// Taken only by `Drop`.
    runtime: Option<tokio::runtime::Runtime>,
    locks: crate::Redlock,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Releases of dropped guards and the unanswered part of rounds: each given up once
            // its node answers nothing for a node timeout, so this returns promptly even with
            // nodes down. (Not from inside an
            // async runtime, where blocking is not allowed: the ttl bounds those keys.)
            if tokio::runtime::Handle::try_current().is_err() {
                let _ = runtime.block_on(self.locks.flush());
            }
            runtime.shutdown_background();
        }
    }
}

impl Runtime {
    /// Runs `f` to completion on the client's runtime, blocking this thread.
    fn block_on<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(ConfigError::Runtime(
                "called from inside an async runtime, where it would block a worker; use the async \
                 quorumlock::Redlock there"
                    .to_owned(),
            )
            .into());
        }
        match &self.runtime {
            Some(runtime) => runtime.block_on(f),
            None => {
                Err(ConfigError::Runtime("the client's runtime has shut down".to_owned()).into())
            }
        }
    }

    fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.runtime.as_ref().map(tokio::runtime::Runtime::handle)
    }
}

impl Redlock {
    /// Wraps a configured client (see [`crate::Redlock::builder`]) with a runtime of its own:
    /// one worker thread for the connections, keep-alive and background releases.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Runtime`] if the runtime cannot start (no thread could be spawned).
    pub fn new(locks: crate::Redlock) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("quorumlock")
            .enable_time()
            .enable_io()
            .build()
            .map_err(|e| ConfigError::Runtime(format!("its runtime could not start: {e}")))?;
        Ok(Redlock {
            runtime: Arc::new(Runtime {
                runtime: Some(runtime),
                locks: locks.clone(),
            }),
            locks,
        })
    }

    /// The async client underneath.
    pub fn as_async(&self) -> &crate::Redlock {
        &self.locks
    }

    /// One attempt round, as [`crate::Redlock::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::try_acquire`].
    pub fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        let lock = self.runtime.block_on(self.locks.try_acquire(key, ttl))?;
        Ok(self.guard(lock))
    }

    /// Acquires with the configured retries, as [`crate::Redlock::acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::acquire`].
    pub fn acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        let lock = self.runtime.block_on(self.locks.acquire(key, ttl))?;
        Ok(self.guard(lock))
    }

    /// Keeps trying until `wait` has passed, as [`crate::Redlock::acquire_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::acquire_timeout`].
    pub fn acquire_timeout(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lock, Error> {
        let lock = self
            .runtime
            .block_on(self.locks.acquire_timeout(key, ttl, wait))?;
        Ok(self.guard(lock))
    }

    /// Takes over a lock another process acquired, from its key, value and token, as
    /// [`crate::Redlock::resume`] (checked by an extension round: only a value that still
    /// stands on a quorum resumes).
    ///
    /// ```no_run
    /// # fn demo(worker: &quorumlock::blocking::Redlock, key: &str, value: &str, token: u64) -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::FencingToken;
    /// // key, value and token as the dispatcher's `Lock::key`, `value` and `token` gave them
    /// let lock = worker.resume(key, value, FencingToken::new(token), Duration::from_secs(30))?;
    /// lock.keep_alive();
    /// // ... the job ...
    /// lock.release()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::resume`].
    pub fn resume(
        &self,
        key: &str,
        value: &str,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let lock = self
            .runtime
            .block_on(self.locks.resume(key, value, token, ttl))?;
        Ok(self.guard(lock))
    }

    /// Every node's view of `key`, as [`crate::Redlock::status`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::status`].
    pub fn status(&self, key: &str) -> Result<LockStatus, Error> {
        self.runtime.block_on(self.locks.status(key))
    }

    /// Whether `token` is `key`'s current token, as [`crate::Redlock::is_current`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::is_current`].
    pub fn is_current(&self, key: &str, token: crate::FencingToken) -> Result<bool, Error> {
        self.runtime.block_on(self.locks.is_current(key, token))
    }

    /// Revokes `key`'s holder, as [`crate::Redlock::revoke`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::revoke`].
    pub fn revoke(&self, key: &str) -> Result<crate::Revocation, Error> {
        self.runtime.block_on(self.locks.revoke(key))
    }

    /// Every lock held under `prefix`, as [`crate::Redlock::locks`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redlock::locks`].
    pub fn locks(&self, prefix: &str) -> Result<crate::Inventory, Error> {
        self.runtime.block_on(self.locks.locks(prefix))
    }

    /// Waits for the background releases, as [`crate::Redlock::flush`], and reports the
    /// release calls it could not deliver. Dropping the last clone of the client does this too.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Runtime`] when called from inside an async runtime.
    pub fn flush(&self) -> Result<crate::FlushReport, Error> {
        self.runtime
            .block_on(async { Ok(self.locks.flush().await) })
    }

    /// Acquires `key` (with the configured retries), keeps it alive while `work` runs on this
    /// thread, then releases it: the blocking form of [`crate::Redlock::with_lock`].
    ///
    /// Blocking work cannot be stopped from outside, so unlike the async form `work` always
    /// runs to its end: check [`Lock::is_lost`] between its steps and stamp its writes with
    /// [`Lock::token`]. If the lock was lost by the time `work` returned, its output is
    /// discarded and [`Error::Lost`] returned: it was not done under the lock.
    ///
    /// ```no_run
    /// # fn demo(locks: &quorumlock::blocking::Redlock) -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let rows = locks.with_lock("nightly-report", Duration::from_secs(30), |lock| {
    ///     // ... blocking work, stamping writes with lock.token() ...
    ///     42
    /// })?;
    /// # let _ = rows; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::Lost`] if the lock was lost before `work`
    /// returned; a failed release after successful work is only logged (the ttl expires the
    /// key).
    pub fn with_lock<T>(
        &self,
        key: &str,
        ttl: Duration,
        work: impl FnOnce(&Lock) -> T,
    ) -> Result<T, Error> {
        let lock = self.acquire(key, ttl)?;
        lock.keep_alive();
        let out = work(&lock);
        if lock.is_lost() {
            let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
            lock.forget();
            return Err(Error::Lost {
                key: key.to_owned(),
                reason,
            });
        }
        if let Err(e) = lock.release() {
            tracing::warn!(key, error = %e, "release after with_lock failed; the ttl will expire the lock");
        }
        Ok(out)
    }

    fn guard(&self, lock: crate::Lock) -> Lock {
        Lock {
            held: Held::new(lock, &self.runtime),
        }
    }
}

/// A held lock, from the blocking [`Redlock`]. Dropped without [`release`](Self::release), it
/// is released before `drop` returns, as a blocking API should: the release waits for a quorum
/// (each node bounded by the node timeout), so the same key can be acquired again right after.
/// (Dropped inside an async runtime, where blocking is not allowed, it is released in the
/// background instead.) [`forget`](Self::forget) leaves the key to expire.
#[derive(Debug)]
#[must_use = "dropping the lock releases it (blocking until a quorum answered); call .release() to see the result"]
pub struct Lock {
    held: Held<crate::Lock>,
}

impl Lock {
    fn inner(&self) -> &crate::Lock {
        self.held.get()
    }

    /// The user key.
    pub fn key(&self) -> &str {
        self.inner().key()
    }

    /// The fencing token to stamp writes with.
    pub fn token(&self) -> FencingToken {
        self.inner().token()
    }

    /// This acquisition's value, to hand the lock over, as [`crate::Lock::value`].
    pub fn value(&self) -> &str {
        self.inner().value()
    }

    /// The owner name this lock's value carries, as [`crate::Lock::owner`].
    pub fn owner(&self) -> Option<String> {
        self.inner().owner()
    }

    /// Validity left now (zero once the deadline has passed).
    pub fn validity(&self) -> Duration {
        self.inner().validity()
    }

    /// True once the lock is lost or its deadline has passed.
    pub fn is_lost(&self) -> bool {
        self.inner().is_lost()
    }

    /// Why the lock was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.inner().lost_reason()
    }

    /// Leaves the lock to expire with its ttl instead of releasing it (keep-alive stops), as
    /// [`crate::Lock::forget`].
    pub fn forget(self) {
        if let Some(lock) = self.held.let_go() {
            lock.forget();
        }
    }

    /// Extends the lock to `ttl` from now, as [`crate::Lock::extend`].
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::extend`], and [`ConfigError::Runtime`] from inside an async runtime.
    pub fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        self.held.runtime().block_on(self.inner().extend(ttl))
    }

    /// Extends the lock every `ttl / 3` on the client's runtime until it is released, dropped
    /// or lost, as [`crate::Lock::keep_alive`]; check [`is_lost`](Self::is_lost) between steps
    /// of the work.
    pub fn keep_alive(&self) {
        let _entered = self
            .held
            .runtime()
            .handle()
            .map(tokio::runtime::Handle::enter);
        self.inner().keep_alive();
    }

    /// Releases the lock on every node, as [`crate::Lock::release`].
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::release`], and [`ConfigError::Runtime`] from inside an async runtime
    /// (the lock is then released in the background).
    pub fn release(self) -> Result<(), Error> {
        self.held.end()
    }
}
