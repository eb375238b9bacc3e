//! The state of one held lock, shared by its guard, its lease task and any watcher: identity
//! (key, value, token), the validity deadline on the deadline clock, the lost signal and its
//! reason, the lock that serialises extensions with the release, and the late answers of the
//! round that won it (a [`WonTail`], `tail.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::tail::{Tail, WonTail};
use crate::core::clock::{self, Stamp};
use crate::core::keys::LockKeys;
use crate::core::lock;
use crate::core::token::FencingToken;
use crate::error::{Error, LostReason, NodeError, NodeFailure};
use crate::metrics;
use crate::node::{Node, RoundGate};

/// Per node, the connection generation on which the node's fencing counter was seen at or
/// above the lock's token (its `INCR` in the winning round returned the token or more, before
/// the verdict or late); `0` where nothing is known (the node refused, failed, was raised, is
/// not one plain server, or fencing is off). While that connection lives the counter stays
/// there (counters never decrease while the server process lives), so the release and
/// extensions skip raising it on that node (`ScriptCall::with_lean`).
pub(crate) type Seen = smallvec::SmallVec<[u64; 8]>;

/// Where a lock's counter was seen at its token: the connection generations taken before the
/// winning round (`Node::process_generation`), and which nodes answered that round with the
/// token or more (one bit per node; a late answer sets its bit after the grant).
#[derive(Debug)]
pub(crate) struct SeenAt {
    generations: Seen,
    at_token: AtomicU64,
}

impl SeenAt {
    /// The generations of a round, and the nodes whose answer in it carried the token.
    pub(crate) fn new(generations: Seen, at_token: impl IntoIterator<Item = usize>) -> Self {
        let seen = SeenAt {
            generations,
            at_token: AtomicU64::new(0),
        };
        for i in at_token {
            seen.mark(i);
        }
        seen
    }

    /// Whether an acquire answer's counter (its `INCR`'s reply) shows the node's counter at
    /// `token` or above: the one rule for the answers read at the verdict and the late ones.
    pub(crate) fn shows(counter: i64, token: FencingToken) -> bool {
        counter > 0 && FencingToken::of_counter(counter) >= token
    }

    /// Node `i` answered the round with the token or more.
    pub(crate) fn mark(&self, i: usize) {
        if i < 64 && i < self.generations.len() {
            self.at_token.fetch_or(1 << i, Ordering::Relaxed);
        }
    }

    /// The [`Seen`] of now.
    fn get(&self) -> Seen {
        let bits = self.at_token.load(Ordering::Relaxed);
        self.generations
            .iter()
            .enumerate()
            .map(|(i, &g)| if i < 64 && bits & (1 << i) != 0 { g } else { 0 })
            .collect()
    }
}

/// Shared state of one held lock (the guard, its lease task and any watcher).
///
/// # Invariants
///
/// - **Lost implies the deadline never moves forward.** Only [`set_deadline`] moves it later,
///   and it does so only under the lease's lock while no reason is recorded, the `lost` signal
///   has not fired and the current deadline has not passed; [`lose`] records the reason under
///   that same lock before it fires the signal. A lock seen lost (or past its deadline) never
///   becomes valid again; [`lower_deadline`] may still move it back.
/// - **Released implies no extension is sent after.** `released` is set before any release is
///   sent; a release is sent only while `serial` is held, and an extension round takes
///   `serial`, then checks `released`, before it sends anything. So an extension either
///   finishes before the release is sent, or sends nothing.
/// - **A lost or released lock stays so**: `reason` is set once (the first reason wins, none
///   after a release), `released` and the `lost` signal are never reset.
/// - **The winning round's late answers** keep [`WonTail`]'s invariants: extensions run after
///   the acquisition on every node, the release closes the round first, and every late
///   counter is read into `seen` before an extension or the release is built.
///
/// # Lock order
///
/// The std mutexes (`lease`, and the won tail's, `WonTail`) are never nested: each is taken,
/// read or written, and let go before another is taken, and none is held across an `await`, a
/// log line or a metric. `serial` (tokio's) is taken first, and held across a whole extension
/// round or release, during which the others are taken and let go as above.
///
/// [`set_deadline`]: Self::set_deadline
/// [`lose`]: Self::lose
/// [`lower_deadline`]: Self::lower_deadline
#[derive(Debug)]
pub(crate) struct LockState {
    /// The user key and its Redis keys, in one buffer.
    keys: LockKeys,
    value: String,
    token: FencingToken,
    seen: SeenAt,
    /// The lease: its length, deadline, and why it was lost (see the invariants above).
    lease: Mutex<Lease>,
    /// Fired when the lock is lost, released or dropped.
    lost: CancellationToken,
    released: AtomicBool,
    /// The late answers of the round that won the lock: read when the release or an extension
    /// is built (where else the counter stands at the token), handed to the client's parked
    /// list by the release.
    won: WonTail,
    /// Held for a whole extension round and by the release: no extension is sent after (or
    /// during) a release, so an extension can never re-set a key the release removed.
    serial: tokio::sync::Mutex<()>,
    /// Whether this lock's metrics carry its name (`RedlockBuilder::metrics_lock_label`).
    labelled: bool,
    /// Its share of the locks-held gauge and its hold time: from the grant to the release,
    /// the loss or the drop, whichever comes first.
    held: metrics::Held,
}

/// A held lock's lease, behind [`LockState`]'s one lease lock.
#[derive(Debug)]
struct Lease {
    /// The lease length: the ttl of the acquisition, or of the last successful extension.
    ttl: Duration,
    /// On the deadline clock (`CLOCK_BOOTTIME` where there is one: see `crate::clock`).
    deadline: Stamp,
    /// Why the lock was lost; `None` while held and after a normal release.
    reason: Option<LostReason>,
    /// The failures of the last extension round, when a node's ACL refused it there, until an
    /// extension succeeds: a loss at the deadline then names them ([`LostReason::Unreachable`])
    /// rather than time alone.
    refused: Option<Vec<NodeFailure>>,
}

impl LockState {
    pub(crate) fn new(
        keys: LockKeys,
        value: String,
        token: FencingToken,
        seen: SeenAt,
        ttl: Duration,
        deadline: Stamp,
    ) -> Self {
        LockState {
            keys,
            value,
            token,
            seen,
            lease: Mutex::new(Lease {
                ttl,
                deadline,
                reason: None,
                refused: None,
            }),
            lost: CancellationToken::new(),
            released: AtomicBool::new(false),
            won: WonTail::default(),
            serial: tokio::sync::Mutex::new(()),
            labelled: false,
            held: metrics::Held::idle(),
        }
    }

    /// The gate of the round that won the lock.
    pub(crate) fn won_by(mut self, gate: RoundGate) -> Self {
        self.won = WonTail::won_by(gate);
        self
    }

    /// Gives this lock's metrics its name as a label when `on`
    /// (`RedlockBuilder::metrics_lock_label`).
    pub(crate) fn metrics_labelled(mut self, on: bool) -> Self {
        self.labelled = on;
        self.held = metrics::Held::start(on.then(|| self.key()));
        self
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
    /// The lock's waiters count (see `client/wait.rs`): what its release reads to know whether
    /// to publish.
    pub(crate) fn waiters_count_key(&self) -> &str {
        self.keys.waiters_count()
    }
    pub(crate) fn value(&self) -> &str {
        &self.value
    }
    pub(crate) fn token(&self) -> FencingToken {
        self.token
    }
    /// Where the counter was seen at the token, as of now (see [`Seen`]): the winning round's
    /// answers that have come since the grant are read first.
    pub(crate) fn seen(&self) -> Seen {
        self.won.collect(|i, counter| self.late_yes(i, counter));
        self.seen.get()
    }

    /// Takes the winning round's unanswered calls: kept, closed, until the release, after a
    /// handing task of theirs when some still wait for their connection (returned for
    /// [`hand_tail`](Self::hand_tail); see [`WonTail::keep_or_start`]).
    pub(crate) fn keep_or_start_handing(&self, tail: Tail, nodes: &[Arc<Node>]) -> Option<Tail> {
        self.won
            .keep_or_start(tail, nodes, |i, counter| self.late_yes(i, counter))
    }

    /// The handing task's work on the winning round's calls ([`WonTail::hand`]).
    pub(crate) async fn hand_tail(&self, tail: Tail) {
        self.won
            .hand(tail, |i, counter| self.late_yes(i, counter))
            .await;
    }

    /// Waits until the winning round's calls have been handed to their connections
    /// ([`WonTail::until_handed`]): a call sent next runs after the acquisition on its node.
    pub(crate) async fn until_handed(&self) {
        self.won.until_handed(self.key()).await;
    }

    /// Before the release: closes the winning round and returns the nodes where the
    /// acquisition was never sent ([`WonTail::stop_handing`]). `n`: how many nodes the client
    /// has.
    pub(crate) async fn stop_handing(&self, n: usize) -> smallvec::SmallVec<[bool; 8]> {
        self.won.stop_handing(n, self.key()).await
    }

    /// The winning round's calls still unanswered, for the client's parked list.
    pub(crate) fn take_tail(&self) -> Option<Tail> {
        self.won.take()
    }

    /// A late answer of the winning round: node `i` said yes with counter `counter`.
    fn late_yes(&self, i: usize, counter: i64) {
        if SeenAt::shows(counter, self.token) {
            self.seen.mark(i);
        }
    }
    pub(crate) fn ttl(&self) -> Duration {
        lock(&self.lease).ttl
    }

    pub(crate) fn set_ttl(&self, ttl: Duration) {
        lock(&self.lease).ttl = ttl;
    }

    /// Serialises extension rounds and the release of this lock (see the field's docs).
    pub(crate) async fn serial(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.serial.lock().await
    }

    /// Set before any release of the lock is sent (explicit release or Drop).
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::SeqCst);
        self.held.end();
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    pub(crate) fn deadline(&self) -> Stamp {
        lock(&self.lease).deadline
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
            let mut lease = lock(&self.lease);
            if lease.reason.is_none() && !self.lost.is_cancelled() && clock::now() < lease.deadline
            {
                lease.deadline = deadline;
                return true;
            }
        }
        self.lose(LostReason::Expired);
        false
    }

    /// Moves the deadline back to `bound` if it is later: an extension to a shorter ttl cuts the
    /// key's time on every node that applies it, whether or not its round succeeds.
    pub(crate) fn lower_deadline(&self, bound: Stamp) {
        let mut lease = lock(&self.lease);
        if bound < lease.deadline {
            lease.deadline = bound;
        }
    }

    /// Records an extension round's outcome: its failures when a node's ACL refused the
    /// extension, nothing once one succeeded (see `refused`).
    pub(crate) fn note_extension(&self, extended: bool, failures: &[NodeFailure]) {
        let refused = failures
            .iter()
            .any(|f| matches!(f.cause, NodeError::Denied { .. }));
        lock(&self.lease).refused = (!extended && refused).then(|| failures.to_vec());
    }

    /// Marks the lock lost (first reason wins), fires the signal and returns the error to report.
    /// A loss at the deadline after an extension refused by a node's ACL names the refusal.
    pub(crate) fn lose(&self, reason: LostReason) -> Error {
        let (reason, first) = {
            let mut lease = lock(&self.lease);
            let reason = match reason {
                LostReason::Expired => match lease.refused.clone() {
                    Some(failures) => LostReason::Unreachable { failures },
                    None => LostReason::Expired,
                },
                other => other,
            };
            let first = lease.reason.is_none() && !self.lost.is_cancelled();
            if first {
                lease.reason = Some(reason.clone());
            }
            (reason, first)
        };
        if first {
            metrics::lock_lost(self.labelled.then(|| self.key()));
            self.held.end();
            tracing::warn!(key = %self.key(), token = %self.token, %reason, "lock lost");
        }
        self.lost.cancel();
        Error::Lost {
            key: self.key().to_owned(),
            reason,
        }
    }

    /// Why the lock was lost. A deadline that passed unextended is recorded here as
    /// [`LostReason::Expired`] when it is first seen, whether or not anything watched it (no
    /// keep-alive, no `lost()` future): `is_lost()` and this agree. `None` while held and after
    /// a normal release.
    pub(crate) fn reason(&self) -> Option<LostReason> {
        {
            let lease = lock(&self.lease);
            if lease.reason.is_some()
                || self.is_released()
                || self.lost.is_cancelled()
                || clock::now() < lease.deadline
            {
                return lease.reason.clone();
            }
        }
        self.lose(LostReason::Expired);
        lock(&self.lease).reason.clone()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::keys::KeyLayout;

    fn held_for(validity: Duration) -> LockState {
        LockState::new(
            KeyLayout::default().lock_keys("k"),
            "v".to_owned(),
            FencingToken::of_counter(1),
            SeenAt::new(Seen::new(), []),
            Duration::from_secs(30),
            clock::now().saturating_add(validity),
        )
    }

    #[test]
    fn a_lost_lock_never_moves_its_deadline_forward() {
        let state = held_for(Duration::from_secs(30));
        let before = state.deadline();
        let _ = state.lose(LostReason::Revoked);
        assert!(!state.set_deadline(before.saturating_add(Duration::from_secs(60))));
        assert_eq!(state.deadline(), before);
        assert!(state.is_lost());
        assert!(matches!(state.reason(), Some(LostReason::Revoked)));
    }

    #[test]
    fn a_deadline_that_passed_is_never_extended_and_reads_as_expired() {
        let state = held_for(Duration::ZERO);
        let before = state.deadline();
        assert!(!state.set_deadline(before.saturating_add(Duration::from_secs(60))));
        assert_eq!(state.deadline(), before);
        assert!(matches!(state.reason(), Some(LostReason::Expired)));
    }

    #[test]
    fn the_first_reason_wins_and_none_is_recorded_after_a_release() {
        let state = held_for(Duration::from_secs(30));
        let _ = state.lose(LostReason::Revoked);
        let _ = state.lose(LostReason::Expired);
        assert!(matches!(state.reason(), Some(LostReason::Revoked)));

        let released = held_for(Duration::ZERO);
        released.mark_released();
        released.lost_signal().cancel();
        let _ = released.lose(LostReason::Expired);
        assert!(released.reason().is_none());
    }

    #[test]
    fn a_held_lock_extends_and_may_always_move_back() {
        let state = held_for(Duration::from_secs(30));
        let later = state.deadline().saturating_add(Duration::from_secs(60));
        assert!(state.set_deadline(later));
        assert_eq!(state.deadline(), later);
        let sooner = clock::now().saturating_add(Duration::from_secs(1));
        state.lower_deadline(sooner);
        assert_eq!(state.deadline(), sooner);
        state.lower_deadline(later);
        assert_eq!(state.deadline(), sooner);
        assert!(state.reason().is_none());
    }
}
