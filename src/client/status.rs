//! Reading every node's view of a key: [`LockStatus`], [`NodeStatus`], [`KeyState`], and
//! [`Redlock::status`](crate::Redlock::status).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::Engine;
use crate::core::quorum::{self, HolderView};
use crate::core::token::FencingToken;
use crate::error::{Error, NodeError, NodeFailure};
use crate::eviction::EvictionRisk;
use crate::node::scripts;
use crate::node::{HoldOut, Op};

/// What one node says about a key, from [`Redlock::status`](crate::Redlock::status).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The value (owner id) holding the lock there, if any.
    pub value: Option<String>,
    /// The owner name that value carries, if its client set one
    /// ([`RedlockBuilder::owner`](crate::RedlockBuilder::owner)); `None` for a value without
    /// one (another Redlock client's, in compat mode).
    pub owner: Option<String>,
    /// The key's remaining time to live there, if held.
    pub ttl: Option<Duration>,
    /// The node's fencing counter for the key: at or above the last token handed out for it
    /// (the counter is shared by the lock keys of one Redis Cluster hash slot, and refused
    /// rounds may raise it too).
    pub fence: FencingToken,
}

/// One node's answer in a [`LockStatus`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node's address, password redacted.
    pub node: String,
    /// Its view of the key, or why it could not be read. A node that reaches the same server
    /// as another configured node reads [`NodeError::SameServer`]: it counts toward no quorum.
    pub state: Result<KeyState, NodeError>,
    /// What the node's memory policy can do to lock keys, as read on its last connect
    /// ([`EvictionRisk::Unknown`] before any, or where `CONFIG GET` is unavailable).
    pub eviction: EvictionRisk,
    /// The node's settings the client could not check on its last connect, by their Redis
    /// names (`appendfsync`, `maxmemory`, `maxmemory-policy`): `CONFIG` is renamed or refused,
    /// as on many managed services. Unread `appendfsync` means the node is never taken for
    /// durable (a restart always holds it out for the max ttl and repairs its counters);
    /// unread `maxmemory*` leave [`eviction`](Self::eviction) unknown. Empty when all were
    /// read, and before any connect. See `docs/acl.md`.
    pub unchecked: Vec<&'static str>,
    /// Whether scripts go to this node as `EVAL` with their body, because it refused an
    /// `EVALSHA` (see `docs/acl.md`).
    pub scripts_by_eval: bool,
}

/// Every node's view of one key, from [`Redlock::status`](crate::Redlock::status).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LockStatus {
    /// The user key.
    pub key: String,
    /// One entry per configured node, in configuration order.
    pub nodes: Vec<NodeStatus>,
    /// The quorum.
    pub quorum: usize,
}

impl LockStatus {
    /// How many nodes answered.
    pub fn answered(&self) -> usize {
        self.nodes.iter().filter(|n| n.state.is_ok()).count()
    }

    /// The value held by at least a quorum of nodes: the current owner, if any.
    ///
    /// `None` does not mean nobody holds the key when some nodes did not answer: see
    /// [`holder_view`](Self::holder_view), which tells vacant from unknown.
    pub fn holder(&self) -> Option<&str> {
        match self.holder_view() {
            HolderView::Held(v) => Some(v),
            HolderView::Vacant | HolderView::Unknown => None,
        }
    }

    /// The owner name of the [`holder`](Self::holder), if it holds the key and its client set
    /// one ([`RedlockBuilder::owner`](crate::RedlockBuilder::owner)).
    pub fn owner(&self) -> Option<String> {
        crate::core::value::owner_of(self.holder()?)
    }

    /// Who holds the key, as far as this read can tell: [`HolderView::Held`] with the value a
    /// quorum of nodes holds; [`HolderView::Vacant`] when nobody does; [`HolderView::Unknown`]
    /// when no value stands on a quorum of the nodes that answered but the nodes that did not
    /// answer could complete one (the holder's key on nodes {0,1,2}, a read that reached
    /// {1,2,3,4}).
    pub fn holder_view(&self) -> HolderView<&str> {
        let values: Vec<Option<&str>> = self
            .nodes
            .iter()
            .filter_map(|n| Some(n.state.as_ref().ok()?.value.as_deref()))
            .collect();
        let unanswered = self.nodes.len() - values.len();
        quorum::holder_view(&values, unanswered, self.quorum)
    }

    /// `Ok` when a quorum of nodes answered; otherwise [`Error::NoQuorum`] naming each node that
    /// did not, and why.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`].
    pub fn require_quorum(&self) -> Result<(), Error> {
        if self.answered() >= self.quorum {
            return Ok(());
        }
        Err(self.unanswered())
    }

    /// [`Error::NoQuorum`] naming each node that did not answer, and why.
    pub(crate) fn unanswered(&self) -> Error {
        let failures = self
            .nodes
            .iter()
            .filter_map(|n| {
                n.state.as_ref().err().map(|cause| NodeFailure {
                    node: n.node.clone(),
                    cause: cause.clone(),
                })
            })
            .collect();
        Error::NoQuorum {
            key: self.key.clone(),
            reached: self.answered(),
            nodes: self.nodes.len(),
            needed: self.quorum,
            failures,
        }
    }

    /// The highest fencing counter any node reports (0 when none does). The counter is shared
    /// by the lock keys of one Redis Cluster hash slot, so it may stand above this key's last
    /// token.
    pub fn max_fence(&self) -> FencingToken {
        self.nodes
            .iter()
            .filter_map(|n| n.state.as_ref().ok().map(|s| s.fence))
            .max()
            .unwrap_or(FencingToken::new(0))
    }
}

impl Engine {
    /// The engine side of [`Redlock::status`](crate::Redlock::status).
    pub(crate) async fn status(&self, key: &str) -> Result<LockStatus, Error> {
        // On the client's I/O thread when it has one (it may open the connections).
        let (client, key) = (self.clone(), key.to_owned());
        self.on_io_thread(async move { client.status_inline(&key).await })
            .await
    }

    pub(super) async fn status_inline(&self, key: &str) -> Result<LockStatus, Error> {
        self.check(key, Duration::from_secs(1))?;
        let (lock_key, fence_key) = (self.keys().lock_key(key), self.keys().fence_key(key));
        // Compat mode names the lock key only (no counter: its fence reads 0).
        let call = Arc::new(if self.inner.cfg.keys.is_compat() {
            scripts::STATUS.call(&[lock_key.as_bytes()], &[])
        } else {
            scripts::STATUS.call(&[lock_key.as_bytes(), fence_key.as_bytes()], &[])
        });
        let deadline = Instant::now() + self.inner.cfg.node_timeout;
        let replies =
            futures::future::join_all(self.inner.nodes.iter().map(|n| {
                Arc::clone(n).run(Arc::clone(&call), deadline, HoldOut::Ignore, Op::Status)
            }))
            .await;
        self.schedule_repairs();
        let nodes = self
            .inner
            .nodes
            .iter()
            .zip(replies)
            .map(|(n, r)| NodeStatus {
                node: n.name().to_owned(),
                state: match n.same_server() {
                    Some(twin) => Err(twin),
                    None => r.and_then(parse_status),
                },
                eviction: n.eviction(),
                unchecked: n.unchecked(),
                scripts_by_eval: n.scripts_by_eval(),
            })
            .collect();
        Ok(LockStatus {
            key: key.to_owned(),
            nodes,
            quorum: self.quorum(),
        })
    }
}

fn parse_status(v: Value) -> Result<KeyState, NodeError> {
    let bad = |v: &Value| NodeError::unexpected("an array of a value, a ttl and a counter", v);
    let Value::Array(items) = &v else {
        return Err(bad(&v));
    };
    let [value, pttl, fence] = items.as_slice() else {
        return Err(bad(&v));
    };
    let value = match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Nil => None,
        _ => return Err(bad(&v)),
    };
    let (Value::Int(pttl), Value::Int(fence)) = (pttl, fence) else {
        return Err(bad(&v));
    };
    Ok(KeyState {
        owner: value.as_deref().and_then(crate::core::value::owner_of),
        value,
        ttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        fence: FencingToken::of_counter(*fence),
    })
}
