//! How a node takes the fenced acquire.
//!
//! A standalone server (or a Sentinel-managed primary) running Redis 7 or later gets the fenced
//! acquire as one write of two commands on its one connection, `SET lock value NX PX ttl GET`
//! then `INCR counter`, read as two replies: no Lua. Every other node (Redis 6, a Redis
//! Cluster member) runs the acquire script (`scripts::ACQUIRE`), which does the same in one
//! atomic step. The argument that the pipelined form keeps tokens strictly increasing is in
//! `docs/safety.md`, "Fencing tokens". The connect reads the server's version (`INFO server`)
//! and decides the form for that connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::Value;

use super::scripts::ScriptCall;
use super::{Node, NodeSettings};
use crate::error::{NodeError, shape};

/// A node's choice between the script and the pipelined acquire.
#[derive(Debug, Default)]
pub(crate) struct AcquireForm {
    /// Whether acquires carry a fencing counter; `false` with fencing off or in compat mode:
    /// such a node never pipelines.
    fenced: bool,
    /// Kept on the script whatever the node runs (a test hook).
    #[cfg(feature = "testkit")]
    force_script: bool,
    /// The connection generation whose acquires are pipelined (0: none).
    ready: AtomicU64,
    /// Whether a connect has read the server's version yet.
    met: AtomicBool,
}

impl AcquireForm {
    pub(crate) fn new(settings: &NodeSettings) -> Self {
        AcquireForm {
            fenced: settings.fenced,
            #[cfg(feature = "testkit")]
            force_script: settings.force_script,
            ..AcquireForm::default()
        }
    }

    /// Whether a test keeps this node on the script.
    fn forced_to_script(&self) -> bool {
        #[cfg(feature = "testkit")]
        return self.force_script;
        #[cfg(not(feature = "testkit"))]
        false
    }
}

impl Node {
    /// What a connect (generation `generation`) found: the server's major version. The node
    /// pipelines its acquires on this connection when it can.
    pub(super) fn observe_acquire_form(&self, generation: u64, major: Option<u32>) {
        let path = &self.acquire_form;
        path.ready.store(0, Ordering::Release);
        path.met.store(true, Ordering::Release);
        if !path.fenced || path.forced_to_script() || major.is_none_or(|m| m < 7) {
            return;
        }
        path.ready.store(generation, Ordering::Release);
        tracing::debug!(node = %self.name, "acquires pipelined (SET NX PX GET + INCR)");
    }

    /// Whether acquires to this node are pipelined on its current connection (a hint for
    /// building a round's call: [`Self::pipelines_on`] decides per send).
    pub(crate) fn pipelines(&self) -> bool {
        self.acquire_form.ready.load(Ordering::Acquire) != 0
    }

    /// Whether acquires to this node may be pipelined: they are, or the node has not been met
    /// yet and may turn out to take them (a fresh client's first round then carries both forms,
    /// and the connect decides: a new process's lock costs a Redis 7 node no script).
    pub(crate) fn may_pipeline(&self) -> bool {
        let path = &self.acquire_form;
        self.pipelines()
            || (path.fenced
                && !path.forced_to_script()
                && !self.is_cluster()
                && !path.met.load(Ordering::Acquire))
    }

    /// Whether acquires on the connection of `generation` are pipelined.
    pub(super) fn pipelines_on(&self, generation: u64) -> bool {
        self.acquire_form.ready.load(Ordering::Acquire) == generation
    }

    /// Sends the pipelined acquire and reads its two replies as the script's one: the counter
    /// after `INCR` when our `SET` set the key, the holder's value (a bulk string) when another
    /// value holds it (the `INCR`'s reply is then ignored). Our `SET` followed by a failed
    /// `INCR` (an error reply such as `NOPERM`) is the node failing, as a script error is: the
    /// key we set there is undone like any failed node's.
    pub(super) async fn send_pipelined(
        &self,
        conn: &mut super::link::Single,
        call: &ScriptCall,
        generation: u64,
    ) -> Result<Value, NodeError> {
        let replies = conn
            .send_pipelined(call)
            .await
            .unwrap_or_else(|| Ok(Vec::new()))
            .map_err(|e| self.call_error(e, generation))?;
        let mut replies = replies.into_iter();
        match (replies.next(), replies.next()) {
            (Some(Value::Nil), Some(Value::Int(counter))) => Ok(Value::Int(counter)),
            (Some(holder @ Value::BulkString(_)), _) => Ok(holder),
            (Some(Value::ServerError(e)), _) | (Some(Value::Nil), Some(Value::ServerError(e))) => {
                Err(self.call_error(e.into(), generation))
            }
            (first, second) => {
                let said = |v: Option<Value>| v.as_ref().map_or("nothing".to_owned(), shape);
                Err(NodeError::BadReply {
                    expected: "a value, or nil then a counter",
                    got: format!("{} then {}", said(first), said(second)),
                })
            }
        }
    }
}
