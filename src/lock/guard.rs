//! The held lock's guard, [`Lock`]: its identity, validity, lost signal, extension, auto-extension
//! and release. It holds the client engine and the lock's shared state, and calls only the
//! engine's operations on a held lock (`extend_held`, `release_held`, `release_in_background`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::lease;
use crate::client::Engine;
use crate::client::state::LockState;
use crate::core::lock;
use crate::core::token::FencingToken;
use crate::error::{Error, LostReason};

/// A held lock.
///
/// It carries the key, the [`FencingToken`] to stamp writes with, and a validity deadline read
/// from a clock that keeps counting while the machine is suspended (`CLOCK_BOOTTIME` on Linux
/// and Android; the monotonic clock elsewhere): the lock is yours only until [`deadline`](Self::deadline), unless
/// extended ([`extend`](Self::extend), or automatically with [`keep_alive`](Self::keep_alive)).
///
/// # Releasing
///
/// Call [`release`](Self::release) and check its result. Dropping the guard instead stops any
/// auto-extension at once and sends a best-effort release in the background: on the current
/// tokio runtime, or, when dropped outside any runtime, on the runtime the lock was acquired on
/// while that one still runs (once it has shut down, nothing is sent and the ttl bounds how long
/// the keys stay). That is an optimisation: what guarantees the key goes away is its ttl on each
/// node, and a crashed process releases nothing. [`forget`](Self::forget) opts out: the lock then
/// stays until its ttl ends.
///
/// # Losing it
///
/// [`lost`](Self::lost) resolves (and [`lost_token`](Self::lost_token) is cancelled) when the
/// lock is lost: its deadline passes without a successful extension, an extension finds a quorum
/// no longer holds our value, or auto-extension cannot reach a quorum. It also fires when the
/// guard is released or dropped: in every case, the holder must stop acting on the lock.
///
/// ```no_run
/// # async fn run(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// let lock = locks.acquire("report", Duration::from_secs(30)).await?;
/// lock.keep_alive(); // extends every ttl/3 until released or lost
/// tokio::select! {
///     _ = lock.lost() => eprintln!("lost the lock; stopping"),
///     _ = tokio::time::sleep(Duration::from_secs(60)) => {} // long work
/// }
/// match lock.release().await {
///     // `Err(Lost)` after a loss: already handled above (or lost just after the work, which
///     // the fencing token covers); the keys still ours are deleted anyway.
///     Ok(()) | Err(quorumlock::Error::Lost { .. }) => {}
///     Err(e) => eprintln!("release incomplete, the rest expires with the ttl: {e}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping the lock releases it at once (in the background); call .release().await to see the result"]
pub struct Lock {
    client: Engine,
    state: Arc<LockState>,
    /// The runtime the lock was acquired on: a guard dropped outside any runtime (a plain
    /// thread, a `Drop` after `block_on` returned) still sends its release there, while that
    /// runtime runs. Once it has shut down, the ttl removes the keys.
    runtime: Option<tokio::runtime::Handle>,
    task: Mutex<Option<AbortOnDropHandle<()>>>,
    done: bool,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.state.key())
            .field("token", &self.state.token())
            .field("validity", &self.validity())
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(client: Engine, state: Arc<LockState>) -> Self {
        Lock {
            client,
            state,
            runtime: tokio::runtime::Handle::try_current().ok(),
            task: Mutex::new(None),
            done: false,
        }
    }

    /// The user key.
    pub fn key(&self) -> &str {
        self.state.key()
    }

    /// This acquisition's value, as stored on the nodes: 32 hex digits (the acquisition's
    /// wall-clock time and 74 random bits, laid out as a UUIDv7: see
    /// [`HeldLock::acquired_at`](crate::HeldLock::acquired_at)), then `@` and the client's
    /// owner name when it set one
    /// ([`RedlockBuilder::owner`](crate::RedlockBuilder::owner)). Only the holder of this value
    /// can extend or release the lock, so treat it as a capability: give it, with
    /// [`key`](Self::key) and [`token`](Self::token), to the process that is to take the lock
    /// over, which then [`Redlock::resume`](crate::Redlock::resume)s it (see there, and the guide
    /// [`safety`](crate::guide::safety), "Handing a lock over").
    pub fn value(&self) -> &str {
        self.state.value()
    }

    /// The owner name this lock's value carries
    /// ([`RedlockBuilder::owner`](crate::RedlockBuilder::owner) of the client that acquired
    /// it), if any.
    pub fn owner(&self) -> Option<String> {
        crate::core::value::owner_of(self.state.value())
    }

    /// This acquisition's fencing token: greater than every earlier holder's (see
    /// [`FencingToken`] for the exact guarantee). Always 0 on a client built with
    /// [`fencing(false)`](crate::RedlockBuilder::fencing).
    pub fn token(&self) -> FencingToken {
        self.state.token()
    }

    /// The lease length: the ttl the lock was acquired with, or the ttl of the last successful
    /// [`extend`](Self::extend). Auto-extension extends to it.
    pub fn ttl(&self) -> Duration {
        self.state.ttl()
    }

    /// When the lock stops being valid unless extended, as a `std::time::Instant`.
    ///
    /// The deadline is kept on a clock that counts time spent suspended (see the type docs);
    /// `Instant` does not (on Linux), so the two drift apart by every suspend. The value is
    /// converted at the call: compare it with `Instant::now()` soon after, or use
    /// [`validity`](Self::validity) and [`is_lost`](Self::is_lost), which read the deadline
    /// clock itself.
    pub fn deadline(&self) -> std::time::Instant {
        self.state.deadline().to_std()
    }

    /// Validity left now (zero once the deadline has passed).
    pub fn validity(&self) -> Duration {
        self.state.deadline().remaining()
    }

    /// True once the lock is lost or its deadline has passed. Never goes from true back to
    /// false.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Why the lock was lost, once it was (`None` while held, and after a normal release).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state.reason()
    }

    /// A future that resolves when the lock is lost (see the type docs). It needs no background
    /// task: the deadline is watched by the future itself.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe; it only waits.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let state = Arc::clone(&self.state);
        async move { state.wait_lost().await }
    }

    /// A token cancelled when the lock is lost, for `tokio::select!` or
    /// `CancellationToken::run_until_cancelled` in code that cannot hold the guard. Starts a small
    /// watcher task for the deadline if [`keep_alive`](Self::keep_alive) is not running.
    ///
    /// Outside a tokio runtime no watcher can run: the token then fires only on release, drop or
    /// a failed [`extend`](Self::extend); [`lost`](Self::lost) and [`is_lost`](Self::is_lost)
    /// still see the deadline.
    pub fn lost_token(&self) -> CancellationToken {
        let mut task = lock(&self.task);
        if task.is_none() {
            *task = lease::spawn(self.client.clone(), Arc::clone(&self.state), None);
        }
        self.state.lost_signal().clone()
    }

    /// Extends the lock to `ttl` from now on a quorum of nodes; returns the new validity. The
    /// deadline becomes the one this round earned, earlier than before if `ttl` is shorter than
    /// what was left, and `ttl` becomes the lease length [`keep_alive`](Self::keep_alive) uses.
    ///
    /// The round waits no longer than the lock's current deadline, and sends nothing after it:
    /// `Ok` means a quorum extended the lock before it expired, so it was held without a gap.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the deadline already passed, passed before a quorum answered
    /// ([`LostReason::Expired`]), or a quorum no longer holds our value (the lost signal fires); [`Error::NoQuorum`] when too few nodes answered (the lock stays
    /// valid until its current deadline, or until `now + ttl - drift` if that is earlier: the
    /// nodes that did answer now expire it sooner); [`Error::ValidityExpired`] when the round was
    /// too slow.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe. A dropped extension may still reach some nodes, so the deadline is first
    /// lowered to what a shorter `ttl` would leave; it is never raised by a dropped round.
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        let (client, state) = (self.client.clone(), Arc::clone(&self.state));
        self.client
            .on_io_thread(async move { client.extend_held(&state, ttl).await })
            .await
    }

    /// Starts extending the lock automatically every `ttl / 3` until it is released, dropped or
    /// lost. See [`keep_alive_every`](Self::keep_alive_every).
    pub fn keep_alive(&self) {
        self.keep_alive_every(self.state.ttl() / 3);
    }

    /// Starts extending the lock automatically (to its [`ttl`](Self::ttl)) every `interval`,
    /// clamped to at most half the ttl. An extension round that cannot reach a quorum is retried
    /// after the configured random pause for as long as validity remains; the lost signal fires
    /// when a quorum says the value is no longer ours, or when the deadline passes without a
    /// successful extension (even if no node ever answers).
    ///
    /// Needs a tokio runtime; outside one it logs a warning and does nothing (the lock then
    /// expires at its deadline).
    pub fn keep_alive_every(&self, interval: Duration) {
        let interval = interval
            .min(self.state.ttl() / 2)
            .max(Duration::from_millis(1));
        let mut task = lock(&self.task);
        *task = lease::spawn(self.client.clone(), Arc::clone(&self.state), Some(interval));
    }

    /// Releases the lock on every node (only where it still holds our value).
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when a quorum no longer held our value (it had expired: the work done
    /// under it may have overlapped with another holder; fencing tokens catch that);
    /// [`Error::NoQuorum`] when too few nodes answered (the rest expires with the ttl).
    ///
    /// [`Error::Lost`] with [`LostReason::Expired`] when the deadline had passed before the
    /// release (the key is still removed where it is ours).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: if dropped midway, the guard's Drop sends the release in the background.
    pub async fn release(mut self) -> Result<(), Error> {
        self.state.mark_released();
        self.stop_task();
        let (client, state) = (self.client.clone(), Arc::clone(&self.state));
        let result = self
            .client
            .on_io_thread(async move { client.release_held(&state).await })
            .await;
        self.done = true;
        self.state.lost_signal().cancel();
        result
    }

    /// Stops any auto-extension and leaves the lock to expire with its ttl, without releasing it:
    /// for "at most once per period" jobs.
    pub fn forget(mut self) {
        self.stop_task();
        self.done = true;
    }

    fn stop_task(&self) {
        lock(&self.task).take();
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.done {
            self.state.mark_released();
            self.stop_task();
            // Outside a runtime, the release goes to the one the lock was acquired on.
            let _entered = match (tokio::runtime::Handle::try_current(), &self.runtime) {
                (Err(_), Some(runtime)) => Some(runtime.enter()),
                _ => None,
            };
            self.client.release_in_background(Arc::clone(&self.state));
            self.state.lost_signal().cancel();
        } else {
            self.stop_task();
        }
    }
}
