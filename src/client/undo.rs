//! The undo of an acquisition attempt: a guard armed before a round's first await that
//! releases the attempt's value on every node when the round failed or the caller dropped the
//! acquisition midway (`client/acquire.rs`).

use std::time::Duration;

use super::Engine;
use super::tail::Tail;
use crate::core::keys::LockKeys;
use crate::core::quorum;
use crate::error::NodeError;

/// Releases an attempt's value everywhere when dropped, unless disarmed: covers both a failed
/// round and a caller that drops the acquire future midway. Nodes that answered that another
/// value holds the key (`skip`) are spared: our value is not there. A node that timed out or
/// failed is not spared: it may have set our value all the same.
pub(super) struct UndoRelease<'a> {
    client: &'a Engine,
    /// The span current when the acquisition was called: the undo's task runs in it.
    caller: &'a tracing::Span,
    keys: &'a LockKeys,
    value: &'a str,
    /// The attempt's ttl: no key of its value outlives it, so no undo call waits longer.
    ttl: Duration,
    armed: bool,
    pub(super) skip: Vec<bool>,
    /// The nodes that answered that they set the attempt's value ([`release_set`]).
    ///
    /// [`release_set`]: Self::release_set
    pub(super) set_on: Vec<usize>,
    /// Whether the attempt's value stood on a quorum: only then does the undo announce itself
    /// to waiters (`quorum::undo_announces`).
    pub(super) stood: bool,
    /// A refused round's unanswered calls: the undo waits for their answers (bounded by the
    /// round's deadline) and skips the nodes among them that refused too.
    pub(super) tail: Option<Tail>,
}

impl<'a> UndoRelease<'a> {
    pub(super) fn arm(
        client: &'a Engine,
        keys: &'a LockKeys,
        value: &'a str,
        ttl: Duration,
        caller: &'a tracing::Span,
    ) -> Self {
        UndoRelease {
            client,
            caller,
            keys,
            value,
            ttl,
            armed: true,
            skip: Vec::new(),
            set_on: Vec::new(),
            stood: false,
            tail: None,
        }
    }

    pub(super) fn disarm(mut self) {
        self.armed = false;
    }

    /// Releases the attempt's value now, awaited and without announcing it, on the nodes that
    /// answered that they set it (they answered: no hung node among them), which the rest of
    /// the undo then spares. An attempt that stood on a quorum is left whole to the undo (it
    /// announces its release).
    pub(super) async fn release_set(&mut self) {
        if self.stood || self.set_on.is_empty() {
            return;
        }
        let n = self.client.inner.nodes.len();
        let mut others = vec![true; n];
        for &i in &self.set_on {
            others[i] = false;
        }
        self.client
            .release_on(self.keys, self.value, &others, false, self.ttl)
            .await;
        self.skip.resize(n, false);
        for i in std::mem::take(&mut self.set_on) {
            self.skip[i] = true;
        }
    }
}

impl Drop for UndoRelease<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let n = self.client.inner.nodes.len();
        let mut skip = std::mem::take(&mut self.skip);
        skip.resize(n, false);
        let Some(tail) = self.tail.take() else {
            if !skip.iter().all(|&s| s) {
                let release = self.client.release_on(
                    self.keys,
                    self.value,
                    &skip,
                    quorum::undo_announces(self.stood),
                    self.ttl,
                );
                self.client
                    .spawn_release_task(self.keys.lock(), release, self.caller.clone());
            }
            return;
        };
        let client = self.client.clone();
        let notify = quorum::undo_announces(self.stood);
        let (keys, value, ttl) = (self.keys.clone(), self.value.to_owned(), self.ttl);
        // The nodes that answered by the verdict are released at once; those still owing an
        // answer once they give it (unless they refused), or at the round's deadline. Waiting
        // for every answer first left our value standing where it was set for as long as a hung
        // node took to time out (lock t28). (A round with a tail was refused: its undo
        // announces nothing, so the two parts cannot both notify.) Each part skips what the
        // other releases.
        let at_once: Vec<bool> = (0..n)
            .map(|i| skip[i] || !tail.answered_by_verdict(i))
            .collect();
        let mut later: Vec<bool> = (0..n)
            .map(|i| skip[i] || tail.answered_by_verdict(i))
            .collect();
        let release = async move {
            let first = async {
                if !at_once.iter().all(|&s| s) {
                    client
                        .release_on(&keys, &value, &at_once, notify, ttl)
                        .await;
                }
            };
            let rest = async {
                for (i, reply) in tail.answers().await {
                    if refused(&reply) {
                        later[i] = true;
                    }
                }
                if !later.iter().all(|&s| s) {
                    client.release_on(&keys, &value, &later, notify, ttl).await;
                }
            };
            futures::join!(first, rest);
        };
        self.client
            .spawn_release_task(self.keys.lock(), release, self.caller.clone());
    }
}

/// Whether an acquire call's reply says that our value was not set: another value holds the
/// key (the script names it; a plain `SET NX` answers nil), or the script found the key gone
/// (`0`).
fn refused(reply: &Result<redis::Value, NodeError>) -> bool {
    matches!(
        reply,
        Ok(redis::Value::BulkString(_) | redis::Value::Nil | redis::Value::Int(0))
    )
}
