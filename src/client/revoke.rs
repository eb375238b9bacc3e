//! Revoking a held lock from outside (an operator's `redlock break`): [`Redlock::revoke`](crate::Redlock::revoke),
//! [`Redlock::revoke_value`](crate::Redlock::revoke_value) and [`Revocation`].
//!
//! The rule it keeps: the fencing counter is raised on a quorum *past* the holder's token
//! before the holder's value is deleted on that node (one script per node), so from the
//! moment the key is gone on a quorum no resource that checks the counter accepts the old
//! token, and the holder's next extension is refused (its key is absent and the counter is
//! above its token: `scripts::EXTEND` does not re-set it).

use std::sync::Arc;

use tokio::time::Instant;

use super::Engine;
use crate::core::keys;
use crate::core::quorum::HolderView;
use crate::core::token::FencingToken;
use crate::error::{ConfigError, Error, NodeFailure};
use crate::node::scripts;
use crate::node::{HoldOut, Op};

/// What [`Redlock::revoke`](crate::Redlock::revoke) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revocation {
    /// The user key.
    pub key: String,
    /// The value revoked: the holder's on a quorum, or the one asked for
    /// ([`Redlock::revoke_value`](crate::Redlock::revoke_value)). `None` when nobody held the key on a quorum: nothing was
    /// done.
    pub value: Option<String>,
    /// The owner name that value carries, if its client set one.
    pub owner: Option<String>,
    /// The token the counters were raised to on a quorum: above every token handed out for the
    /// key before the revoke. Claim it at a resource ([`fenced_claim`](crate::fenced_claim))
    /// to shut the old holder out there at once. 0 when nothing was done.
    pub token: FencingToken,
    /// On how many nodes the value was deleted.
    pub deleted: usize,
    /// How many nodes raised their counter (at least a quorum when `value` is set).
    pub raised: usize,
}

impl Revocation {
    /// Whether a holder's value was deleted somewhere (`false`: nothing held it).
    pub fn revoked(&self) -> bool {
        self.value.is_some() && self.deleted > 0
    }
}

impl Engine {
    /// The engine side of [`Redlock::revoke`](crate::Redlock::revoke).
    pub(crate) async fn revoke(&self, key: &str) -> Result<Revocation, Error> {
        let (client, key) = (self.clone(), key.to_owned());
        self.on_io_thread(async move { client.revoke_inline(&key, None).await })
            .await
    }

    /// The engine side of [`Redlock::revoke_value`](crate::Redlock::revoke_value).
    pub(crate) async fn revoke_value(&self, key: &str, value: &str) -> Result<Revocation, Error> {
        crate::core::value::check_value(value)?;
        let (client, key, value) = (self.clone(), key.to_owned(), value.to_owned());
        self.on_io_thread(async move { client.revoke_inline(&key, Some(value)).await })
            .await
    }

    async fn revoke_inline(&self, key: &str, value: Option<String>) -> Result<Revocation, Error> {
        if !self.fencing() {
            return Err(ConfigError::FencingRequired.into());
        }
        let status = self.status_inline(key).await?;
        status.require_quorum()?;
        let value = match (value, status.holder_view()) {
            (Some(v), _) => v,
            (None, HolderView::Held(v)) => v.to_owned(),
            (None, HolderView::Vacant | HolderView::Unknown) => {
                return Ok(Revocation {
                    key: key.to_owned(),
                    value: None,
                    owner: None,
                    token: FencingToken::new(0),
                    deleted: 0,
                    raised: 0,
                });
            }
        };
        // Every quorum meets the quorum the holder raised to its token: the highest counter of
        // this read is at or above it.
        let token = FencingToken::new(status.max_fence().get() + 1);
        let lock_keys = self.keys().lock_keys(key);
        let marker = keys::revoked_key_of(lock_keys.lock());
        let digits = token.get().to_string();
        // Through each node's script path: `EVALSHA`, and on `NOSCRIPT` (the revoke is not
        // loaded on connect) `EVAL` with the body; a Cluster member routes it by its keys.
        let call = Arc::new(scripts::REVOKE.call(
            &[
                lock_keys.lock().as_bytes(),
                lock_keys.fence().as_bytes(),
                lock_keys.waiters().as_bytes(),
                marker.as_bytes(),
            ],
            &[value.as_bytes(), digits.as_bytes()],
        ));
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let replies = futures::future::join_all(self.inner.nodes.iter().map(|n| {
            Arc::clone(n).run(Arc::clone(&call), deadline, HoldOut::Respect, Op::Release)
        }))
        .await;
        let raised = replies.iter().filter(|r| r.is_ok()).count();
        let deleted = replies
            .iter()
            .filter(|r| matches!(r, Ok(redis::Value::Int(1))))
            .count();
        let failures: Vec<NodeFailure> = self
            .inner
            .nodes
            .iter()
            .zip(&replies)
            .filter_map(|(n, r)| {
                r.as_ref().err().map(|cause| NodeFailure {
                    node: n.name().to_owned(),
                    cause: cause.clone(),
                })
            })
            .collect();
        crate::metrics::revoke(deleted > 0);
        tracing::warn!(key, value, %token, raised, deleted, "lock revoked");
        if raised < self.quorum() {
            return Err(Error::no_quorum(
                key,
                raised,
                self.node_count(),
                self.quorum(),
                failures,
            ));
        }
        Ok(Revocation {
            key: key.to_owned(),
            owner: crate::core::value::owner_of(&value),
            value: Some(value),
            token,
            deleted,
            raised,
        })
    }

    /// Whether `value`'s loss of `lock_key` came from a revoke: its marker holds the value on
    /// some node that answers within the node timeout.
    pub(super) async fn was_revoked(&self, lock_key: &str, value: &str) -> bool {
        let marker = keys::revoked_key_of(lock_key);
        // The status script on the marker alone: `{value, pttl, 0}`.
        let call = Arc::new(scripts::STATUS.call(&[marker.as_bytes()], &[]));
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let replies =
            futures::future::join_all(self.inner.nodes.iter().map(|n| {
                Arc::clone(n).run(Arc::clone(&call), deadline, HoldOut::Ignore, Op::Status)
            }))
            .await;
        replies.iter().any(|r| match r {
            Ok(redis::Value::Array(items)) => {
                matches!(items.first(), Some(redis::Value::BulkString(b)) if b == value.as_bytes())
            }
            _ => false,
        })
    }
}
