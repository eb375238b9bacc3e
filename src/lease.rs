//! Leases: the task that keeps a held lock alive (or only watches its deadline), and the scoped
//! form [`Redlock::with_lock`] that runs work while the lock is held and stops it when it is lost.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::clock;
use crate::error::{Error, FailureList, LostReason};
use crate::fencing::FencingToken;
use crate::guard::LockState;
use crate::quorum;
use crate::redlock::Redlock;

/// Spawns the lease task for a held lock: with `every`, it extends the lock on that period;
/// without, it only fires the lost signal at the deadline. Dropping the handle stops it. `None`
/// (with a warning) outside a tokio runtime.
pub(crate) fn spawn(
    client: Redlock,
    state: Arc<LockState>,
    every: Option<Duration>,
) -> Option<AbortOnDropHandle<()>> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            key = state.key(),
            "no tokio runtime: the lock's lease task cannot run, it expires at its deadline"
        );
        return None;
    };
    Some(AbortOnDropHandle::new(runtime.spawn(async move {
        match every {
            Some(every) => keep_alive(client, &state, every).await,
            None => state.wait_lost().await,
        }
    })))
}

async fn keep_alive(client: Redlock, state: &Arc<LockState>, every: Duration) {
    let mut next = Instant::now() + every;
    // Whether extensions are failing for lack of a quorum: warned once per outage.
    let mut outage = false;
    loop {
        tokio::select! {
            _ = state.wait_lost() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        if !extend_once(&client, state, &mut outage).await {
            return;
        }
        next = Instant::now() + every;
    }
}

/// One extension, retried after the configured random pause for as long as validity remains.
/// Only two things end it early: a quorum saying the value is no longer ours, and the deadline.
/// Returns false when the lock is lost (the signal has fired) or was released. `outage` says
/// whether the lock's extensions are failing for lack of a quorum: the first failed round of an
/// outage warns, the others are logged at debug level, and the first success after it at info.
async fn extend_once(client: &Redlock, state: &Arc<LockState>, outage: &mut bool) -> bool {
    let cfg = &client.inner.cfg;
    let mut round = 0u32;
    // The failures of the last round that could not reach a quorum: if the deadline then cuts a
    // later round short, they are why the lock was lost.
    let mut last_failures: Option<Vec<crate::error::NodeFailure>> = None;
    loop {
        round += 1;
        // The timeout makes the deadline fire even if no node ever answers (the round itself
        // also ends at the deadline, on the deadline clock).
        let deadline = clock::tokio_after(Instant::now(), state.deadline().remaining());
        let result =
            tokio::time::timeout_at(deadline, client.extend_state(state, state.ttl())).await;
        let failures = match result {
            Ok(Ok(_)) => {
                if std::mem::take(outage) {
                    tracing::info!(key = state.key(), round, "extension reached a quorum again");
                }
                return true;
            }
            Ok(Err(Error::Lost { .. })) => return false,
            Ok(Err(Error::NoQuorum { failures, .. })) => failures,
            Ok(Err(e)) => {
                tracing::debug!(key = state.key(), error = %e, "extension round failed");
                Vec::new()
            }
            Err(_) => {
                state.lose(match last_failures {
                    Some(failures) => LostReason::Unreachable { failures },
                    None => LostReason::Expired,
                });
                return false;
            }
        };
        let pause = quorum::retry_delay(cfg.retry_delay, cfg.retry_jitter, rand::random::<f64>());
        if clock::now().saturating_add(pause) >= state.deadline() {
            state.lose(LostReason::Unreachable { failures });
            return false;
        }
        last_failures = Some(failures.clone());
        // Warn once per outage, then quietly until it succeeds or the lock is lost.
        if !std::mem::replace(outage, true) {
            tracing::warn!(
                key = state.key(),
                validity = ?state.deadline().remaining(),
                failures = %FailureList(&failures),
                "extension did not reach a quorum; retrying while validity remains (further \
                 failed rounds of this outage are logged at debug level)"
            );
        } else {
            tracing::debug!(key = state.key(), round, ?pause, failures = %FailureList(&failures), "retrying extension");
        }
        tokio::select! {
            _ = state.wait_lost() => return false,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// What work run by [`Redlock::with_lock`] knows about its lock.
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

    /// Cancelled when the lock is lost (the work's future is also dropped then).
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }
}

impl Redlock {
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
        let lock = self.acquire(key, ttl).await?;
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
}
