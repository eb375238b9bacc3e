//! Leader election on top of the lock, in etcd's words: [`Election::campaign`] waits until this
//! candidate leads and returns a [`Leadership`] guard, [`Leadership::resign`] steps down at once,
//! [`Election::leader`] reads who leads from a quorum, [`Election::observe`] streams leadership
//! changes and [`Election::health`] answers a health check.
//!
//! # How it works
//!
//! A term is the lock `NAME` (key `quorumlock:{NAME}`) held by one candidate and kept alive by
//! its lease; the term's fencing token is the lock's token. Two more keys per election, both on
//! every node and in the lock's hash slot:
//!
//! - `quorumlock:{NAME}:leader`, the *leader record*: `"<lock value> <token> <candidate id>"`,
//!   built by the new leader from its own lock value and written on every node where that value
//!   stands. The lock value is random per acquisition, so the record binds the candidate id to
//!   one exact term: a reader trusts a record only when its lock value is the one a quorum holds
//!   now. A stale record (a crashed leader's) therefore never names the wrong leader. The record
//!   has no expiry (like the fencing counter, it is one small key per election); resign deletes
//!   it.
//! - `quorumlock:{NAME}:events`, a pub/sub channel: `"elected <token> <id>"` after the record is
//!   written, `"resigned <token> <id>"` after a resign released the lock. Each [`Election`]
//!   subscribes on every node (one connection per node, checked with a `PING` every 2 s and
//!   re-established with backoff when it breaks or stops answering) so that a standby retries
//!   the moment the leader resigns; the copies of a notice from several nodes are deduplicated
//!   by token.
//!
//! Notifications can be lost (a node down, a subscription being re-established), so standbys
//! never rely on them alone: after a refused attempt a standby reads the lock's remaining time to
//! live on every node and sleeps until a quorum of them would have expired it (that is what makes
//! crash handover take about one ttl), and never longer than the poll interval (with jitter).
//! When that read shows no value on a quorum (standbys that retried together split the nodes),
//! it retries after the lock client's short random pause instead.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream, StreamExt};
use redis::Script;
use redis::aio::MultiplexedConnection;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::client::Redlock;
use crate::client::status::LockStatus;
use crate::core::clock;
use crate::core::keys;
use crate::core::lock;
use crate::core::quorum::HolderView;
use crate::core::token::FencingToken;
use crate::error::{ConfigError, Error, FailureList, LostReason, NodeError, NodeFailure};
use crate::lock::builder::RedlockBuilder;
use crate::lock::guard::Lock;
use crate::node::Node;

/// Writes the leader record on a node where this term's lock value stands.
///
/// - KEYS[1]: lock key, KEYS[2]: leader record
/// - ARGV[1]: this term's lock value, ARGV[2]: the record (`"<lock value> <token> <id>"`)
/// - Reply: 1 when written, 0 when the node does not hold our value (it missed the
///   acquisition, or the key expired there).
static WRITE_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
"#,
    )
});

/// Deletes our leader record (only if it is still exactly ours) and announces the resignation.
///
/// - KEYS[1]: leader record
/// - ARGV[1]: our record (empty when none was written), ARGV[2]: channel, ARGV[3]: message
/// - Reply: the number of subscribers that received the message.
static RESIGN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return redis.call('PUBLISH', ARGV[2], ARGV[3])
"#,
    )
});

// ------------------------------------------------------------------------------------------------
// Side connections: the election's and the scheduler's own connections to the lock's nodes.

/// How long calls to a node fail at once after a failed connect, before the next connect is
/// tried; doubled after each failure up to [`SIDE_BACKOFF_MAX`].
const SIDE_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest fail-fast pause between two connects to a node that keeps failing.
const SIDE_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One plain connection per node of a [`Redlock`], for what the lock client does not do itself:
/// the leader record, pub/sub announcements and the scheduler's tick markers. Connections are
/// opened by the lock's own nodes ([`Node::open_connection`], [`Node::open_pubsub`]), so they
/// carry the same certificates, TCP settings and timeouts as the lock's connections.
///
/// Every call is bounded by the node timeout, connecting included: a connect runs in a spawned
/// task bounded by the connect timeout, which a call waits for only until its own deadline. A
/// node that failed (a connect that failed, or a call that timed out or broke its connection)
/// is *suspect*: calls to it fail at once, without waiting, until a connect in the background
/// succeeds again (tried at most every [`SIDE_BACKOFF_MAX`]). So a dead or silent node costs
/// one node timeout once, then nothing.
///
/// Unlike the lock client, a call that timed out drops its connection: nothing sent here needs
/// to reach a node in order after an earlier call (a late leader record is bound to a term that
/// readers no longer trust, a late tick marker is still true).
pub(crate) struct Sidecar {
    nodes: Vec<SideNode>,
    node_timeout: Duration,
    connect_timeout: Duration,
}

struct SideNode {
    name: String,
    node: Arc<Node>,
    state: Arc<Mutex<SideState>>,
}

/// The connection to one node, shared with its connect task.
struct SideState {
    slot: Slot,
    generation: u64,
    /// Why the node last failed, until a connect succeeds: while set, calls fail at once with
    /// it instead of waiting for a (re)connect.
    suspect: Option<NodeError>,
    /// The fail-fast pause after the next failed connect.
    backoff: Duration,
}

type Connected = Result<(MultiplexedConnection, u64), NodeError>;

enum Slot {
    Empty,
    Ready(MultiplexedConnection, u64),
    Connecting(Shared<BoxFuture<'static, Connected>>),
    /// The last connect failed: no new connect before this instant.
    Failed(Instant),
}

/// What a call finds in a node's slot.
enum Found {
    Ready(MultiplexedConnection, u64),
    Pending(Shared<BoxFuture<'static, Connected>>),
    FailFast(NodeError),
    /// No tokio runtime to connect in the background: connect in the call itself.
    Inline,
}

impl fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        f.debug_struct("Sidecar").field("nodes", &names).finish()
    }
}

impl Sidecar {
    pub(crate) fn new(locks: &Redlock) -> Result<Self, Error> {
        let cfg = &locks.inner.cfg;
        if !cfg.fencing {
            // Terms are told apart, ordered and bound to their record by their tokens.
            return Err(ConfigError::FencingRequired.into());
        }
        let nodes = locks
            .inner
            .nodes
            .iter()
            .map(|node| SideNode {
                name: node.name().to_owned(),
                node: Arc::clone(node),
                state: Arc::new(Mutex::new(SideState {
                    slot: Slot::Empty,
                    generation: 0,
                    suspect: None,
                    backoff: SIDE_BACKOFF_MIN,
                })),
            })
            .collect();
        Ok(Sidecar {
            nodes,
            node_timeout: cfg.node_timeout,
            connect_timeout: cfg.connect_timeout,
        })
    }

    /// Runs `op` on every node at once, each call bounded by the node timeout (connecting
    /// included; see the type's docs). Replies in node order.
    pub(crate) async fn all<T, F, Fut>(&self, op: F) -> Vec<Result<T, NodeError>>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let deadline = Instant::now() + self.node_timeout;
        let calls = self
            .nodes
            .iter()
            .map(|n| n.call(&op, deadline, self.connect_timeout));
        futures::future::join_all(calls).await
    }

    /// Starts connecting to every node not connected yet, in the background (when a tokio
    /// runtime is running), so that the first calls find their connections ready.
    pub(crate) fn warm_up(&self) {
        for n in &self.nodes {
            let _ = n.find(self.connect_timeout);
        }
    }

    /// The failures among `replies`, named by node.
    pub(crate) fn failures<T>(&self, replies: &[Result<T, NodeError>]) -> Vec<NodeFailure> {
        self.nodes
            .iter()
            .zip(replies)
            .filter_map(|(n, r)| {
                r.as_ref().err().map(|cause| NodeFailure {
                    node: n.name.clone(),
                    cause: cause.clone(),
                })
            })
            .collect()
    }

    fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.iter().map(|n| &n.node)
    }
}

impl SideNode {
    async fn call<T, F, Fut>(
        &self,
        op: &F,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<T, NodeError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let start = Instant::now();
        let timed_out = || NodeError::Timeout(deadline.saturating_duration_since(start));
        let (conn, generation) = match self.find(connect_timeout) {
            Found::Ready(conn, generation) => (conn, generation),
            Found::FailFast(e) => return Err(e),
            Found::Pending(connecting) => match tokio::time::timeout_at(deadline, connecting).await
            {
                Ok(connected) => connected?,
                Err(_) => return Err(timed_out()),
            },
            Found::Inline => {
                match tokio::time::timeout_at(deadline, self.node.open_connection()).await {
                    Ok(conn) => (conn?, 0),
                    Err(_) => return Err(timed_out()),
                }
            }
        };
        match tokio::time::timeout_at(deadline, op(conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                tracing::debug!(node = %self.name, error = %e, "side call failed");
                let e = NodeError::from_redis(e);
                // An error reply proves the connection works; anything else may not.
                if !matches!(&e, NodeError::Redis(r) if matches!(r.kind(), redis::ErrorKind::Server(_)))
                {
                    self.broken(generation, &e);
                }
                Err(e)
            }
            Err(_) => {
                let e = timed_out();
                tracing::debug!(node = %self.name, error = %e, "side call timed out");
                self.broken(generation, &e);
                Err(e)
            }
        }
    }

    /// The connection, the connect to wait for, or the error to fail with at once. Starts a
    /// connect in the background when none is ready or running and the backoff allows.
    fn find(&self, connect_timeout: Duration) -> Found {
        let mut st = lock(&self.state);
        match &st.slot {
            Slot::Ready(conn, generation) => return Found::Ready(conn.clone(), *generation),
            Slot::Connecting(pending) => {
                return match &st.suspect {
                    Some(e) => Found::FailFast(e.clone()),
                    None => Found::Pending(pending.clone()),
                };
            }
            Slot::Failed(until) if Instant::now() < *until => {
                return Found::FailFast(
                    st.suspect
                        .clone()
                        .unwrap_or(NodeError::Timeout(connect_timeout)),
                );
            }
            Slot::Failed(_) | Slot::Empty => {}
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Found::Inline;
        };
        st.generation += 1;
        let generation = st.generation;
        let (state, node, name) = (
            Arc::clone(&self.state),
            Arc::clone(&self.node),
            self.name.clone(),
        );
        let task = handle.spawn(async move {
            let result = node.open_connection().await;
            let mut st = lock(&state);
            match &result {
                Ok(conn) => {
                    st.slot = Slot::Ready(conn.clone(), generation);
                    st.suspect = None;
                    st.backoff = SIDE_BACKOFF_MIN;
                }
                Err(e) => {
                    tracing::debug!(node = %name, error = %e, backoff = ?st.backoff, "side connect failed");
                    st.slot = Slot::Failed(Instant::now() + st.backoff);
                    st.suspect = Some(e.clone());
                    st.backoff = (st.backoff * 2).min(SIDE_BACKOFF_MAX);
                }
            }
            result.map(|conn| (conn, generation))
        });
        let pending = async move {
            task.await
                .unwrap_or(Err(NodeError::Timeout(connect_timeout)))
        }
        .boxed()
        .shared();
        st.slot = Slot::Connecting(pending.clone());
        match &st.suspect {
            Some(e) => Found::FailFast(e.clone()),
            None => Found::Pending(pending),
        }
    }

    /// Drops the connection a call failed on (unless already replaced) and marks the node
    /// suspect until a reconnect succeeds.
    fn broken(&self, generation: u64, why: &NodeError) {
        let mut st = lock(&self.state);
        if matches!(&st.slot, Slot::Ready(_, g) if *g == generation) {
            st.slot = Slot::Empty;
            st.suspect = Some(why.clone());
            tracing::debug!(node = %self.name, error = %why, "side connection dropped; will reconnect");
        }
    }
}

/// The pause between attempts that compete for a free lock: the lock client's retry delay plus
/// its random jitter, so that competitors desynchronise.
pub(crate) fn contention_pause(locks: &Redlock) -> Duration {
    locks.retry_pause()
}

// ------------------------------------------------------------------------------------------------
// Notifications.

/// A message on an election's channel.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Notice {
    Elected {
        token: u64,
        candidate: String,
    },
    Resigned {
        token: u64,
        candidate: String,
    },
    /// A node's subscription was re-established: notifications may have been missed.
    Resubscribed,
}

impl Notice {
    fn elected(token: FencingToken, candidate: &str) -> String {
        format!("elected {token} {candidate}")
    }

    fn resigned(token: FencingToken, candidate: &str) -> String {
        format!("resigned {token} {candidate}")
    }

    fn parse(payload: &str) -> Option<Notice> {
        let mut parts = payload.splitn(3, ' ');
        let kind = parts.next()?;
        let token = parts.next()?.parse().ok()?;
        let candidate = parts.next().unwrap_or_default().to_owned();
        match kind {
            "elected" => Some(Notice::Elected { token, candidate }),
            "resigned" => Some(Notice::Resigned { token, candidate }),
            _ => None,
        }
    }
}

/// The subscriptions of one [`Election`]: a task per node, fanned into one broadcast channel.
struct Notifier {
    tx: broadcast::Sender<Notice>,
    _tasks: Vec<AbortOnDropHandle<()>>,
}

impl Notifier {
    const MIN_PAUSE: Duration = Duration::from_millis(100);
    const MAX_PAUSE: Duration = Duration::from_secs(2);
    /// How often a subscription's connection is checked with a `PING`.
    const KEEPALIVE_EVERY: Duration = Duration::from_secs(2);

    /// Starts one subscription task per node on `handle`.
    fn start(sidecar: &Sidecar, channel: &str, handle: &tokio::runtime::Handle) -> Self {
        let (tx, _) = broadcast::channel(64);
        let tasks = sidecar
            .nodes()
            .map(|node| {
                AbortOnDropHandle::new(handle.spawn(Self::subscribe(
                    Arc::clone(node),
                    channel.to_owned(),
                    tx.clone(),
                    sidecar.connect_timeout,
                )))
            })
            .collect();
        Notifier { tx, _tasks: tasks }
    }

    /// Subscribes on one node for as long as the notifier lives, reconnecting with backoff.
    ///
    /// A subscription's connection carries nothing while nobody publishes, so a connection
    /// that died without a FIN or RST (a node paused or cut off by the network) would look
    /// healthy forever: every [`KEEPALIVE_EVERY`](Self::KEEPALIVE_EVERY) a `PING` must be
    /// answered within the connect timeout, or the subscription is dropped and made again.
    async fn subscribe(
        side: Arc<Node>,
        channel: String,
        tx: broadcast::Sender<Notice>,
        connect_timeout: Duration,
    ) {
        let node = side.name();
        let mut pause = Self::MIN_PAUSE;
        let mut subscribed_before = false;
        loop {
            let pubsub = tokio::time::timeout(connect_timeout, async {
                let mut pubsub = side.open_pubsub().await?;
                pubsub
                    .subscribe(&channel)
                    .await
                    .map_err(NodeError::from_redis)?;
                Ok::<_, NodeError>(pubsub)
            })
            .await;
            match pubsub {
                Ok(Ok(pubsub)) => {
                    tracing::debug!(%node, channel, "subscribed");
                    if subscribed_before {
                        let _ = tx.send(Notice::Resubscribed);
                    }
                    subscribed_before = true;
                    pause = Self::MIN_PAUSE;
                    let (mut sink, mut messages) = pubsub.split();
                    let keepalive = async {
                        loop {
                            tokio::time::sleep(Self::KEEPALIVE_EVERY).await;
                            match tokio::time::timeout(connect_timeout, sink.ping::<redis::Value>())
                                .await
                            {
                                Ok(Ok(_)) => {}
                                Ok(Err(e)) => return format!("PING failed: {e}"),
                                Err(_) => {
                                    return format!("no answer to PING within {connect_timeout:?}");
                                }
                            }
                        }
                    };
                    tokio::pin!(keepalive);
                    let why = loop {
                        tokio::select! {
                            msg = messages.next() => match msg {
                                Some(msg) => {
                                    let payload: String = msg.get_payload().unwrap_or_default();
                                    if let Some(notice) = Notice::parse(&payload) {
                                        let _ = tx.send(notice);
                                    }
                                }
                                None => break "connection closed".to_owned(),
                            },
                            why = &mut keepalive => break why,
                        }
                    };
                    tracing::debug!(%node, channel, reason = %why, "subscription lost; resubscribing");
                }
                Ok(Err(e)) => tracing::debug!(%node, error = %e, "subscribe failed"),
                Err(_) => tracing::debug!(%node, "subscribe timed out"),
            }
            let jitter = pause.mul_f64(rand::random::<f64>());
            tokio::time::sleep(pause + jitter).await;
            pause = (pause * 2).min(Self::MAX_PAUSE);
        }
    }
}

/// Which notices are news: each is published on every node, so up to N copies arrive (and
/// copies of consecutive notices may interleave). Terms' tokens grow, so a notice is news when
/// its token is above the last one of its kind; a re-established subscription always is
/// (notices may have been missed).
#[derive(Debug, Default)]
struct Fresh {
    elected: u64,
    resigned: u64,
}

impl Fresh {
    /// True for the first copy of a notice.
    fn first_copy(&mut self, notice: &Notice) -> bool {
        let seen = match notice {
            Notice::Elected { token, .. } => (&mut self.elected, *token),
            Notice::Resigned { token, .. } => (&mut self.resigned, *token),
            Notice::Resubscribed => return true,
        };
        if seen.1 > *seen.0 {
            *seen.0 = seen.1;
            true
        } else {
            false
        }
    }
}

/// Waits until `until`, or until a notice for which `wake` says yes (or notices were missed).
async fn wait_for(
    notices: &mut broadcast::Receiver<Notice>,
    until: Instant,
    mut wake: impl FnMut(&Notice) -> bool,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return,
            notice = notices.recv() => match notice {
                Ok(n) if wake(&n) => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => {
                    tokio::time::sleep_until(until).await;
                    return;
                }
            }
        }
    }
}

/// Consecutive short retries a standby makes while no candidate holds a quorum, before it
/// falls back to waiting as if a leader held the lock.
const SPLIT_ROUNDS: u32 = 8;

/// The state of one campaign.
#[derive(Debug, Default)]
struct Campaign {
    /// The last attempt's error.
    last: Option<Error>,
    /// Too few nodes answered the last attempt (logged once at warn).
    degraded: bool,
    /// Short retries made in a row after split votes.
    split_rounds: u32,
    fresh: Fresh,
}

// ------------------------------------------------------------------------------------------------
// The election.

/// One named election among candidates sharing a set of Redis masters.
///
/// Each candidate process builds its own `Election` (with its own [`Redlock`] client) under the
/// same name and a distinct candidate id, then [`campaign`](Self::campaign)s. Cheap to clone;
/// clones share the subscriptions and the candidate id.
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock::{Election, Redlock};
///
/// # async fn run() -> Result<(), quorumlock::Error> {
/// let locks = Redlock::builder([
///     "redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379",
///     "redis://10.0.0.4:6379", "redis://10.0.0.5:6379",
/// ])
/// .build()?;
/// let election = Election::builder(locks, "scheduler")
///     .ttl(Duration::from_secs(10))
///     .candidate("scheduler-0")
///     .build()?;
/// loop {
///     let leadership = election.campaign().await?; // waits until we lead
///     let token = leadership.token(); // stamp every write with it
///     tokio::select! {
///         _ = leadership.lost() => tracing::warn!("leadership lost; stopping work"),
///         _ = async { /* lead: schedule, using `token` */ } => {}
///     }
///     let _ = leadership.resign().await; // hand over at once
/// #   let _ = token; break;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

struct Inner {
    locks: Redlock,
    name: String,
    candidate: String,
    ttl: Duration,
    poll: Duration,
    record_key: String,
    channel: String,
    sidecar: Sidecar,
    notifier: OnceLock<Notifier>,
    /// This candidate's current term.
    term: Mutex<Option<Term>>,
    /// How many times a campaign went back to standing by (see `wait_standing_by`).
    standbys: tokio::sync::watch::Sender<u64>,
}

/// A term this candidate holds: shared by its [`Leadership`] guard and the [`Election`] (for
/// [`Election::is_leading`] and [`Election::health`]).
struct Term {
    token: FencingToken,
    lost: CancellationToken,
    lock: SharedLock,
}

/// The term's lock, taken out by resign (or the guard's drop).
type SharedLock = Arc<Mutex<Option<Lock>>>;

impl Term {
    /// True while the lost signal has not fired and the lock's validity has not run out.
    fn is_valid(&self) -> bool {
        !self.lost.is_cancelled() && lock(&self.lock).as_ref().is_some_and(|l| !l.is_lost())
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.inner.name)
            .field("candidate", &self.inner.candidate)
            .field("ttl", &self.inner.ttl)
            .field("poll_interval", &self.inner.poll)
            .finish()
    }
}

/// Configures an [`Election`]. Obtained from [`Election::builder`].
///
/// # Defaults
///
/// | setting | default |
/// | --- | --- |
/// | ttl of a term's lease | [`DEFAULT_TTL`](Self::DEFAULT_TTL) (10 s), extended every ttl / 3 |
/// | candidate id | `"<$HOSTNAME or host>-<pid>-<4 random hex digits>"` |
/// | poll interval | ttl / 4, ±25 % jitter |
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build() is called"]
pub struct ElectionBuilder {
    locks: Redlock,
    name: String,
    ttl: Duration,
    candidate: Option<String>,
    poll: Option<Duration>,
}

impl ElectionBuilder {
    /// The default ttl of a term's lease.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

    /// The lease ttl of a term: how long a crashed leader blocks the election (about one ttl),
    /// and how long a leader that cannot reach a quorum keeps leading before its lost signal
    /// fires (at most one ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// This candidate's id, published while it leads (must be distinct among candidates).
    pub fn candidate(mut self, id: impl Into<String>) -> Self {
        self.candidate = Some(id.into());
        self
    }

    /// The longest a standby waits between two attempts when no notification arrives (a random
    /// ±25 % is applied). Shorter means faster takeover when a resign notification is lost, at
    /// the cost of one attempt and one status read per interval and standby.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll = Some(interval);
        self
    }

    /// Builds the election. No connection is made.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a zero ttl or poll interval, a ttl above
    /// [`RedlockBuilder::MAX_TTL`] or a poll interval above [`RedlockBuilder::MAX_TIMING`]
    /// ([`ConfigError::TooLong`]). An invalid name or a ttl too short for
    /// the drift allowance is reported by the first [`campaign`](Election::campaign) or
    /// [`leader`](Election::leader) as [`Error::InvalidArgument`].
    pub fn build(self) -> Result<Election, Error> {
        if self.ttl.is_zero() {
            return Err(ConfigError::ZeroDuration("election ttl").into());
        }
        if self.ttl > RedlockBuilder::MAX_TTL {
            return Err(ConfigError::TooLong {
                name: "election ttl",
                value: self.ttl,
                max: RedlockBuilder::MAX_TTL,
            }
            .into());
        }
        let poll = self.poll.unwrap_or(self.ttl / 4);
        if poll.is_zero() {
            return Err(ConfigError::ZeroDuration("election poll interval").into());
        }
        if poll > RedlockBuilder::MAX_TIMING {
            return Err(ConfigError::TooLong {
                name: "election poll interval",
                value: poll,
                max: RedlockBuilder::MAX_TIMING,
            }
            .into());
        }
        let sidecar = Sidecar::new(&self.locks)?;
        let candidate = self.candidate.unwrap_or_else(default_candidate);
        let lock_key = keys::lock_key(&self.name);
        Ok(Election {
            inner: Arc::new(Inner {
                record_key: format!("{lock_key}:leader"),
                channel: format!("{lock_key}:events"),
                locks: self.locks,
                name: self.name,
                candidate,
                ttl: self.ttl,
                poll,
                sidecar,
                notifier: OnceLock::new(),
                term: Mutex::new(None),
                standbys: tokio::sync::watch::Sender::new(0),
            }),
        })
    }
}

fn default_candidate() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// Who leads an election, read from a quorum by [`Election::leader`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's candidate id; `None` while a new leader has not yet published its record
    /// (a few milliseconds after it won), or if it could not write it on any node.
    pub candidate: Option<String>,
    /// The term's fencing token: writes stamped with an older token come from an earlier term.
    pub token: FencingToken,
    /// How long the term lasts unless its leader extends it (it normally does, every ttl / 3).
    pub expires_in: Duration,
}

/// An item of [`Election::observe`]: what a quorum says about the election.
#[derive(Debug)]
#[non_exhaustive]
pub enum Observation {
    /// This candidate leads (a new term, or the same term whose leader published its id).
    Leader(Leader),
    /// Nobody leads (and the nodes that did not answer could not change that).
    Vacant,
    /// Too few nodes answered to tell, or the nodes that did not answer could complete a
    /// leader's quorum.
    Unknown(Error),
}

/// What a health check reports for one candidate, from [`Election::health`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Health {
    /// This candidate leads: it holds a term whose lost signal has not fired and whose validity
    /// has not run out.
    Leader {
        /// The term's fencing token.
        token: FencingToken,
    },
    /// This candidate does not lead, and a quorum of nodes answered.
    Standby {
        /// Who leads instead, if anyone.
        leader: Option<Leader>,
    },
    /// This candidate does not lead, and too few nodes answered to know who does (or the nodes
    /// that did not answer could complete a leader's quorum).
    Unknown {
        /// Why.
        error: Error,
    },
}

impl Health {
    /// True for [`Health::Leader`].
    pub fn is_leader(&self) -> bool {
        matches!(self, Health::Leader { .. })
    }

    /// `"leader"`, `"standby"` or `"unknown"`, for a health endpoint's body or a metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Health::Leader { .. } => "leader",
            Health::Standby { .. } => "standby",
            Health::Unknown { .. } => "unknown",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Health::Leader { token } => write!(f, "leader (token {token})"),
            Health::Standby { leader: Some(l) } => write!(
                f,
                "standby (leader {}, token {})",
                l.candidate.as_deref().unwrap_or("<unpublished>"),
                l.token
            ),
            Health::Standby { leader: None } => f.write_str("standby (no leader)"),
            Health::Unknown { error } => write!(f, "unknown ({error})"),
        }
    }
}

impl Election {
    /// Starts configuring an election called `name` over the nodes of `locks`.
    pub fn builder(locks: Redlock, name: impl Into<String>) -> ElectionBuilder {
        ElectionBuilder {
            locks,
            name: name.into(),
            ttl: ElectionBuilder::DEFAULT_TTL,
            candidate: None,
            poll: None,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// This candidate's id.
    pub fn candidate(&self) -> &str {
        &self.inner.candidate
    }

    /// The lease ttl of a term.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Campaigns until this candidate leads, however long that takes.
    ///
    /// While another candidate leads, this one waits as a standby: it retries at once when the
    /// leader resigns (notified through every node), when the leader's lease would have expired
    /// on a quorum (a crashed leader), and at the latest every poll interval. Too few reachable
    /// nodes are logged at warn and retried every poll interval.
    ///
    /// One campaign per candidate at a time: a candidate that already leads and campaigns again
    /// waits like any standby until its current term ends.
    ///
    /// # Errors
    ///
    /// Only [`Error::InvalidArgument`] (the name or ttl cannot work with the lock client's
    /// configuration): every other failure is retried.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe. If dropped after winning but before returning, the term is resigned in the
    /// background (and otherwise ends with its ttl).
    pub async fn campaign(&self) -> Result<Leadership, Error> {
        self.campaign_until(None).await
    }

    /// Campaigns for at most `wait`, then gives up with the last attempt's error.
    ///
    /// The wait is a hard bound on standing by: the call returns within `wait` (cutting short
    /// a wait, an attempt or a status read in progress), except that the first attempt always
    /// runs to its end (one round, bounded by the lock client's node timeout: a zero `wait`
    /// makes one attempt), and that a won term is taken up (the leader record written and
    /// announced, each step bounded by the node timeout) before returning.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when another candidate still leads after `wait`, [`Error::NoQuorum`] when
    /// too few nodes were reachable, [`Error::InvalidArgument`] as for
    /// [`campaign`](Self::campaign).
    ///
    /// # Cancellation safety
    ///
    /// As [`campaign`](Self::campaign).
    pub async fn campaign_timeout(&self, wait: Duration) -> Result<Leadership, Error> {
        // A wait too long for the clock (`Duration::MAX`) is no bound at all.
        self.campaign_until(Instant::now().checked_add(wait)).await
    }

    async fn campaign_until(&self, give_up: Option<Instant>) -> Result<Leadership, Error> {
        let inner = &*self.inner;
        // The receiver exists before the first attempt. The subscriptions come up in the
        // background; a resign before they do is caught by the status read or the poll.
        let mut notices = self.notices();
        let mut state = Campaign::default();
        let lock = match self.attempt(&mut state).await {
            Ok(lock) => lock,
            Err(e) if !e.is_retryable() => return Err(e),
            Err(e) => {
                state.last = Some(e);
                let standing_by = self.stand_by(&mut notices, &mut state);
                let won = match give_up {
                    None => standing_by.await,
                    Some(end) => match tokio::time::timeout_at(end, standing_by).await {
                        Ok(won) => won,
                        Err(_) => Err(state.last.take().unwrap_or_else(|| self.silent(end))),
                    },
                };
                match won {
                    Ok(lock) => lock,
                    Err(e) => {
                        tracing::debug!(election = %inner.name, error = %e, "campaign gave up");
                        return Err(e);
                    }
                }
            }
        };
        Ok(self.take_office(lock).await)
    }

    /// Waits and attempts again until an attempt wins or fails for good. `state.last` holds the
    /// last attempt's error throughout (the caller's error if it gives up midway).
    async fn stand_by(
        &self,
        notices: &mut broadcast::Receiver<Notice>,
        state: &mut Campaign,
    ) -> Result<Lock, Error> {
        let inner = &*self.inner;
        loop {
            let next = match &state.last {
                Some(Error::Held { .. }) => self.next_attempt_while_held(state).await,
                Some(Error::NoQuorum { .. }) => Instant::now() + self.poll_pause(),
                _ => Instant::now() + contention_pause(&inner.locks),
            };
            inner.standbys.send_modify(|n| *n += 1);
            let fresh = &mut state.fresh;
            wait_for(notices, next, |n| {
                fresh.first_copy(n) && !matches!(n, Notice::Elected { .. })
            })
            .await;
            match self.attempt(state).await {
                Ok(lock) => return Ok(lock),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => state.last = Some(e),
            }
        }
    }

    /// One attempt, logging changes between a reachable and an unreachable quorum.
    async fn attempt(&self, state: &mut Campaign) -> Result<Lock, Error> {
        let inner = &*self.inner;
        let result = inner.locks.try_acquire(&inner.name, inner.ttl).await;
        match &result {
            Ok(_) | Err(Error::Held { .. }) if state.degraded => {
                tracing::info!(election = %inner.name, "a quorum of nodes is reachable again");
                state.degraded = false;
            }
            Err(e @ Error::NoQuorum { .. }) => {
                if state.degraded {
                    tracing::debug!(election = %inner.name, error = %e, "still too few nodes to campaign");
                } else {
                    tracing::warn!(election = %inner.name, candidate = %inner.candidate, error = %e, "too few nodes reachable to campaign; nobody can lead until a quorum is back");
                    state.degraded = true;
                }
            }
            _ => {}
        }
        result
    }

    /// The error of a bounded campaign whose first attempt could not be followed by another
    /// before the end (not expected: the first attempt's error is normally kept).
    fn silent(&self, end: Instant) -> Error {
        let waited = end.elapsed();
        let failures = self
            .inner
            .locks
            .node_names()
            .into_iter()
            .map(|node| NodeFailure {
                node,
                cause: NodeError::Timeout(waited),
            })
            .collect::<Vec<_>>();
        Error::NoQuorum {
            key: self.inner.name.clone(),
            reached: 0,
            nodes: failures.len(),
            needed: self.inner.locks.quorum(),
            failures,
        }
    }

    /// After an attempt found the lock held: when a quorum of nodes will have let the current
    /// term expire (plus a random pause), but no later than the poll interval.
    ///
    /// When no value is held by a quorum (candidates that retried together split the nodes
    /// between them, and their attempts' keys are being released), the next attempt comes
    /// after the short contention pause instead, for up to [`SPLIT_ROUNDS`] rounds in a row.
    async fn next_attempt_while_held(&self, state: &mut Campaign) -> Instant {
        let inner = &*self.inner;
        let status = inner.locks.status(&inner.name).await;
        let now = Instant::now();
        if let Ok(s) = &status
            && s.holder_view() == HolderView::Vacant
            && s.answered() >= s.quorum
            && state.split_rounds < SPLIT_ROUNDS
        {
            state.split_rounds += 1;
            tracing::debug!(election = %inner.name, round = state.split_rounds, "no candidate holds a quorum (a split vote); retrying after a short pause");
            return now + contention_pause(&inner.locks);
        }
        state.split_rounds = 0;
        let poll = now + self.poll_pause();
        let free_in = status.ok().and_then(|s| free_in(&s));
        tracing::debug!(election = %inner.name, ?free_in, "another candidate leads; standing by");
        match free_in {
            // `d` comes from the nodes' PTTL: a foreign key with an absurd ttl must not
            // overflow the clock.
            Some(d) => (clock::tokio_after(now, d) + contention_pause(&inner.locks)).min(poll),
            None => poll,
        }
    }

    /// Test support (feature `testkit`; not a stable API): waits until campaigns on this
    /// election (this handle and its clones) have gone back to standing by at least `n` times
    /// in all. A campaign stands by after every attempt that did not win, once it has read the
    /// lock's state and computed its next attempt: a resign announced after this resolves
    /// wakes it (if its subscriptions are up).
    #[cfg(feature = "testkit")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
    #[doc(hidden)]
    pub async fn wait_standing_by(&self, n: u64) {
        let mut rx = self.inner.standbys.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// How many times campaigns on this election have gone back to standing by (see
    /// [`wait_standing_by`](Self::wait_standing_by)).
    #[cfg(feature = "testkit")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
    #[doc(hidden)]
    pub fn standing_by_count(&self) -> u64 {
        *self.inner.standbys.borrow()
    }

    fn poll_pause(&self) -> Duration {
        self.inner.poll.mul_f64(0.75 + 0.5 * rand::random::<f64>())
    }

    /// Starts the subscriptions on first use and returns a receiver of their notices. Without
    /// a tokio runtime there are no subscriptions (a later call in a runtime starts them): the
    /// receiver is closed, and standbys and observers rely on their timers alone.
    fn notices(&self) -> broadcast::Receiver<Notice> {
        let inner = &*self.inner;
        if let Some(notifier) = inner.notifier.get() {
            return notifier.tx.subscribe();
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => inner
                .notifier
                .get_or_init(|| {
                    inner.sidecar.warm_up();
                    Notifier::start(&inner.sidecar, &inner.channel, &handle)
                })
                .tx
                .subscribe(),
            Err(_) => {
                tracing::debug!(election = %inner.name, "no tokio runtime: no notifications, polling only");
                broadcast::channel(1).1
            }
        }
    }

    async fn take_office(&self, lock: Lock) -> Leadership {
        let inner = &*self.inner;
        lock.keep_alive();
        let lost = lock.lost_token();
        let token = lock.token();
        let shared: SharedLock = Arc::new(Mutex::new(Some(lock)));
        *lock_term(inner) = Some(Term {
            token,
            lost: lost.clone(),
            lock: Arc::clone(&shared),
        });
        // The guard exists before the next await: a cancelled campaign resigns through its Drop.
        let mut leadership = Leadership {
            election: self.clone(),
            lock: shared,
            token,
            lost,
            record: None,
            since: std::time::Instant::now(),
        };
        leadership.record = self.publish_record(&leadership).await;
        tracing::info!(election = %inner.name, candidate = %inner.candidate, %token, "elected leader");
        leadership
    }

    /// Writes the leader record on every node that holds our lock value, then announces the
    /// term. Returns the record (`None` when our lock value could not be confirmed, so none
    /// was written).
    async fn publish_record(&self, leadership: &Leadership) -> Option<String> {
        let inner = &*self.inner;
        let token = leadership.token;
        let candidate = &inner.candidate;
        let record = match Self::own_value(leadership) {
            Some(value) => {
                let record = format!("{value} {token} {candidate}");
                let lock_key = keys::lock_key(&inner.name);
                let (lock_key, record_key, value, rec) =
                    (&lock_key, &inner.record_key, &value, &record);
                let replies = inner
                    .sidecar
                    .all(move |mut c| async move {
                        let mut call = WRITE_RECORD.prepare_invoke();
                        call.key(lock_key).key(record_key).arg(value).arg(rec);
                        call.invoke_async::<i64>(&mut c).await
                    })
                    .await;
                let written = replies.iter().filter(|r| matches!(r, Ok(1))).count();
                if written == 0 {
                    tracing::warn!(election = %inner.name, %token, failures = %FailureList(&inner.sidecar.failures(&replies)), "could not write the leader record on any node; readers will not know this leader's id");
                } else {
                    tracing::debug!(election = %inner.name, %token, written, "leader record written");
                }
                // Kept even if no node confirmed it: resign deletes it wherever it landed.
                Some(record)
            }
            None => {
                tracing::warn!(election = %inner.name, %token, "could not confirm this term's lock value on a quorum; no leader record written, readers will not know this leader's id");
                None
            }
        };
        let message = Notice::elected(token, candidate);
        let (channel, message) = (&inner.channel, &message);
        inner
            .sidecar
            .all(move |mut c| async move {
                redis::cmd("PUBLISH")
                    .arg(channel)
                    .arg(message)
                    .query_async::<i64>(&mut c)
                    .await
            })
            .await;
        record
    }

    /// This term's lock value, while the term is valid.
    fn own_value(leadership: &Leadership) -> Option<String> {
        if leadership.is_lost() {
            return None;
        }
        lock(&leadership.lock)
            .as_ref()
            .map(|lock| lock.value().to_owned())
    }

    /// Deletes our record and announces the resignation on every node.
    async fn announce_resign(&self, token: FencingToken, record: Option<&str>) {
        let inner = &*self.inner;
        let message = Notice::resigned(token, &inner.candidate);
        let (record_key, record, channel, message) = (
            &inner.record_key,
            record.unwrap_or_default(),
            &inner.channel,
            &message,
        );
        let replies = inner
            .sidecar
            .all(move |mut c| async move {
                let mut call = RESIGN.prepare_invoke();
                call.key(record_key).arg(record).arg(channel).arg(message);
                call.invoke_async::<i64>(&mut c).await
            })
            .await;
        let reached: i64 = replies.iter().filter_map(|r| r.as_ref().ok()).sum();
        tracing::debug!(election = %inner.name, %token, subscribers = reached, "resignation announced");
    }

    fn end_term(&self, token: FencingToken) {
        let mut term = lock_term(&self.inner);
        if term.as_ref().is_some_and(|t| t.token == token) {
            *term = None;
        }
    }

    /// True while this candidate holds a term whose lost signal has not fired and whose
    /// validity has not run out. No I/O.
    pub fn is_leading(&self) -> bool {
        self.current_term().is_some()
    }

    fn current_term(&self) -> Option<FencingToken> {
        lock_term(&self.inner)
            .as_ref()
            .filter(|t| t.is_valid())
            .map(|t| t.token)
    }

    /// Who leads now, and since which token, read from every node (a quorum must answer).
    ///
    /// The leader is the lock value held by a quorum; its id comes from the leader record bound
    /// to that value. `Ok(None)` means nobody leads: no value stands on a quorum, and the nodes
    /// that did not answer could not complete one either.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when fewer than a quorum of nodes answered, or when the nodes that did
    /// not answer could still complete a quorum for some value (the leader's key on nodes
    /// {0,1,2}, a read that reached {1,2,3,4}: it may lead, or not); each unanswered node is
    /// named. [`Error::InvalidArgument`] for an invalid election name.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let inner = &*self.inner;
        let record_key = &inner.record_key;
        let (status, records) = tokio::join!(
            inner.locks.status(&inner.name),
            inner.sidecar.all(move |mut c| async move {
                redis::cmd("GET")
                    .arg(record_key)
                    .query_async::<Option<String>>(&mut c)
                    .await
            })
        );
        let status = status?;
        // Named after the election (the status' key is the election's name too).
        status.require_quorum()?;
        if status.holder_view() == HolderView::Unknown {
            return Err(status.unanswered());
        }
        let records: Vec<String> = records
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        Ok(leader_from(&status, &records))
    }

    /// This candidate's role, for a health check: [`Health::Leader`] from its own term (no I/O),
    /// otherwise a quorum read ([`leader`](Self::leader)) tells standby from unknown.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn health(&self) -> Health {
        if let Some(token) = self.current_term() {
            return Health::Leader { token };
        }
        match self.leader().await {
            Ok(leader) => Health::Standby { leader },
            Err(error) => Health::Unknown { error },
        }
    }

    /// A stream of leadership changes, for anyone (candidate or not): the current state first,
    /// then an item each time the leader (its token or id) changes, nobody leads any more, or
    /// the nodes stop answering. Driven by the election's notifications, by the current term's
    /// expiry and by the poll interval.
    ///
    /// Subscriptions start when the stream is first polled; it needs a tokio runtime.
    pub fn observe(&self) -> impl Stream<Item = Observation> + Send + 'static {
        let state = Observer {
            election: self.clone(),
            notices: None,
            fresh: Fresh::default(),
            last: None,
            wait_until: None,
        };
        futures::stream::unfold(state, |mut st| async move {
            let obs = st.next().await;
            Some((obs, st))
        })
    }

    /// One read for observers: re-reads a few times while a new leader's id is not published.
    async fn observe_once(&self) -> Observation {
        for _ in 0..3 {
            match self.leader().await {
                Ok(Some(l)) if l.candidate.is_none() => {
                    tokio::time::sleep(contention_pause(&self.inner.locks)).await;
                }
                Ok(Some(l)) => return Observation::Leader(l),
                Ok(None) => return Observation::Vacant,
                Err(e) => return Observation::Unknown(e),
            }
        }
        match self.leader().await {
            Ok(Some(l)) => Observation::Leader(l),
            Ok(None) => Observation::Vacant,
            Err(e) => Observation::Unknown(e),
        }
    }
}

fn lock_term(inner: &Inner) -> std::sync::MutexGuard<'_, Option<Term>> {
    lock(&inner.term)
}

/// The state of an [`Election::observe`] stream.
struct Observer {
    election: Election,
    notices: Option<broadcast::Receiver<Notice>>,
    /// Notices already acted on (so the N copies of one cause one read).
    fresh: Fresh,
    last: Option<Seen>,
    wait_until: Option<Instant>,
}

/// What an observer last reported, to report changes only.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Leader(FencingToken, Option<String>),
    Vacant,
    Unknown,
}

impl Observer {
    async fn next(&mut self) -> Observation {
        let notices = self.notices.get_or_insert_with(|| self.election.notices());
        loop {
            if let Some(until) = self.wait_until.take() {
                let fresh = &mut self.fresh;
                wait_for(notices, until, |n| fresh.first_copy(n)).await;
            }
            let obs = self.election.observe_once().await;
            let poll = self.election.poll_pause();
            let (key, wait) = match &obs {
                Observation::Leader(l) => (
                    Seen::Leader(l.token, l.candidate.clone()),
                    (l.expires_in + Duration::from_millis(5)).min(poll),
                ),
                Observation::Vacant => (Seen::Vacant, poll),
                Observation::Unknown(_) => (Seen::Unknown, poll),
            };
            self.wait_until = Some(Instant::now() + wait);
            if self.last.as_ref() != Some(&key) {
                self.last = Some(key);
                return obs;
            }
        }
    }
}

/// How long until a quorum of the nodes that answered no longer holds the key (absent keys count
/// as free now); `None` when fewer than a quorum answered or the key never expires.
fn free_in(status: &LockStatus) -> Option<Duration> {
    let mut free: Vec<Duration> = status
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok())
        .filter_map(|s| match (&s.value, s.ttl) {
            (None, _) => Some(Duration::ZERO),
            (Some(_), ttl) => ttl,
        })
        .collect();
    free.sort();
    free.get(status.quorum.checked_sub(1)?).copied()
}

/// The leader a status read and the leader records describe.
fn leader_from(status: &LockStatus, records: &[String]) -> Option<Leader> {
    let value = status.holder()?;
    let held: Vec<_> = status
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok())
        .filter(|s| s.value.as_deref() == Some(value))
        .collect();
    let record = records.iter().find_map(|r| {
        let mut parts = r.splitn(3, ' ');
        if parts.next()? != value {
            return None;
        }
        let token: u64 = parts.next()?.parse().ok()?;
        Some((token, parts.next().unwrap_or_default().to_owned()))
    });
    // Without a record: the counter most of the holding nodes agree on (the acquisition brought
    // a quorum of them to the token; a node that answered it late may stand higher or lower),
    // the highest of equals (the token is the highest counter of the nodes that answered the
    // acquisition in time, so a lower one of equals is a late node's).
    let token = record.as_ref().map(|(t, _)| *t).unwrap_or_else(|| {
        let mut fences: Vec<u64> = held.iter().map(|s| s.fence).collect();
        fences.sort_unstable();
        let count = |f: &u64| fences.iter().filter(|g| *g == f).count();
        // `max_by_key` keeps the last of equals: in ascending order, the highest.
        fences.iter().copied().max_by_key(count).unwrap_or(0)
    });
    let mut ttls: Vec<Duration> = held.iter().filter_map(|s| s.ttl).collect();
    ttls.sort_by(|a, b| b.cmp(a));
    let expires_in = ttls
        .get(status.quorum.saturating_sub(1))
        .copied()
        .unwrap_or_default();
    Some(Leader {
        candidate: record.map(|(_, c)| c),
        token: FencingToken::new(token),
        expires_in,
    })
}

// ------------------------------------------------------------------------------------------------
// The leader's guard.

/// A won term of an [`Election`]: this candidate leads while the guard lives and its lost signal
/// has not fired.
///
/// The guard holds the term's lock and extends it every ttl / 3. Stamp every write made as
/// leader with [`token`](Self::token), and stop acting the moment [`lost`](Self::lost) resolves
/// (the lease could not be extended on a quorum, or its validity ran out): another candidate may
/// lead by then.
///
/// # Stepping down
///
/// Call [`resign`](Self::resign): it releases the lock on every node and notifies the standbys,
/// which take over at once. Dropping the guard does the same in the background (when a tokio
/// runtime is running); a crashed leader's term ends with its ttl.
#[must_use = "dropping the leadership resigns at once (in the background)"]
pub struct Leadership {
    election: Election,
    /// The term's lock; `None` once resigned.
    lock: SharedLock,
    token: FencingToken,
    lost: CancellationToken,
    record: Option<String>,
    since: std::time::Instant,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election.inner.name)
            .field("candidate", &self.election.inner.candidate)
            .field("token", &self.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &str {
        &self.election.inner.name
    }

    /// This leader's candidate id.
    pub fn candidate(&self) -> &str {
        &self.election.inner.candidate
    }

    /// The term's fencing token (the lock's token): greater than every earlier term's.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When this candidate took office.
    pub fn since(&self) -> std::time::Instant {
        self.since
    }

    /// Validity left on the term's lease now (zero once lost).
    pub fn validity(&self) -> Duration {
        lock(&self.lock)
            .as_ref()
            .map_or(Duration::ZERO, Lock::validity)
    }

    /// True once the leadership is lost (see [`lost`](Self::lost)).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || lock(&self.lock).as_ref().is_none_or(Lock::is_lost)
    }

    /// Why the leadership was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        lock(&self.lock).as_ref().and_then(Lock::lost_reason)
    }

    /// A future that resolves when the leadership is lost: the lease could not be extended on a
    /// quorum before its validity ran out, or a quorum says another term holds the lock.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe; it only waits.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost = self.lost.clone();
        async move { lost.cancelled().await }
    }

    /// A token cancelled when the leadership is lost (or resigned), to hand to tasks that act
    /// as leader.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Steps down at once: releases the term's lock on every node, deletes the leader record
    /// and notifies the standbys on every node, so that one of them leads within milliseconds.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the term had already ended (another candidate may lead: work done
    /// since then may have overlapped, which fencing tokens catch); [`Error::NoQuorum`] when too
    /// few nodes answered (the rest of the term expires with its ttl). The standbys are notified
    /// in every case.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: if dropped midway, the lock is released in the background; the notification
    /// may then be missing, and standbys take over at their next poll.
    pub async fn resign(self) -> Result<(), Error> {
        let Some(lock) = lock(&self.lock).take() else {
            return Ok(());
        };
        self.election.end_term(self.token);
        let result = lock.release().await;
        self.election
            .announce_resign(self.token, self.record.as_deref())
            .await;
        tracing::info!(election = %self.name(), candidate = %self.candidate(), token = %self.token, "resigned");
        result
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        let Some(lock) = lock(&self.lock).take() else {
            return;
        };
        self.election.end_term(self.token);
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // the lock's own Drop stops its lease; the ttl ends the term
        };
        let (election, token, record) = (self.election.clone(), self.token, self.record.take());
        tracing::debug!(election = %election.inner.name, %token, "leadership dropped; resigning in the background");
        handle.spawn(async move {
            if lock.is_lost() {
                drop(lock);
            } else if let Err(e) = lock.release().await {
                tracing::debug!(election = %election.inner.name, error = %e, "background resign");
            }
            election.announce_resign(token, record.as_deref()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::status::{KeyState, NodeStatus};

    fn node(value: Option<&str>, ttl_ms: Option<u64>, fence: u64) -> NodeStatus {
        NodeStatus {
            node: "n".to_owned(),
            state: Ok(KeyState {
                value: value.map(str::to_owned),
                ttl: ttl_ms.map(Duration::from_millis),
                fence,
            }),
            eviction: crate::EvictionRisk::None,
        }
    }

    fn down() -> NodeStatus {
        NodeStatus {
            node: "n".to_owned(),
            state: Err(NodeError::Timeout(Duration::ZERO)),
            eviction: crate::EvictionRisk::Unknown,
        }
    }

    fn status(nodes: Vec<NodeStatus>) -> LockStatus {
        LockStatus {
            key: "e".to_owned(),
            quorum: nodes.len() / 2 + 1,
            nodes,
        }
    }

    #[test]
    fn notices_round_trip_and_keep_spaces_in_ids() {
        let t = FencingToken::new(7);
        assert_eq!(
            Notice::parse(&Notice::elected(t, "host a")),
            Some(Notice::Elected {
                token: 7,
                candidate: "host a".to_owned()
            })
        );
        assert_eq!(
            Notice::parse(&Notice::resigned(t, "")),
            Some(Notice::Resigned {
                token: 7,
                candidate: String::new()
            })
        );
        assert_eq!(Notice::parse("other 7 x"), None);
        assert_eq!(Notice::parse("elected x"), None);
    }

    #[test]
    fn free_in_is_the_quorum_th_shortest_ttl() {
        let s = status(vec![
            node(Some("v"), Some(900), 3),
            node(None, None, 3),
            node(Some("v"), Some(500), 3),
            node(Some("v"), Some(700), 3),
            down(),
        ]);
        // Free now on one node, after 500 ms on a second, after 700 ms on a third (the quorum).
        assert_eq!(free_in(&s), Some(Duration::from_millis(700)));
        let two_answered = status(vec![
            node(None, None, 0),
            node(None, None, 0),
            down(),
            down(),
            down(),
        ]);
        assert_eq!(free_in(&two_answered), None);
        // A key without expiry never frees.
        let forever = status(vec![node(Some("v"), None, 1); 3]);
        assert_eq!(free_in(&forever), None);
    }

    #[test]
    fn leader_comes_from_the_record_bound_to_the_quorum_value() {
        let s = status(vec![
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(800), 8),
            node(Some("new"), Some(950), 9), // answered the acquisition late
            node(Some("old"), Some(100), 5),
            down(),
        ]);
        let records = vec!["old 5 crashed".to_owned(), "new 8 host b".to_owned()];
        let l = leader_from(&s, &records).expect("a leader");
        assert_eq!(l.candidate.as_deref(), Some("host b"));
        assert_eq!(l.token, FencingToken::new(8));
        // Fewer than a quorum would hold it after the third-longest ttl.
        assert_eq!(l.expires_in, Duration::from_millis(800));

        // Only the stale record: the id is unknown, the token is the quorum's counter.
        let l = leader_from(&s, &records[..1]).expect("a leader");
        assert_eq!(l.candidate, None);
        assert_eq!(l.token, FencingToken::new(8));
        let counters_disagree = status(vec![
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 9),
            node(Some("new"), Some(900), 7),
        ]);
        // No majority among the holders: the highest counter (the token is the highest
        // counter among the nodes that answered the acquisition in time).
        assert_eq!(
            leader_from(&counters_disagree, &[]).unwrap().token,
            FencingToken::new(9)
        );
        // A tie: two nodes at 8 (the token; raised by the acquisition), two late ones at 6.
        let tie = status(vec![
            node(Some("new"), Some(900), 6),
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 6),
            down(),
        ]);
        assert_eq!(leader_from(&tie, &[]).unwrap().token, FencingToken::new(8));
        // A majority wins over a higher late counter.
        let late_higher = status(vec![
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 12),
        ]);
        assert_eq!(
            leader_from(&late_higher, &[]).unwrap().token,
            FencingToken::new(8)
        );
    }

    #[test]
    fn no_leader_without_a_quorum_value() {
        let s = status(vec![
            node(Some("a"), Some(900), 1),
            node(Some("a"), Some(900), 1),
            node(Some("b"), Some(900), 2),
            node(None, None, 2),
            down(),
        ]);
        assert_eq!(leader_from(&s, &["a 1 x".to_owned()]), None);
    }
}
