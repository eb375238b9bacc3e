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
//!   written by the new leader on every node where its lock and fencing counter stand. The lock
//!   value is random per acquisition, so the record binds the candidate id to one exact term: a
//!   reader trusts a record only when its lock value is the one a quorum holds now. A stale record
//!   (a crashed leader's) therefore never names the wrong leader. The record has no expiry (like
//!   the fencing counter, it is one small key per election); resign deletes it.
//! - `quorumlock:{NAME}:events`, a pub/sub channel: `"elected <token> <id>"` after the record is
//!   written, `"resigned <token> <id>"` after a resign released the lock. Each [`Election`]
//!   subscribes on every node (one connection per node, reconnected with backoff) so that a
//!   standby retries the moment the leader resigns; notifications from several nodes are
//!   deduplicated by token.
//!
//! Notifications can be lost (a node down, a subscription being re-established), so standbys
//! never rely on them alone: after a refused attempt a standby reads the lock's remaining time to
//! live on every node and sleeps until a quorum of them would have expired it (that is what makes
//! crash handover take about one ttl), and never longer than the poll interval (with jitter).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use redis::Script;
use redis::aio::MultiplexedConnection;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::error::{ConfigError, Error, LostReason, NodeError, NodeFailure};
use crate::fencing::FencingToken;
use crate::guard::Lock;
use crate::node::{node_name, redact};
use crate::quorum;
use crate::redlock::{LockStatus, Redlock};
use crate::scripts;

/// Writes the leader record where this term's lock and fencing counter stand.
///
/// - KEYS[1]: lock key, KEYS[2]: fencing counter, KEYS[3]: leader record
/// - ARGV[1]: the term's token, ARGV[2]: the candidate id
/// - Reply: the lock value the record was bound to, or nil when this node's counter is not at
///   the token (a node that missed the acquisition, or one that answered it late).
static WRITE_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.call('GET', KEYS[1])
if v and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[3], v .. ' ' .. ARGV[1] .. ' ' .. ARGV[2])
  return v
end
return false
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

/// One plain connection per node of a [`Redlock`], for what the lock client does not do itself:
/// the leader record, pub/sub announcements and the scheduler's tick markers. Uses the lock's
/// node URLs and timeouts.
pub(crate) struct Sidecar {
    nodes: Vec<SideNode>,
    node_timeout: Duration,
    connect_timeout: Duration,
}

struct SideNode {
    name: String,
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
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
        let nodes = cfg
            .urls
            .iter()
            .map(|url| {
                let client = redis::Client::open(url.as_str()).map_err(|source| {
                    ConfigError::InvalidUrl {
                        url: redact(url),
                        source,
                    }
                })?;
                Ok(SideNode {
                    name: node_name(client.get_connection_info()),
                    client,
                    conn: Mutex::new(None),
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        Ok(Sidecar {
            nodes,
            node_timeout: cfg.node_timeout,
            connect_timeout: cfg.connect_timeout,
        })
    }

    /// Runs `op` on every node at once, each call bounded by the node timeout (plus the connect
    /// timeout when a connection must be made first). Replies in node order.
    pub(crate) async fn all<T, F, Fut>(&self, op: F) -> Vec<Result<T, NodeError>>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let calls = self
            .nodes
            .iter()
            .map(|n| n.call(&op, self.node_timeout, self.connect_timeout));
        futures::future::join_all(calls).await
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

    fn clients(&self) -> impl Iterator<Item = (&str, &redis::Client)> {
        self.nodes.iter().map(|n| (n.name.as_str(), &n.client))
    }
}

impl SideNode {
    async fn call<T, F, Fut>(
        &self,
        op: &F,
        node_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<T, NodeError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let cached = lock(&self.conn).clone();
        let conn = match cached {
            Some(conn) => conn,
            None => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(None);
                let conn = tokio::time::timeout(
                    connect_timeout,
                    self.client
                        .get_multiplexed_async_connection_with_config(&config),
                )
                .await
                .map_err(|_| NodeError::Timeout(connect_timeout))?
                .map_err(NodeError::from_redis)?;
                *lock(&self.conn) = Some(conn.clone());
                conn
            }
        };
        match tokio::time::timeout(node_timeout, op(conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.is_unrecoverable_error() || e.is_connection_dropped() || e.is_io_error() {
                    *lock(&self.conn) = None;
                }
                tracing::debug!(node = %self.name, error = %e, "side call failed");
                Err(NodeError::from_redis(e))
            }
            Err(_) => Err(NodeError::Timeout(node_timeout)),
        }
    }
}

/// Locks a mutex, recovering from poisoning (the data are plain values, always consistent).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pause between attempts that compete for a free lock: the lock client's retry delay plus
/// its random jitter, so that competitors desynchronise.
pub(crate) fn contention_pause(locks: &Redlock) -> Duration {
    let cfg = &locks.inner.cfg;
    quorum::retry_delay(cfg.retry_delay, cfg.retry_jitter, rand::random::<f64>())
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

    fn start(sidecar: &Sidecar, channel: &str) -> Self {
        let (tx, _) = broadcast::channel(64);
        let tasks = sidecar
            .clients()
            .map(|(name, client)| {
                AbortOnDropHandle::new(tokio::spawn(Self::subscribe(
                    client.clone(),
                    name.to_owned(),
                    channel.to_owned(),
                    tx.clone(),
                    sidecar.connect_timeout,
                )))
            })
            .collect();
        Notifier { tx, _tasks: tasks }
    }

    /// Subscribes on one node for as long as the notifier lives, reconnecting with backoff.
    async fn subscribe(
        client: redis::Client,
        node: String,
        channel: String,
        tx: broadcast::Sender<Notice>,
        connect_timeout: Duration,
    ) {
        let mut pause = Self::MIN_PAUSE;
        let mut subscribed_before = false;
        loop {
            let pubsub = tokio::time::timeout(connect_timeout, async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            })
            .await;
            match pubsub {
                Ok(Ok(mut pubsub)) => {
                    tracing::debug!(%node, channel, "subscribed");
                    if subscribed_before {
                        let _ = tx.send(Notice::Resubscribed);
                    }
                    subscribed_before = true;
                    pause = Self::MIN_PAUSE;
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        let payload: String = msg.get_payload().unwrap_or_default();
                        if let Some(notice) = Notice::parse(&payload) {
                            let _ = tx.send(notice);
                        }
                    }
                    tracing::debug!(%node, channel, "subscription ended; resubscribing");
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

/// Why a wait ended.
#[derive(Debug, PartialEq, Eq)]
enum Woke {
    Timer,
    Notice,
}

/// Waits until `until`, or until a notice for which `wake` says yes (or notices were missed).
async fn wait_for(
    notices: &mut broadcast::Receiver<Notice>,
    until: Instant,
    mut wake: impl FnMut(&Notice) -> bool,
) -> Woke {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return Woke::Timer,
            notice = notices.recv() => match notice {
                Ok(n) if wake(&n) => return Woke::Notice,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return Woke::Notice,
                Err(broadcast::error::RecvError::Closed) => {
                    tokio::time::sleep_until(until).await;
                    return Woke::Timer;
                }
            }
        }
    }
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
    /// This candidate's current term: its token and lost signal.
    term: Mutex<Option<(FencingToken, CancellationToken)>>,
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
    /// [`Error::Config`] for a zero ttl or poll interval. An invalid name or a ttl too short for
    /// the drift allowance is reported by the first [`campaign`](Election::campaign) or
    /// [`leader`](Election::leader) as [`Error::InvalidArgument`].
    pub fn build(self) -> Result<Election, Error> {
        if self.ttl.is_zero() {
            return Err(ConfigError::ZeroDuration("election ttl").into());
        }
        let poll = self.poll.unwrap_or(self.ttl / 4);
        if poll.is_zero() {
            return Err(ConfigError::ZeroDuration("election poll interval").into());
        }
        let sidecar = Sidecar::new(&self.locks)?;
        let candidate = self.candidate.unwrap_or_else(default_candidate);
        let lock_key = scripts::lock_key(&self.name);
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
    /// Nobody leads.
    Vacant,
    /// Too few nodes answered to tell.
    Unknown(Error),
}

/// What a health check reports for one candidate, from [`Election::health`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Health {
    /// This candidate leads: it holds a term whose lost signal has not fired.
    Leader {
        /// The term's fencing token.
        token: FencingToken,
    },
    /// This candidate does not lead, and a quorum of nodes answered.
    Standby {
        /// Who leads instead, if anyone.
        leader: Option<Leader>,
    },
    /// This candidate does not lead, and too few nodes answered to know who does.
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
        self.campaign_until(Some(Instant::now() + wait)).await
    }

    async fn campaign_until(&self, give_up: Option<Instant>) -> Result<Leadership, Error> {
        let inner = &*self.inner;
        // The receiver exists before the first attempt. The subscriptions come up in the
        // background; a resign before they do is caught by the status read or the poll.
        let mut notices = self.notices();
        let mut acted_on = 0u64;
        let mut degraded = false;
        loop {
            let err = match inner.locks.try_acquire(&inner.name, inner.ttl).await {
                Ok(lock) => {
                    if degraded {
                        tracing::info!(election = %inner.name, "a quorum of nodes is reachable again");
                    }
                    return Ok(self.take_office(lock).await);
                }
                Err(e) => e,
            };
            let next = match &err {
                Error::Held { .. } => {
                    if degraded {
                        tracing::info!(election = %inner.name, "a quorum of nodes is reachable again");
                        degraded = false;
                    }
                    self.next_attempt_while_held().await
                }
                Error::NoQuorum { .. } => {
                    if degraded {
                        tracing::debug!(election = %inner.name, error = %err, "still too few nodes to campaign");
                    } else {
                        tracing::warn!(election = %inner.name, candidate = %inner.candidate, error = %err, "too few nodes reachable to campaign; nobody can lead until a quorum is back");
                        degraded = true;
                    }
                    Instant::now() + self.poll_pause()
                }
                Error::ValidityExpired { .. } => Instant::now() + contention_pause(&inner.locks),
                _ => return Err(err),
            };
            let until = give_up.map_or(next, |end| next.min(end));
            let woke = wait_for(&mut notices, until, |n| match n {
                Notice::Resigned { token, .. } if *token > acted_on => {
                    acted_on = *token;
                    true
                }
                Notice::Resubscribed => true,
                _ => false,
            })
            .await;
            if woke == Woke::Timer && give_up.is_some_and(|end| Instant::now() >= end) {
                tracing::debug!(election = %inner.name, error = %err, "campaign gave up");
                return Err(err);
            }
        }
    }

    /// After an attempt found the lock held: when a quorum of nodes will have let the current
    /// term expire (plus a random pause), but no later than the poll interval.
    async fn next_attempt_while_held(&self) -> Instant {
        let inner = &*self.inner;
        let status = inner.locks.status(&inner.name).await;
        let now = Instant::now();
        let poll = now + self.poll_pause();
        let free_in = status.ok().and_then(|s| free_in(&s));
        tracing::debug!(election = %inner.name, ?free_in, "another candidate leads; standing by");
        match free_in {
            Some(d) => (now + d + contention_pause(&inner.locks)).min(poll),
            None => poll,
        }
    }

    fn poll_pause(&self) -> Duration {
        self.inner.poll.mul_f64(0.75 + 0.5 * rand::random::<f64>())
    }

    /// Starts the subscriptions on first use and returns a receiver of their notices.
    fn notices(&self) -> broadcast::Receiver<Notice> {
        let inner = &*self.inner;
        inner
            .notifier
            .get_or_init(|| Notifier::start(&inner.sidecar, &inner.channel))
            .tx
            .subscribe()
    }

    async fn take_office(&self, lock: Lock) -> Leadership {
        let inner = &*self.inner;
        lock.keep_alive();
        let lost = lock.lost_token();
        let token = lock.token();
        *lock_term(inner) = Some((token, lost.clone()));
        // The guard exists before the next await: a cancelled campaign resigns through its Drop.
        let mut leadership = Leadership {
            election: self.clone(),
            lock: Some(lock),
            token,
            lost,
            record: None,
            since: std::time::Instant::now(),
        };
        leadership.record = self.publish_record(token).await;
        tracing::info!(election = %inner.name, candidate = %inner.candidate, %token, "elected leader");
        leadership
    }

    /// Writes the leader record on every node, then announces the term. Returns the record
    /// written (`None` if no node took it).
    async fn publish_record(&self, token: FencingToken) -> Option<String> {
        let inner = &*self.inner;
        let (lock_key, fence_key) = (
            scripts::lock_key(&inner.name),
            scripts::fence_key(&inner.name),
        );
        let raw = token.get();
        let (lock_key, fence_key, record_key, candidate) =
            (&lock_key, &fence_key, &inner.record_key, &inner.candidate);
        let replies = inner
            .sidecar
            .all(move |mut c| async move {
                let mut call = WRITE_RECORD.prepare_invoke();
                call.key(lock_key)
                    .key(fence_key)
                    .key(record_key)
                    .arg(raw)
                    .arg(candidate);
                call.invoke_async::<Option<String>>(&mut c).await
            })
            .await;
        let bound = most_common(replies.into_iter().filter_map(|r| r.ok().flatten()));
        if bound.is_none() {
            tracing::warn!(election = %inner.name, %token, "could not write the leader record on any node; readers will not know this leader's id");
        }
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
        bound.map(|v| format!("{v} {token} {candidate}"))
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
        if term.as_ref().is_some_and(|(t, _)| *t == token) {
            *term = None;
        }
    }

    /// True while this candidate holds a term whose lost signal has not fired. No I/O.
    pub fn is_leading(&self) -> bool {
        self.current_term().is_some()
    }

    fn current_term(&self) -> Option<FencingToken> {
        lock_term(&self.inner)
            .as_ref()
            .filter(|(_, lost)| !lost.is_cancelled())
            .map(|(t, _)| *t)
    }

    /// Who leads now, and since which token, read from every node (a quorum must answer).
    ///
    /// The leader is the lock value held by a quorum; its id comes from the leader record bound
    /// to that value. `Ok(None)` means nobody leads.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when fewer than a quorum of nodes answered (each failure named);
    /// [`Error::InvalidArgument`] for an invalid election name.
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

fn lock_term(
    inner: &Inner,
) -> std::sync::MutexGuard<'_, Option<(FencingToken, CancellationToken)>> {
    lock(&inner.term)
}

/// The state of an [`Election::observe`] stream.
struct Observer {
    election: Election,
    notices: Option<broadcast::Receiver<Notice>>,
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
        let mut last_notice: Option<Notice> = None;
        loop {
            if let Some(until) = self.wait_until.take() {
                wait_for(notices, until, |n| {
                    let fresh = last_notice.as_ref() != Some(n) || *n == Notice::Resubscribed;
                    last_notice = Some(n.clone());
                    fresh
                })
                .await;
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
    // a quorum of them to the token; a node that answered it late may stand higher), the lower
    // of equals.
    let token = record.as_ref().map(|(t, _)| *t).unwrap_or_else(|| {
        let mut fences: Vec<u64> = held.iter().map(|s| s.fence).collect();
        fences.sort_unstable();
        let count = |f: &u64| fences.iter().filter(|g| *g == f).count();
        fences.iter().copied().rev().max_by_key(count).unwrap_or(0)
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

/// The value that occurs most often (the first of equals).
fn most_common(values: impl Iterator<Item = String>) -> Option<String> {
    let values: Vec<String> = values.collect();
    values
        .iter()
        .max_by_key(|v| values.iter().filter(|w| w == v).count())
        .cloned()
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
    lock: Option<Lock>,
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
        self.lock.as_ref().map_or(Duration::ZERO, Lock::validity)
    }

    /// True once the leadership is lost (see [`lost`](Self::lost)).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.lock.as_ref().is_none_or(Lock::is_lost)
    }

    /// Why the leadership was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lock.as_ref().and_then(Lock::lost_reason)
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
    pub async fn resign(mut self) -> Result<(), Error> {
        let Some(lock) = self.lock.take() else {
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
        let Some(lock) = self.lock.take() else {
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
    use crate::redlock::{KeyState, NodeStatus};

    fn node(value: Option<&str>, ttl_ms: Option<u64>, fence: u64) -> NodeStatus {
        NodeStatus {
            node: "n".to_owned(),
            state: Ok(KeyState {
                value: value.map(str::to_owned),
                ttl: ttl_ms.map(Duration::from_millis),
                fence,
            }),
        }
    }

    fn down() -> NodeStatus {
        NodeStatus {
            node: "n".to_owned(),
            state: Err(NodeError::Timeout(Duration::ZERO)),
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
        assert_eq!(
            leader_from(&counters_disagree, &[]).unwrap().token,
            FencingToken::new(7)
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

    #[test]
    fn most_common_prefers_the_majority() {
        let v = ["a", "b", "b"].into_iter().map(str::to_owned);
        assert_eq!(most_common(v).as_deref(), Some("b"));
        assert_eq!(most_common(std::iter::empty()), None);
    }
}
