//! A won term ([`Leadership`]) and what a health check reports ([`Health`]).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::notices::Notice;
use super::record::Record;
use super::{Election, SharedLock};
use crate::core::lock;
use crate::core::token::FencingToken;
use crate::error::{Error, LostReason};
use crate::lock::guard::Lock;

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
        leader: Option<super::Leader>,
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
            Health::Standby { leader: Some(l) } => {
                write!(
                    f,
                    "standby (leader {}",
                    l.candidate.as_deref().unwrap_or("<unpublished>")
                )?;
                if let Some(owner) = &l.owner {
                    write!(f, ", owner {owner:?}")?;
                }
                write!(f, ", token {})", l.token)
            }
            Health::Standby { leader: None } => f.write_str("standby (no leader)"),
            Health::Unknown { error } => write!(f, "unknown ({error})"),
        }
    }
}

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
    pub(crate) election: Election,
    /// The term's lock; `None` once resigned.
    pub(crate) lock: SharedLock,
    pub(crate) token: FencingToken,
    pub(crate) lost: CancellationToken,
    pub(crate) record: Option<Record>,
    pub(crate) since: std::time::Instant,
    /// This term's share of the leader metrics (feature `metrics`).
    pub(crate) leading: std::sync::Arc<crate::metrics::Leading>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.name())
            .field("candidate", &self.candidate())
            .field("token", &self.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.election.name()
    }

    /// This leader's candidate id.
    pub fn candidate(&self) -> &str {
        self.election.candidate()
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

    /// This term's lock value, while the term is valid.
    pub(crate) fn own_value(&self) -> Option<String> {
        if self.is_lost() {
            return None;
        }
        lock(&self.lock)
            .as_ref()
            .map(|lock| lock.value().to_owned())
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
            .announce_resign(self.token, self.record.as_ref())
            .await;
        tracing::info!(election = %self.name(), candidate = %self.candidate(), token = %self.token, "resigned");
        result
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.leading.end(false);
        let Some(lock) = lock(&self.lock).take() else {
            return;
        };
        self.election.end_term(self.token);
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // the lock's own Drop stops its lease; the ttl ends the term
        };
        let (election, token, record) = (self.election.clone(), self.token, self.record.take());
        tracing::debug!(election = %election.name(), %token, "leadership dropped; resigning in the background");
        // In the span current where the leadership was dropped.
        handle.spawn(
            async move {
                if lock.is_lost() {
                    drop(lock);
                } else if let Err(e) = lock.release().await {
                    tracing::debug!(election = %election.name(), error = %e, "background resign");
                }
                election.announce_resign(token, record.as_ref()).await;
            }
            .in_current_span(),
        );
    }
}

impl Election {
    /// Deletes our record and announces the resignation on every node.
    pub(crate) async fn announce_resign(&self, token: FencingToken, record: Option<&Record>) {
        let message = Notice::resigned(token, self.candidate());
        let sh = &*self.inner.observer.shared;
        let replies = sh.keys.resign(sh.locks.engine(), record, &message).await;
        let reached: i64 = replies.answers().sum();
        tracing::debug!(election = %sh.name, %token, subscribers = reached, "resignation announced");
    }
}
