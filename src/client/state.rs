//! The state of one held lock, shared by its guard, its lease task and any watcher: identity
//! (key, value, token), the validity deadline on the deadline clock, the lost signal and its
//! reason, and the lock that serialises extensions with the release.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::core::clock::{self, Stamp};
use crate::core::keys::LockKeys;
use crate::core::lock;
use crate::core::token::FencingToken;
use crate::error::{Error, LostReason};
use crate::metrics;

/// Shared state of one held lock (the guard, its lease task and any watcher).
#[derive(Debug)]
pub(crate) struct LockState {
    /// The user key and its Redis keys, in one buffer.
    keys: LockKeys,
    value: String,
    token: FencingToken,
    /// The lease length: the ttl of the acquisition, or of the last successful extension.
    ttl: Mutex<Duration>,
    /// On the deadline clock (`CLOCK_BOOTTIME` where there is one: see `crate::clock`).
    deadline: Mutex<Stamp>,
    lost: CancellationToken,
    reason: Mutex<Option<LostReason>>,
    released: AtomicBool,
    /// Held for a whole extension round and by the release: no extension is sent after (or
    /// during) a release, so an extension can never re-set a key the release removed.
    serial: tokio::sync::Mutex<()>,
}

impl LockState {
    pub(crate) fn new(
        keys: LockKeys,
        value: String,
        token: FencingToken,
        ttl: Duration,
        deadline: Stamp,
    ) -> Self {
        LockState {
            keys,
            value,
            token,
            ttl: Mutex::new(ttl),
            deadline: Mutex::new(deadline),
            lost: CancellationToken::new(),
            reason: Mutex::new(None),
            released: AtomicBool::new(false),
            serial: tokio::sync::Mutex::new(()),
        }
    }

    /// The signal cancelled when the lock is lost, released or dropped.
    pub(crate) fn lost_signal(&self) -> &CancellationToken {
        &self.lost
    }

    pub(crate) fn key(&self) -> &str {
        self.keys.key()
    }
    pub(crate) fn lock_key(&self) -> &str {
        self.keys.lock()
    }
    pub(crate) fn fence_key(&self) -> &str {
        self.keys.fence()
    }
    /// The lock's waiters marker (see `client/wait.rs`).
    pub(crate) fn waiters_key(&self) -> &str {
        self.keys.waiters()
    }
    pub(crate) fn value(&self) -> &str {
        &self.value
    }
    pub(crate) fn token(&self) -> FencingToken {
        self.token
    }
    pub(crate) fn ttl(&self) -> Duration {
        *lock(&self.ttl)
    }

    pub(crate) fn set_ttl(&self, ttl: Duration) {
        *lock(&self.ttl) = ttl;
    }

    /// Serialises extension rounds and the release of this lock (see the field's docs).
    pub(crate) async fn serial(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.serial.lock().await
    }

    /// Set before any release of the lock is sent (explicit release or Drop).
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    pub(crate) fn deadline(&self) -> Stamp {
        *lock(&self.deadline)
    }

    /// True once the lock is lost or its deadline has passed.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.deadline() <= clock::now()
    }

    /// Sets the deadline a successful extension round earned, unless the lock is already lost
    /// or its current deadline has passed: a lock seen lost never becomes valid again. Rounds
    /// are serialised, so the last one to succeed is the last one applied on its quorum.
    /// Returns whether the deadline was set; when not, the lock is marked lost.
    #[must_use]
    pub(crate) fn set_deadline(&self, deadline: Stamp) -> bool {
        {
            let mut d = lock(&self.deadline);
            if !self.lost.is_cancelled() && clock::now() < *d {
                *d = deadline;
                return true;
            }
        }
        self.lose(LostReason::Expired);
        false
    }

    /// Moves the deadline back to `bound` if it is later: an extension to a shorter ttl cuts the
    /// key's time on every node that applies it, whether or not its round succeeds.
    pub(crate) fn lower_deadline(&self, bound: Stamp) {
        let mut d = lock(&self.deadline);
        if bound < *d {
            *d = bound;
        }
    }

    /// Marks the lock lost (first reason wins), fires the signal and returns the error to report.
    pub(crate) fn lose(&self, reason: LostReason) -> Error {
        {
            let mut r = lock(&self.reason);
            if r.is_none() && !self.lost.is_cancelled() {
                *r = Some(reason.clone());
                metrics::lock_lost();
                tracing::warn!(key = %self.key(), token = %self.token, %reason, "lock lost");
            }
        }
        self.lost.cancel();
        Error::Lost {
            key: self.key().to_owned(),
            reason,
        }
    }

    pub(crate) fn reason(&self) -> Option<LostReason> {
        lock(&self.reason).clone()
    }

    /// Resolves when the lock is lost: the signal fired, or the deadline passed unextended.
    ///
    /// Sleeps on tokio's clock, which stops during a suspend, at most `clock::SLICE` at a time,
    /// re-reading the deadline clock on every wake: a deadline that passed while the machine
    /// was suspended is noticed within `SLICE` of the resume.
    pub(crate) async fn wait_lost(&self) {
        loop {
            if self.deadline() <= clock::now() {
                self.lose(LostReason::Expired);
                return;
            }
            let wake = self.deadline().next_wake();
            tokio::select! {
                _ = self.lost.cancelled() => return,
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}
