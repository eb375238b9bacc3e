//! Leases: the task that keeps a held lock alive (or only watches its deadline). The scoped form
//! that runs work while the lock is held is `scoped.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;
use tracing::instrument::WithSubscriber;

use crate::client::Engine;
use crate::client::state::LockState;
use crate::core::clock;
use crate::error::{Error, FailureList, LostReason, NodeFailure};

/// Spawns the lease task for a held lock: with `every`, it extends the lock on that period;
/// without, it only fires the lost signal at the deadline. Dropping the handle stops it. `None`
/// (with a warning) outside a tokio runtime.
///
/// Keep-alive runs in the span current at this call (where `keep_alive` was called): each
/// extension's `quorumlock.extend` span is its child. The watcher logs nothing and holds no
/// span (it would keep the caller's span open until the lock ends).
pub(crate) fn spawn(
    client: Engine,
    state: Arc<LockState>,
    every: Option<Duration>,
) -> Option<AbortOnDropHandle<()>> {
    // The client's I/O thread when it has one (the extensions' connections are there).
    let Some(runtime) = client.task_runtime() else {
        tracing::warn!(
            key = state.key(),
            "no tokio runtime: the lock's lease task cannot run, it expires at its deadline"
        );
        return None;
    };
    let task = match every {
        Some(every) => runtime.spawn(
            async move { keep_alive(client, &state, every).await }
                .instrument(tracing::Span::current())
                .with_current_subscriber(),
        ),
        None => runtime.spawn(async move { state.wait_lost().await }),
    };
    Some(AbortOnDropHandle::new(task))
}

async fn keep_alive(client: Engine, state: &Arc<LockState>, every: Duration) {
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
async fn extend_once(client: &Engine, state: &Arc<LockState>, outage: &mut bool) -> bool {
    let mut round = 0u32;
    // The failures of the last round that could not reach a quorum: if the deadline then cuts a
    // later round short, they are why the lock was lost.
    let mut last_failures: Option<Vec<NodeFailure>> = None;
    loop {
        round += 1;
        // The timeout makes the deadline fire even if no node ever answers (the round itself
        // also ends at the deadline, on the deadline clock).
        let deadline = clock::tokio_after(Instant::now(), state.deadline().remaining());
        let result =
            tokio::time::timeout_at(deadline, client.extend_held(state, state.ttl())).await;
        let failures = match result {
            Ok(Ok(_)) => {
                if std::mem::take(outage) {
                    tracing::info!(key = state.key(), round, "extension reached a quorum again");
                }
                return true;
            }
            Ok(Err(Error::Lost { .. })) => return false,
            Ok(Err(
                Error::NoQuorum { failures, .. } | Error::PermissionDenied { failures, .. },
            )) => failures,
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
        // The crate's one retry policy, but never a pause that would skip the last chance
        // before the deadline.
        let pause = client
            .retry_pause_after(round - 1)
            .min(state.deadline().remaining() / 2);
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
