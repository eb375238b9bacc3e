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
//!   subscribes on every node (one pub/sub connection per node, checked with a `PING` every 2 s
//!   and re-established with backoff when it breaks or stops answering) so that a standby
//!   retries the moment the leader resigns; the copies of a notice from several nodes are
//!   deduplicated by token.
//!
//! Records and announcements travel on the lock's own connection to each node (the one its
//! lock calls use), each call bounded by the node timeout.
//!
//! Notifications can be lost (a node down, a subscription being re-established), so standbys
//! never rely on them alone: after a refused attempt a standby reads the lock's remaining time to
//! live on every node and sleeps until a quorum of them would have expired it (that is what makes
//! crash handover take about one ttl), and never longer than the poll interval (with jitter).
//! When that read shows no value on a quorum (standbys that retried together split the nodes),
//! it retries after the lock client's short random pause instead.
//!
//! Reading who leads needs no candidacy: an [`Observer`] (from [`ElectionBuilder::observer`])
//! reads and streams it without a candidate id.
//!
//! The parts: `campaign` (attempts, standing by, taking office), `notices` (the pub/sub
//! channel), `record` (the leader record's one format, the election's keys), `observe`
//! ([`Observer`], [`Observation`], [`Leader`]), `leadership` ([`Leadership`], [`Health`]).

mod campaign;
mod leadership;
mod notices;
mod observe;
mod record;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio_util::sync::CancellationToken;

pub use leadership::{Health, Leadership};
pub use observe::{Leader, Observation, Observer};

use crate::core::lock;
use crate::core::token::FencingToken;
use crate::error::{ConfigError, Error, Setting};
use crate::lock::builder::RedlockBuilder;
use crate::lock::guard::Lock;
use crate::lock::redlock::Redlock;

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
    /// The read side: client, name, keys, poll interval, subscriptions.
    observer: Observer,
    candidate: String,
    ttl: Duration,
    /// This candidate's current term.
    term: Mutex<Option<Term>>,
    /// How many times a campaign went back to standing by (see `wait_standing_by`): a test
    /// hook, compiled with the `testkit` feature only.
    #[cfg(feature = "testkit")]
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
            .field("name", &self.name())
            .field("candidate", &self.inner.candidate)
            .field("ttl", &self.inner.ttl)
            .field("poll_interval", &self.inner.observer.shared.poll)
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
    /// [`ConfigError::ZeroDuration`] for a zero ttl or poll interval,
    /// [`ConfigError::TooLong`] for a ttl above [`RedlockBuilder::MAX_TTL`] or a poll interval
    /// above [`RedlockBuilder::MAX_TIMING`], [`ConfigError::FencingRequired`] for a lock client
    /// with fencing off (terms are told apart, ordered and bound to their record by their
    /// tokens). An invalid name or a ttl too short for the drift allowance is reported by the
    /// first [`campaign`](Election::campaign) or [`leader`](Election::leader) as
    /// [`Error::InvalidArgument`].
    pub fn build(self) -> Result<Election, ConfigError> {
        let (observer, ttl) = self.validated()?;
        Ok(Election {
            inner: Arc::new(Inner {
                observer,
                candidate: self.candidate.unwrap_or_else(default_candidate),
                ttl,
                term: Mutex::new(None),
                #[cfg(feature = "testkit")]
                standbys: tokio::sync::watch::Sender::new(0),
            }),
        })
    }

    /// Builds an [`Observer`] of the election instead of a candidate: it reads and streams who
    /// leads, and needs no candidate id (one set with [`candidate`](Self::candidate) is
    /// ignored). The ttl only sets the default poll interval (ttl / 4). No connection is made.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    pub fn observer(self) -> Result<Observer, ConfigError> {
        self.validated().map(|(observer, _)| observer)
    }

    fn validated(&self) -> Result<(Observer, Duration), ConfigError> {
        if self.ttl.is_zero() {
            return Err(ConfigError::ZeroDuration(Setting::ElectionTtl));
        }
        if self.ttl > RedlockBuilder::MAX_TTL {
            return Err(ConfigError::TooLong {
                name: Setting::ElectionTtl,
                value: self.ttl,
                max: RedlockBuilder::MAX_TTL,
            });
        }
        let poll = self.poll.unwrap_or(self.ttl / 4);
        if poll.is_zero() {
            return Err(ConfigError::ZeroDuration(Setting::ElectionPollInterval));
        }
        if poll > RedlockBuilder::MAX_TIMING {
            return Err(ConfigError::TooLong {
                name: Setting::ElectionPollInterval,
                value: poll,
                max: RedlockBuilder::MAX_TIMING,
            });
        }
        if !self.locks.engine().fencing() {
            return Err(ConfigError::FencingRequired);
        }
        let observer = Observer::new(self.locks.clone(), self.name.clone(), poll);
        Ok((observer, self.ttl))
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
        self.inner.observer.name()
    }

    /// This candidate's id.
    pub fn candidate(&self) -> &str {
        &self.inner.candidate
    }

    /// The lease ttl of a term.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The read side of this election (sharing its subscriptions): who leads, without the
    /// candidacy.
    pub fn observer(&self) -> Observer {
        self.inner.observer.clone()
    }

    fn locks(&self) -> &Redlock {
        &self.inner.observer.shared.locks
    }

    /// True while this candidate holds a term whose lost signal has not fired and whose
    /// validity has not run out. No I/O.
    pub fn is_leading(&self) -> bool {
        self.current_term().is_some()
    }

    fn current_term(&self) -> Option<FencingToken> {
        self.term()
            .as_ref()
            .filter(|t| t.is_valid())
            .map(|t| t.token)
    }

    fn term(&self) -> std::sync::MutexGuard<'_, Option<Term>> {
        lock(&self.inner.term)
    }

    fn end_term(&self, token: FencingToken) {
        let mut term = self.term();
        if term.as_ref().is_some_and(|t| t.token == token) {
            *term = None;
        }
    }

    /// Who leads now: [`Observer::leader`].
    ///
    /// # Errors
    ///
    /// As [`Observer::leader`].
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        self.inner.observer.leader().await
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

    /// A stream of leadership changes: [`Observer::observe`] (sharing this election's
    /// subscriptions).
    pub fn observe(&self) -> impl Stream<Item = Observation> + Send + 'static {
        self.inner.observer.observe()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use crate::client::status::{KeyState, LockStatus, NodeStatus};
    use crate::error::NodeError;

    pub(crate) fn node(value: Option<&str>, ttl_ms: Option<u64>, fence: u64) -> NodeStatus {
        NodeStatus {
            node: "n".to_owned(),
            state: Ok(KeyState {
                value: value.map(str::to_owned),
                owner: value.and_then(crate::core::value::owner_of),
                ttl: ttl_ms.map(Duration::from_millis),
                fence: crate::core::token::FencingToken::new(fence),
            }),
            eviction: crate::EvictionRisk::None,
            unchecked: Vec::new(),
            scripts_by_eval: false,
        }
    }

    pub(crate) fn down() -> NodeStatus {
        NodeStatus {
            node: "n".to_owned(),
            state: Err(NodeError::Timeout(Duration::ZERO)),
            eviction: crate::EvictionRisk::Unknown,
            unchecked: Vec::new(),
            scripts_by_eval: false,
        }
    }

    pub(crate) fn status(nodes: Vec<NodeStatus>) -> LockStatus {
        LockStatus {
            key: "e".to_owned(),
            quorum: nodes.len() / 2 + 1,
            nodes,
        }
    }
}
