//! Release: of a held lock (quorum verdict, the outcome after a loss), and in the background
//! (dropped guards, failed or cancelled attempts), always through the one RELEASE script.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;
use tracing::instrument::WithSubscriber;

use super::Engine;
use super::patience::patiently;
use super::state::LockState;
use crate::core::clock;
use crate::core::keys::LockKeys;
use crate::core::quorum::Verdict;
use crate::error::{Error, LostReason};
use crate::node::scripts::{self, ScriptCall};
use crate::node::{HoldOut, Op, Ungated};

impl Engine {
    /// Releases a held lock on every node; returns once a quorum has answered (the remaining
    /// releases finish in the background). Waits for an extension round in flight, so that no
    /// extension can follow the release on any node.
    ///
    /// It runs in a `quorumlock.release` span (key, token, outcome); the unanswered calls it
    /// leaves to a task run in the caller's span.
    pub(crate) async fn release_held(&self, state: &LockState) -> Result<(), Error> {
        let caller = tracing::Span::current();
        let span = tracing::info_span!(
            "quorumlock.release",
            key = state.key(),
            token = state.token().get(),
            outcome = Empty,
        );
        let outcome = super::SpanOutcome::new(&span);
        let result = self.release_round(state, &caller).instrument(span).await;
        outcome.finish(&result, "released");
        result
    }

    /// The round of [`release_held`](Self::release_held); what it leaves to a task runs in
    /// `caller`'s span.
    async fn release_round(&self, state: &LockState, caller: &tracing::Span) -> Result<(), Error> {
        let _serial = state.serial().await;
        // After the acquisition's own calls on every node, and not to the nodes it never
        // reached (`LockState::stop_handing`).
        let never_sent = state.stop_handing(self.node_count()).await;
        let expired = state.deadline() <= clock::now();
        // Lost before the release (its signal fired): that is what the release reports.
        let lost = state.reason();
        let call = release_call(state, self.inner.cfg.keys.is_compat());
        // Before the round: its notices may arrive before its answers.
        self.inner
            .waiting
            .released_by_us(state.lock_key(), state.value());
        let now = Instant::now();
        // Each call waits while its node works through this client's earlier calls, until the
        // key has expired on its own at the latest (`patience.rs`).
        let deadline = now + self.inner.cfg.node_timeout;
        let cap = now + state.ttl();
        // Deleted (1) or absent (0) both leave nothing of ours; only another owner's value
        // (-1) is a refusal (`round::round_rule`).
        let round = self
            .round(
                Arc::new(call),
                deadline,
                cap,
                None,
                Op::Release,
                &never_sent,
            )
            .await;
        // The unanswered releases must reach their nodes: dropped, a queued command may be
        // skipped by its connection, and the key would outlive the release by up to a ttl.
        self.settle(round.rest, false, caller);
        // The acquisition's own late calls: queued before the release on each connection.
        if let Some(tail) = state.take_tail() {
            self.settle(tail, false, caller);
        }
        let key = state.key();
        match round.verdict {
            Verdict::Refused => {
                let reason = LostReason::NotOwner {
                    owned: round.yes.iter().filter(|&&(_, v)| v == 1).count(),
                    needed: self.quorum(),
                };
                tracing::debug!(key, %reason, "released a lock that was already lost");
                Err(state.lose(reason))
            }
            // The lost signal had fired: that is what the release reports, whether or not a
            // quorum answered it (the docs promise `Lost` after `lost()`, not `NoQuorum`).
            _ if lost.is_some() => {
                let reason = lost.unwrap_or(LostReason::Expired);
                tracing::debug!(key, %reason, released = round.tally.yes(), "released a lock already lost");
                Err(Error::Lost {
                    key: key.to_owned(),
                    reason,
                })
            }
            // Released where it was still ours, but the holder outlived its validity: the work
            // done under it may have overlapped with another holder's.
            Verdict::Quorum | Verdict::Unreachable if expired => {
                Err(state.lose(LostReason::Expired))
            }
            // Our value was absent on more nodes than a quorum spares (lost with a node's data,
            // deleted behind our back): it did not stand on a quorum, whatever was deleted.
            Verdict::Quorum
                if round.yes.iter().filter(|&&(_, v)| v == 0).count()
                    > self.node_count() - self.quorum() =>
            {
                let reason = LostReason::NotOwner {
                    owned: round.yes.iter().filter(|&&(_, v)| v == 1).count(),
                    needed: self.quorum(),
                };
                tracing::debug!(key, %reason, "released a lock whose value was gone from a quorum");
                Err(state.lose(reason))
            }
            Verdict::Quorum => {
                tracing::debug!(key, released = round.tally.yes(), "lock released");
                Ok(())
            }
            Verdict::Unreachable => Err(self.no_quorum(key, &round.tally, round.failures)),
        }
    }

    /// Releases a held lock in the background (a dropped guard), after any extension round in
    /// flight. The task runs in a `quorumlock.release` span (key, token, `background = true`),
    /// a child of the span current at the call (where the guard was dropped).
    pub(crate) fn release_in_background(&self, state: Arc<LockState>) {
        let client = self.clone();
        let key = state.lock_key().to_owned();
        let span = tracing::info_span!(
            "quorumlock.release",
            key = state.key(),
            token = state.token().get(),
            background = true,
        );
        let task_span = span.clone();
        let release = async move {
            let _serial = state.serial().await;
            let never_sent = state.stop_handing(client.node_count()).await;
            let call = Arc::new(release_call(&state, client.inner.cfg.keys.is_compat()));
            client.release_with(call, &never_sent, state.ttl()).await;
            if let Some(tail) = state.take_tail() {
                client.settle(tail, false, &task_span);
            }
        };
        self.spawn_release_task(&key, release, span);
    }

    /// Runs a background release in `span`, on the client's I/O thread when it has one, else on
    /// the current tokio runtime; without either, the ttl cleans up.
    pub(super) fn spawn_release_task(
        &self,
        lock_key: &str,
        release: impl Future<Output = ()> + Send + 'static,
        span: tracing::Span,
    ) {
        let Some(handle) = self.task_runtime() else {
            tracing::debug!(
                lock_key,
                "no runtime to release in; the ttl will expire the key"
            );
            return;
        };
        self.inner
            .tasks
            .spawn_on(release.instrument(span).with_current_subscriber(), &handle);
    }

    /// The undo of a failed attempt: a release of `value` (no token: the call names no counter)
    /// on every node except those `skip` marks (the nodes that answered that another value
    /// holds the key: ours is not there), each waiting for its node as
    /// [`release_with`](Self::release_with) says, at most `ttl` (the attempt's). Built
    /// before it is awaited, so the caller's borrows end here. (`keys`' counter is not sent: an
    /// undo raises no counter.)
    ///
    /// It announces itself to waiters only when `notify`: the attempt's value stood on a quorum
    /// (its round won, then failed: no validity left, or its counters could not be raised), so
    /// it held others off. An undo of a round that did not win releases nothing anyone waits
    /// for, and its notice would wake every waiter, its own client's included, as if the lock
    /// had been released: a waiter whose `SET` succeeded on a node the holder's key had left
    /// was woken by its own undo and tried again at once, for the whole hold.
    pub(super) fn release_on(
        &self,
        keys: &LockKeys,
        value: &str,
        skip: &[bool],
        notify: bool,
        ttl: std::time::Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        // Compat mode has no waiters marker (its waiters poll); without the waiters count
        // (KEYS[2]) the script publishes nothing.
        let lock_key = keys.lock();
        let call = Arc::new(if notify && !self.inner.cfg.keys.is_compat() {
            scripts::RELEASE.call(
                &[lock_key.as_bytes(), keys.waiters_count().as_bytes()],
                &[value.as_bytes()],
            )
        } else {
            bare_release(lock_key, value)
        });
        self.release_with(call, skip, ttl)
    }

    /// Sends a release call to every node but those `skip` marks. Each waits a node timeout at
    /// a time while its node answers this client's earlier calls, for `ttl` from now at most
    /// (every key of ours has expired by then), and is given up when its node answers nothing
    /// for a whole node timeout (`patience.rs`); a call given up (or failed) is counted for the
    /// next `flush`'s report.
    fn release_with(
        &self,
        call: Arc<ScriptCall>,
        skip: &[bool],
        ttl: std::time::Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let window = self.inner.cfg.node_timeout;
        let cap = Instant::now() + ttl;
        let client = self.clone();
        let calls: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .filter(|&(i, _)| !skip.get(i).copied().unwrap_or(false))
            .map(|(_, n)| {
                let node = Arc::clone(n);
                let call =
                    Arc::clone(n).call(Arc::clone(&call), HoldOut::Ignore, Op::Release, Ungated);
                let call = async move {
                    let Ok(reply) = call.await;
                    reply
                };
                async move { patiently(&node, call, Op::Release, window, cap).await }
            })
            .collect();
        calls.for_each(move |reply| {
            if reply.is_err() {
                client.count_undelivered_calls(1);
            }
            async {}
        })
    }
}

/// The RELEASE script given the lock key and our value only: it compares and deletes that key
/// and touches nothing else, as other Redlock clients' releases do. The release in compat mode
/// (an ACL limited to the resource key is enough, and on a Redis Cluster member the call stays
/// in the key's slot; no notice is published: compat mode has no waiters marker, and its
/// waiters poll), and the undo of an attempt that did not win.
fn bare_release(lock_key: &str, value: &str) -> ScriptCall {
    scripts::RELEASE.call(&[lock_key.as_bytes()], &[value.as_bytes()])
}

/// The release of a held lock: the RELEASE script with the lock's token and counter, so that
/// every node's counter ends at or above it, and, on the nodes whose counter was seen at the
/// token on the connection the release runs on ([`LockState::seen`]), the same script without
/// them, which skips that raise (it would find the counter there already: `docs/safety.md`,
/// "Release raises counters everywhere"). With fencing off (token 0) every node gets the form
/// without them. All name the waiters count, to publish a notice when someone waits.
///
/// In compat mode the call names the lock key only (see [`bare_release`]).
fn release_call(state: &LockState, compat: bool) -> ScriptCall {
    if compat {
        return bare_release(state.lock_key(), state.value());
    }
    let keys: [&[u8]; 3] = [
        state.lock_key().as_bytes(),
        state.waiters_count_key().as_bytes(),
        state.fence_key().as_bytes(),
    ];
    let value = state.value().as_bytes();
    // Fencing off (token 0): no counter to raise anywhere.
    if state.token().get() == 0 {
        return scripts::RELEASE.call(&keys[..2], &[value]);
    }
    let call = scripts::RELEASE.call(
        &keys,
        &[
            value,
            itoa::Buffer::new().format(state.token().get()).as_bytes(),
        ],
    );
    call.with_lean(&state.seen(), || {
        scripts::RELEASE.call(&keys[..2], &[value])
    })
}
