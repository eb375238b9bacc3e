//! Scoped locking: [`Redlock::with_lock`](crate::Redlock::with_lock) runs work while the lock is held (kept alive), stops it
//! when the lock is lost, and releases when it ends; [`LockContext`] is what the work sees.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use super::guard::Lock;
use crate::core::token::FencingToken;
use crate::error::{Error, LostReason};

/// What work run by [`Redlock::with_lock`](crate::Redlock::with_lock) knows about its lock.
#[derive(Debug, Clone)]
pub struct LockContext {
    key: String,
    token: FencingToken,
    lost: CancellationToken,
}

impl LockContext {
    /// The user key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token to stamp writes with.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Resolves when the lock is lost (the work's future is also dropped then), as
    /// [`Lock::lost`](crate::Lock::lost).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe; it only waits.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.lost.clone().cancelled_owned()
    }

    /// A token cancelled when the lock is lost, as [`Lock::lost_token`](crate::Lock::lost_token):
    /// for `tokio::select!` or `is_cancelled()` checks.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }
}

/// [`Redlock::with_lock`](crate::Redlock::with_lock) once `lock` is acquired: the lock kept
/// alive while `work` runs, released after it.
pub(super) async fn with_lock<F, Fut, T>(lock: Lock, key: &str, work: F) -> Result<T, Error>
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = T>,
{
    lock.keep_alive();
    let ctx = LockContext {
        key: key.to_owned(),
        token: lock.token(),
        lost: lock.lost_token(),
    };
    let lost = lock.lost();
    tokio::select! {
        biased;
        _ = lost => {
            let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
            drop(lock);
            Err(Error::Lost { key: key.to_owned(), reason })
        }
        out = work(ctx) => {
            let lost_meanwhile = lock.is_lost();
            match lock.release().await {
                Err(Error::Lost { reason, .. }) => Err(Error::Lost { key: key.to_owned(), reason }),
                _ if lost_meanwhile => Err(Error::Lost {
                    key: key.to_owned(),
                    reason: LostReason::Expired,
                }),
                Err(e) => {
                    tracing::warn!(key, error = %e, "release after scoped work failed; the ttl will expire the lock");
                    Ok(out)
                }
                Ok(()) => Ok(out),
            }
        }
    }
}
