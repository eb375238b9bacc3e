//! Every error the library returns: one enum for operations, one for configuration, and the
//! per-node failure that explains a lost quorum.

use std::fmt;
use std::time::Duration;

use self::text::one_line;
pub(crate) use self::text::{RedisText, shape};

mod input;
mod text;

pub use self::input::{ArgumentError, ConfigError, Setting};

/// What went wrong with a lock operation.
///
/// The variants separate the outcomes a caller reacts to differently: [`Error::Held`] is normal
/// contention (skip quietly), [`Error::NoQuorum`] means the lock service is degraded (log it,
/// alert), [`Error::Lost`] means a lock you held is no longer yours (stop acting on it).
/// [`is_retryable`](Self::is_retryable) tells the outcomes worth another try later.
///
/// **Stability.** New variants may come in minor releases (the enum is `#[non_exhaustive]`:
/// match with a `_` arm). A variant's fields are part of the contract, so you can build an
/// `Error` in your own tests; new information comes as a new variant or a method.
/// [`NodeFailure`] is built with [`NodeFailure::new`]. Node causes ([`NodeError`]) that came
/// from the `redis` crate carry its error, also as their [`source`](std::error::Error::source):
/// that is the crate re-exported as [`quorumlock::redis`](crate::redis) (redis 1.x, at least
/// 1.8), the same one a bring-your-own [`redis::Client`](crate::redis::Client) must come from.
///
/// ```
/// # use quorumlock::Error;
/// fn on_error(e: &Error) -> &'static str {
///     match e {
///         Error::Held { .. } => "someone else is doing it",
///         Error::NoQuorum { .. } => "lock service degraded",
///         _ => "other",
///     }
/// }
/// # let _ = on_error;
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by another owner: more than `nodes - needed` nodes refused (another
    /// value holds the key there), so the refusals alone rule out a quorum. Refusals mixed with
    /// failures are [`Error::NoQuorum`]; contenders that split the nodes between them are
    /// resolved inside the acquisition (see [`Redlock::try_acquire`](crate::Redlock::try_acquire)).
    #[error(
        "lock {key:?} is held by another owner ({held} of {nodes} nodes hold it, {needed} needed to acquire)"
    )]
    Held {
        /// The user key.
        key: String,
        /// How many nodes hold the other owner's value: the largest group of nodes that refused
        /// with one value (with fencing off, refusals carry no value and every one counts).
        held: usize,
        /// The configured number of nodes.
        nodes: usize,
        /// The quorum.
        needed: usize,
    },
    /// Too few nodes could be reached to form a quorum. `failures` names each node that failed and
    /// why, and each node that refused ([`NodeError::HeldByAnother`]) when refusals were part of
    /// the reason: a round is [`Error::Held`] only when the refusals alone rule out a quorum.
    #[error("too few nodes reachable for a quorum on {key:?}: {}, {needed} needed; {}", Counts(.failures, *.nodes), FailureList(.failures))]
    NoQuorum {
        /// The user key.
        key: String,
        /// How many nodes had answered when the outcome was decided (the round stops waiting as
        /// soon as a quorum is impossible, so live nodes may not have answered yet).
        reached: usize,
        /// The configured number of nodes.
        nodes: usize,
        /// The quorum.
        needed: usize,
        /// Each node that did not answer, and why; and each node that refused, as
        /// [`NodeError::HeldByAnother`].
        failures: Vec<NodeFailure>,
    },
    /// A quorum agreed, but it took so long that no validity was left (elapsed + drift >= ttl).
    #[error("validity of {key:?} ran out during acquisition: {elapsed:?} elapsed of a {ttl:?} ttl")]
    ValidityExpired {
        /// The user key.
        key: String,
        /// Time spent acquiring.
        elapsed: Duration,
        /// The ttl asked for.
        ttl: Duration,
    },
    /// A lock we held is no longer ours: its validity ended, or a quorum of nodes no longer holds
    /// our value (it expired there and was possibly taken by someone else).
    #[error("lock {key:?} was lost: {reason}")]
    Lost {
        /// The user key.
        key: String,
        /// Why we know.
        reason: LostReason,
    },
    /// The nodes' ACL refuses a command (or a key or channel) this operation needs, on so many
    /// nodes that the refusals alone rule out a quorum (more than `nodes - needed` refused).
    /// Not retried: granting the permission is the fix (`docs/acl.md` lists every command the
    /// crate sends, per feature). Refusals on a minority of nodes do not fail an operation:
    /// those nodes count as failed, are logged once at warn, and are listed as
    /// [`NodeError::Denied`] in any [`Error::NoQuorum`] that other failures complete.
    #[error(
        "permission denied on {key:?}: the Redis user may not run {} on {denied} of {nodes} nodes ({needed} needed for a quorum); grant it (quorumlock::guide::acl, docs/acl.md); {}",
        one_line(.command),
        FailureList(.failures)
    )]
    PermissionDenied {
        /// The user key.
        key: String,
        /// The refused command as Redis names it in ACL rules (`INCR`, `SCRIPT|LOAD`), from the
        /// first refusal; see each failure for the others.
        command: String,
        /// How many nodes refused.
        denied: usize,
        /// The configured number of nodes.
        nodes: usize,
        /// The quorum.
        needed: usize,
        /// Every node that failed, and why (the refusals as [`NodeError::Denied`]).
        failures: Vec<NodeFailure>,
    },
    /// Compat mode only (the lock is the plain key): the key exists on `nodes` nodes as data of
    /// another type (`kind`, as Redis' `TYPE` names it: `hash`, `list`, `set`...), most likely
    /// an application's own key. No lock can ever be taken on it, and it may never expire: not
    /// retried; choose a key name no application uses.
    #[error(
        "key {key:?} holds a Redis {} on {nodes} nodes, not a lock: in compat mode the lock is the plain key, so choose a name no application uses",
        one_line(.kind)
    )]
    WrongType {
        /// The user key.
        key: String,
        /// The key's type on the first node that reported one other than `string`.
        kind: String,
        /// How many nodes hold it as another type.
        nodes: usize,
    },
    /// This client sent more than its connections could carry in time: the operation's calls
    /// were still queued behind the client's own earlier calls when it could wait no longer,
    /// while the nodes kept answering. No node is at fault; without the backlog a quorum was
    /// within reach. Send fewer operations at once (bound the concurrency), or give them a
    /// longer ttl; retryable.
    #[error(
        "this client is overloaded: {queued} of {nodes} nodes were still answering its earlier calls, not yet this one on {key:?}, after {}; the nodes are healthy (bound the operations in flight)",
        humanize(*.waited)
    )]
    Overloaded {
        /// The user key.
        key: String,
        /// How many nodes still had this operation's call queued behind the client's earlier
        /// calls ([`NodeError::Backlog`]).
        queued: usize,
        /// The configured number of nodes.
        nodes: usize,
        /// How long the operation waited.
        waited: Duration,
    },
    /// The ttl (or another per-call argument) cannot work with this configuration.
    #[error("invalid argument: {0}")]
    InvalidArgument(#[from] ArgumentError),
    /// The client could not be built.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
}

impl Error {
    /// True for [`Error::Held`]: normal contention, not a fault.
    pub fn is_held(&self) -> bool {
        matches!(self, Error::Held { .. })
    }

    /// True for [`Error::NoQuorum`]: the lock service is degraded.
    pub fn is_no_quorum(&self) -> bool {
        matches!(self, Error::NoQuorum { .. })
    }

    /// True for [`Error::Overloaded`]: this client sent more at once than its connections
    /// carry in time; the nodes are healthy.
    ///
    /// ```
    /// # fn decide(err: &quorumlock::Error) {
    /// if err.is_overloaded() {
    ///     // fewer operations in flight, then retry
    /// }
    /// # }
    /// ```
    pub fn is_overloaded(&self) -> bool {
        matches!(self, Error::Overloaded { .. })
    }

    /// True for [`Error::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }

    /// True for [`Error::PermissionDenied`]: the nodes' ACL refuses a command the crate needs.
    ///
    /// ```
    /// # use quorumlock::Error;
    /// fn what_to_do(e: &Error) -> &'static str {
    ///     if e.is_permission_denied() {
    ///         "grant the command named in the error (docs/acl.md); retrying will not help"
    ///     } else {
    ///         "retry later"
    ///     }
    /// }
    /// # let _ = what_to_do;
    /// ```
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Error::PermissionDenied { .. })
    }

    /// [`Error::PermissionDenied`] when the refusals among `failures` alone rule out a quorum
    /// of `needed` out of `nodes` (more than `nodes - needed` nodes refused); otherwise
    /// [`Error::NoQuorum`]. A minority of refusals with other failures is a `NoQuorum` (the
    /// other nodes may come back) that lists each refusal with its command.
    pub(crate) fn no_quorum(
        key: &str,
        reached: usize,
        nodes: usize,
        needed: usize,
        failures: Vec<NodeFailure>,
    ) -> Error {
        let mut denied = failures.iter().filter_map(|f| match &f.cause {
            NodeError::Denied { command, .. } => Some(command),
            _ => None,
        });
        if let Some(command) = denied.next() {
            let count = 1 + denied.count();
            if count > nodes.saturating_sub(needed) {
                let command = command.clone();
                return Error::PermissionDenied {
                    key: key.to_owned(),
                    command,
                    denied: count,
                    nodes,
                    needed,
                    failures,
                };
            }
        }
        // Calls still queued behind the client's own earlier calls would have made the quorum:
        // the client is overloaded, the nodes are not at fault.
        let queued = failures
            .iter()
            .filter(|f| matches!(f.cause, NodeError::Backlog(_)))
            .count();
        let refused = failures
            .iter()
            .filter(|f| matches!(f.cause, NodeError::HeldByAnother))
            .count();
        if queued > 0 && reached.saturating_sub(refused) + queued >= needed {
            let waited = failures
                .iter()
                .filter_map(|f| match f.cause {
                    NodeError::Backlog(waited) => Some(waited),
                    _ => None,
                })
                .max()
                .unwrap_or_default();
            return Error::Overloaded {
                key: key.to_owned(),
                queued,
                nodes,
                waited,
            };
        }
        Error::NoQuorum {
            key: key.to_owned(),
            reached,
            nodes,
            needed,
            failures,
        }
    }

    /// Whether another attempt later may succeed: the lock is held, too few nodes answered, or
    /// a round was too slow to leave any validity. Not retryable: a lost lock, refused
    /// permissions, bad arguments or configuration (fix those first).
    ///
    /// ```
    /// # fn decide(err: &quorumlock::Error) {
    /// if err.is_retryable() {
    ///     // back off and try again later
    /// }
    /// # }
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Held { .. }
                | Error::NoQuorum { .. }
                | Error::ValidityExpired { .. }
                | Error::Overloaded { .. }
        )
    }
}

/// Why a held lock counts as lost.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LostReason {
    /// The lock's validity deadline passed without a successful extension.
    Expired,
    /// Enough nodes answered that the key no longer holds our value that a quorum cannot.
    NotOwner {
        /// Nodes that had confirmed our value when that became certain (a round stops waiting
        /// as soon as its outcome is decided, so this is a lower bound).
        owned: usize,
        /// The quorum.
        needed: usize,
    },
    /// An extension could not reach a quorum of nodes before validity ran out.
    Unreachable {
        /// The failures of the last extension round.
        failures: Vec<NodeFailure>,
    },
    /// The lock was released (or its guard dropped) before this operation could run.
    Released,
    /// An operator revoked the lock ([`Redlock::revoke`](crate::Redlock::revoke), `redlock
    /// break`): the fencing counter was raised past our token on a quorum and our value
    /// deleted, so resources that check tokens refuse ours from then on.
    Revoked,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Expired => {
                f.write_str("its validity ran out without a successful extension")
            }
            LostReason::NotOwner { owned, needed } => write!(
                f,
                "a quorum no longer holds our value ({owned} nodes had confirmed it when that was \
                 certain, {needed} needed)"
            ),
            LostReason::Unreachable { failures } => write!(
                f,
                "an extension could not reach a quorum before validity ran out; {}",
                FailureList(failures)
            ),
            LostReason::Released => f.write_str("it was released"),
            LostReason::Revoked => f.write_str(
                "it was revoked (redlock break): its fencing token is superseded and fenced writes with it are refused",
            ),
        }
    }
}

/// One node that failed during an operation, with the cause.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{node}: {cause}")]
#[non_exhaustive]
pub struct NodeFailure {
    /// The node's address, with any password redacted.
    pub node: String,
    /// Why it failed.
    #[source]
    pub cause: NodeError,
}

impl NodeFailure {
    /// A failure of `node` (an address, with any password already redacted) for `cause`: for
    /// tests of your own error handling; the library builds its own.
    pub fn new(node: impl Into<String>, cause: NodeError) -> Self {
        NodeFailure {
            node: node.into(),
            cause,
        }
    }
}

/// Why one node failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// No answer within the per-node timeout (or before the validity budget ran out), or no
    /// connection within the connect timeout. The duration is how long the call had; zero when
    /// the timeout was the connection's own (the response timeout of a `redis::Client` given
    /// to the builder), whose length the call does not know: shown as "timed out".
    #[error("{}", timed_out(*.0))]
    Timeout(Duration),
    /// The node refused the connection (nothing listening).
    #[error("connection refused")]
    Refused(#[source] redis::RedisError),
    /// The connection broke (node died, network reset) or could not be set up (a TLS handshake
    /// that failed, for instance); the cause says which.
    #[error("{}", DroppedText(.0))]
    Dropped(#[source] redis::RedisError),
    /// The node kept answering this client's earlier calls, but this call's answer had not come
    /// by the time its operation could wait no longer (`waited`): the client's own queue to the
    /// node was that long, the node is healthy. Never marks the node down.
    #[error(
        "answering this client's earlier calls, not yet this one after {} (the client's own backlog, not a node fault)",
        humanize(*.0)
    )]
    Backlog(Duration),
    /// The node has sent nothing for `for_` (a node timeout or more) while this client's calls
    /// to it were outstanding, and nothing from it waits unread: an acquisition counted it as
    /// failed at once and sent it nothing, rather than queue another call behind the
    /// unanswered ones. The node counts again as soon as it sends anything.
    #[error(
        "silent for {} with calls outstanding: not sent, counted as failed (it counts again once it answers)",
        humanize(*.for_)
    )]
    Silent {
        /// How long the node had been silent.
        for_: Duration,
    },
    /// The node restarted (or started) less than the maximum ttl ago and may have lost lock keys;
    /// it is kept out of every quorum until `remaining` has passed.
    #[error(
        "held out of quorums for {} more: it (re)started less than the max ttl ago and may have lost lock keys (delayed-restart rule)",
        humanize(*.remaining)
    )]
    HeldOut {
        /// How long until the node counts again.
        remaining: Duration,
    },
    /// The node's wall clock moved forward by `forward` more than the time that passed here
    /// between two of our readings of its `TIME` (with the drift allowance): Redis expires keys
    /// on that clock, so it may have dropped lock keys early. The node is held out of quorums
    /// for the max ttl from then and its fencing counters are checked, as after a restart.
    #[error(
        "its clock jumped forward by {} since our last reading and it may have expired lock keys early: held out of quorums for the max ttl",
        humanize(*.forward)
    )]
    ClockJumped {
        /// How far the node's clock ran ahead of ours between the two readings.
        forward: Duration,
    },
    /// The node restarted and its fencing counters are being restored from the other nodes; it
    /// counts toward no quorum until that is done.
    #[error(
        "held out of quorums until its fencing counters are restored from the other nodes after a restart"
    )]
    Repairing,
    /// This URL reaches the same Redis server (same run id) as another configured node: two
    /// databases of one server, a hostname and its address, a Unix socket and TCP. One server
    /// is one vote at most, so neither counts toward a quorum while both reach it.
    #[error(
        "same Redis server as {other} (run id {}): one server is not two independent masters, neither counts toward a quorum",
        one_line(.run_id)
    )]
    SameServer {
        /// The other node's address, password redacted.
        other: String,
        /// The server's run id.
        run_id: String,
    },
    /// The node's memory policy can evict lock keys (`maxmemory` with a `volatile-*` or
    /// `allkeys-*` policy) and the client was built with
    /// [`EvictionGuard::Strict`](crate::EvictionGuard::Strict): it counts toward no quorum.
    #[error("held out of quorums by the strict eviction guard: {0}")]
    Evicting(crate::eviction::EvictionRisk),
    /// The node answered with an error (its code and text are in the message, as Redis words
    /// them), or the client refused the call.
    #[error("the node answered with an error: {}", RedisText(.0))]
    Redis(#[source] redis::RedisError),
    /// The node answered, and refused: another owner's value holds the key there. Not a fault;
    /// listed in [`Error::NoQuorum`] so that a round that failed both for refusals and for
    /// failures names every node that counted against the quorum.
    #[error("refused: another owner's value holds the key there")]
    HeldByAnother,
    /// The node's reply had an unexpected shape: `got`, where `expected` was expected, both in
    /// words (`unexpected reply: a string where an integer was expected`).
    #[error("unexpected reply: {got} where {expected} was expected")]
    BadReply {
        /// What the crate expected, in words (`an integer`).
        expected: &'static str,
        /// What came, in words (its shape: `a string`, `2 replies`), never its raw bytes.
        got: String,
    },
    /// The node does not follow the Redis protocol (an HTTP server, an SSH server or anything
    /// else listening on the port), or closed the connection before its first reply
    /// (`closed_early`). Its [`kind`](NodeError::kind) is `bad_reply`, as a reply of the wrong
    /// shape.
    #[error("{}", text::not_redis(*.closed_early))]
    NotRedis {
        /// The connection closed before the first reply, rather than carrying bytes that are
        /// not Redis.
        closed_early: bool,
    },
    /// A run-once tick marker read: this client saw the node come back without proof that its
    /// data survived (a restart, a failover) `ago`, less than the marker's expiry, so its
    /// answer that the marker is absent proves nothing (the marker may have been lost with
    /// the rest). The node still counts for locks once its hold-out and repair are over.
    #[error(
        "lost its data {} ago (restarted or failed over without proof its data survived), within the tick marker's expiry: its 'no marker' proves nothing",
        humanize(*.ago)
    )]
    LostDataRecently {
        /// How long ago this client met the node after the loss.
        ago: Duration,
    },
    /// The node's ACL refused a command the crate sent (a `NOPERM` reply), or a command one of
    /// its scripts calls, or a key or channel outside the user's patterns. Not retried on the
    /// node's connection; the node counts as failed until the permission is granted.
    #[error(
        "permission denied: the Redis user may not run {} ({reason}); see quorumlock::guide::acl (docs/acl.md)",
        one_line(.command)
    )]
    Denied {
        /// The refused command as Redis names it in ACL rules (`INCR`, `SCRIPT|LOAD`). For a
        /// refusal inside a script, the command(s) called on the script's failing line
        /// (`GET or PTTL`).
        command: String,
        /// What was refused: the command itself, a key outside the user's key patterns, or a
        /// channel outside its channel patterns.
        reason: &'static str,
    },
    /// The server does not know a command the lock protocol needs (`EVAL`: renamed or
    /// disabled with `rename-command`). Found when connecting, so the node never votes; it
    /// counts as failed until a connect finds the command.
    #[error(
        "the server does not serve {command} (renamed or disabled): it cannot run the lock protocol's scripts"
    )]
    Unsupported {
        /// The missing command, as `EVAL`.
        command: String,
    },
}

impl NodeError {
    /// A reply of the wrong shape: `got`, where `expected` (in words) was expected.
    pub(crate) fn unexpected(expected: &'static str, got: &redis::Value) -> Self {
        NodeError::BadReply {
            expected,
            got: text::shape(got),
        }
    }

    /// Classifies a `redis` error by its own predicates, never by its text: a reply that does
    /// not parse is [`NodeError::NotRedis`].
    pub(crate) fn from_redis(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            NodeError::Timeout(Duration::ZERO)
        } else if matches!(
            e.kind(),
            redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType
        ) {
            NodeError::NotRedis {
                closed_early: false,
            }
        } else if e.is_connection_refusal() {
            NodeError::Refused(e)
        } else if e.is_connection_dropped() || e.is_io_error() {
            NodeError::Dropped(e)
        } else {
            NodeError::Redis(e)
        }
    }

    /// The cause as one stable word (`timeout`, `backlog`, `silent`, `refused`, `dropped`, `held_out`, `repairing`,
    /// `same_server`, `evicting`, `redis`, `held`, `bad_reply`, `lost_data_recently`,
    /// `denied`, `unsupported`): the `error` label of
    /// the node metrics and the `error_kind` of `redlock status --json`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::NodeError;
    ///
    /// assert_eq!(NodeError::Timeout(Duration::from_millis(50)).kind(), "timeout");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            NodeError::Timeout(_) => "timeout",
            NodeError::Backlog(_) => "backlog",
            NodeError::Silent { .. } => "silent",
            NodeError::Refused(_) => "refused",
            NodeError::Dropped(_) => "dropped",
            NodeError::HeldOut { .. } => "held_out",
            NodeError::ClockJumped { .. } => "clock_jump",
            NodeError::Repairing => "repairing",
            NodeError::SameServer { .. } => "same_server",
            NodeError::Evicting(_) => "evicting",
            NodeError::Redis(_) => "redis",
            NodeError::HeldByAnother => "held",
            NodeError::BadReply { .. } | NodeError::NotRedis { .. } => "bad_reply",
            NodeError::LostDataRecently { .. } => "lost_data_recently",
            NodeError::Denied { .. } => "denied",
            NodeError::Unsupported { .. } => "unsupported",
        }
    }
}

/// A broken connection, or one that could not be set up; a failed name lookup says DNS.
struct DroppedText<'a>(&'a redis::RedisError);

impl fmt::Display for DroppedText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cause = RedisText(self.0).to_string();
        if cause.starts_with("DNS ") {
            f.write_str(&cause)
        } else {
            write!(f, "connection dropped ({cause})")
        }
    }
}

/// `1.2s`, `50ms`, `750µs`: short and readable in one-line errors.
/// A timeout's words: "timed out after 250ms", or "timed out" when its length is not known.
fn timed_out(d: Duration) -> String {
    if d.is_zero() {
        "timed out".to_owned()
    } else {
        format!("timed out after {}", humanize(d))
    }
}

fn humanize(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.1}s", d.as_secs_f64())
    } else if d >= Duration::from_millis(1) {
        // Rounded up: a 250 ms node timeout's call started a few µs into its round, so it had
        // 249.9 ms, which reads as the 250 ms configured rather than 249.
        format!("{}ms", d.as_micros().div_ceil(1000))
    } else {
        format!("{}µs", d.as_micros())
    }
}

/// A duration under a second to the hundredth of a millisecond (`2.03ms`), for a drift
/// allowance that rounding up would overstate; longer ones as [`humanize`].
fn fine(d: Duration) -> String {
    if d >= Duration::from_secs(1) || d.subsec_nanos().is_multiple_of(1_000_000) {
        return humanize(d);
    }
    let text = format!("{:.2}", d.as_secs_f64() * 1000.0);
    format!("{}ms", text.trim_end_matches('0').trim_end_matches('.'))
}

/// `3 of 5 nodes failed`, or `2 of 5 nodes failed and 1 refused` when refusals are listed.
struct Counts<'a>(&'a [NodeFailure], usize);

impl fmt::Display for Counts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let refused = self
            .0
            .iter()
            .filter(|n| matches!(n.cause, NodeError::HeldByAnother))
            .count();
        let failed = self.0.len() - refused;
        write!(f, "{failed} of {} nodes failed", self.1)?;
        if refused > 0 {
            write!(f, " and {refused} refused (another owner's value)")?;
        }
        Ok(())
    }
}

/// Formats a list of node failures as `a: cause; b: cause` (for errors and log fields).
pub(crate) struct FailureList<'a>(pub(crate) &'a [NodeFailure]);

impl fmt::Display for FailureList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no node failed outright (the budget ran out)");
        }
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
