//! Leader election, blocking: [`Redlock::election`], [`Election`] and its [`Leadership`].

use std::sync::Arc;
use std::time::Duration;

use super::{Held, Redlock, Runtime};
use crate::error::Error;
use crate::{FencingToken, Health, Leader, LostReason};

impl Redlock {
    /// Drives an election built on this client's async client ([`Redlock::as_async`]) from
    /// blocking code: the campaign blocks the calling thread, the term's lease runs on the
    /// client's runtime.
    ///
    /// ```no_run
    /// # fn demo(locks: &quorumlock::blocking::Redlock) -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::Election;
    ///
    /// let election = locks.election(
    ///     Election::builder(locks.as_async().clone(), "scheduler")
    ///         .ttl(Duration::from_secs(10))
    ///         .candidate("scheduler-0")
    ///         .build()?,
    /// );
    /// let leadership = election.campaign()?; // blocks until this candidate leads
    /// while !leadership.is_lost() {
    ///     // ... one step of leading, stamping writes with leadership.token() ...
    /// #   break;
    /// }
    /// leadership.resign()?; // hand over at once
    /// # Ok(()) }
    /// ```
    pub fn election(&self, election: crate::Election) -> Election {
        Election {
            inner: election,
            runtime: Arc::clone(&self.runtime),
        }
    }
}

/// One named election, from [`Redlock::election`]: the blocking form of
/// [`crate::Election`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Election {
    inner: crate::Election,
    runtime: Arc<Runtime>,
}

impl Election {
    /// The async election underneath.
    pub fn as_async(&self) -> &crate::Election {
        &self.inner
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// This candidate's id.
    pub fn candidate(&self) -> &str {
        self.inner.candidate()
    }

    /// Whether this candidate holds a term now (no I/O).
    pub fn is_leading(&self) -> bool {
        self.inner.is_leading()
    }

    /// Waits until this candidate leads, as [`crate::Election::campaign`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::campaign`], and
    /// [`ConfigError::Runtime`](crate::ConfigError::Runtime) from inside an async runtime.
    pub fn campaign(&self) -> Result<Leadership, Error> {
        let won = self.runtime.block_on(self.inner.campaign())?;
        Ok(self.leadership(won))
    }

    /// Campaigns for at most `wait`, as [`crate::Election::campaign_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::campaign_timeout`].
    pub fn campaign_timeout(&self, wait: Duration) -> Result<Leadership, Error> {
        let won = self.runtime.block_on(self.inner.campaign_timeout(wait))?;
        Ok(self.leadership(won))
    }

    /// Who leads now, read from a quorum, as [`crate::Election::leader`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::leader`].
    pub fn leader(&self) -> Result<Option<Leader>, Error> {
        self.runtime.block_on(self.inner.leader())
    }

    /// This candidate's role for a health check, as [`crate::Election::health`]
    /// ([`Health::Unknown`] from inside an async runtime).
    pub fn health(&self) -> Health {
        self.runtime
            .block_on(async { Ok(self.inner.health().await) })
            .unwrap_or_else(|error| Health::Unknown { error })
    }

    fn leadership(&self, won: crate::Leadership) -> Leadership {
        Leadership {
            held: Held::new(won, &self.runtime),
        }
    }
}

/// A won term, from [`Election::campaign`]: the blocking form of [`crate::Leadership`]. Its
/// lease is extended in the background; check [`is_lost`](Self::is_lost) between steps of the
/// work. Dropped without [`resign`](Self::resign), it resigns before `drop` returns.
#[derive(Debug)]
#[must_use = "dropping the leadership resigns it (blocking until done); call .resign() to see the result"]
pub struct Leadership {
    held: Held<crate::Leadership>,
}

impl Leadership {
    fn inner(&self) -> &crate::Leadership {
        self.held.get()
    }

    /// The term's fencing token: stamp every write with it.
    pub fn token(&self) -> FencingToken {
        self.inner().token()
    }

    /// Validity left now.
    pub fn validity(&self) -> Duration {
        self.inner().validity()
    }

    /// True once the term is lost (stop leading).
    pub fn is_lost(&self) -> bool {
        self.inner().is_lost()
    }

    /// Why the term was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.inner().lost_reason()
    }

    /// Steps down at once, as [`crate::Leadership::resign`].
    ///
    /// # Errors
    ///
    /// As [`crate::Leadership::resign`].
    pub fn resign(self) -> Result<(), Error> {
        self.held.end()
    }
}
