//! What a run-once call reports: the job's context ([`TickContext`]), the outcome
//! ([`Outcome`]), why a tick was skipped ([`SkipReason`]) and who ran it ([`RanBy`]).

use std::fmt;

use tokio_util::sync::CancellationToken;

use crate::core::token::FencingToken;
use crate::error::{Error, LostReason};

/// What a job run by [`RunOnce::run`](super::RunOnce::run) knows about its run.
#[derive(Debug, Clone)]
pub struct TickContext {
    pub(super) job: String,
    pub(super) tick: String,
    pub(super) token: FencingToken,
    pub(super) lost: CancellationToken,
}

impl TickContext {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The tick being run.
    pub fn tick(&self) -> &str {
        &self.tick
    }

    /// The fencing token of this run: stamp every write with it.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Resolves when the job's lock is lost (the job's future is then dropped too), as
    /// [`Lock::lost`](crate::Lock::lost).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe; it only waits.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.lost.clone().cancelled_owned()
    }

    /// A token cancelled when the job's lock is lost, as
    /// [`Lock::lost_token`](crate::Lock::lost_token): for `tokio::select!` or `is_cancelled()`
    /// checks.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }
}

/// What [`RunOnce::run`](super::RunOnce::run) did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// This instance ran the job for the tick.
    Ran {
        /// The tick.
        tick: String,
        /// The run's fencing token.
        token: FencingToken,
        /// What the job returned.
        output: T,
        /// Whether the tick marker reached a quorum (if not, a late instance may run the tick
        /// again; logged at warn). Always false without markers.
        marked: bool,
    },
    /// This instance did not run the job.
    Skipped {
        /// The tick.
        tick: String,
        /// Why.
        reason: SkipReason,
    },
    /// The job's lock was lost before the run was over: another instance may have run the
    /// tick too (writes stamped with the token let the resource refuse this run's late ones).
    /// No marker was written (unless the loss came while it was being written), so a later
    /// instance may run the tick again.
    Lost {
        /// The tick.
        tick: String,
        /// The run's fencing token.
        token: FencingToken,
        /// Why the lock was lost.
        reason: LostReason,
        /// `None` when the loss stopped the job (its future was dropped at its current await);
        /// what the job returned when it had completed by the time the loss was seen.
        output: Option<T>,
    },
}

impl<T> Outcome<T> {
    /// The tick.
    pub fn tick(&self) -> &str {
        match self {
            Outcome::Ran { tick, .. }
            | Outcome::Skipped { tick, .. }
            | Outcome::Lost { tick, .. } => tick,
        }
    }

    /// True for [`Outcome::Ran`].
    pub fn ran(&self) -> bool {
        matches!(self, Outcome::Ran { .. })
    }

    /// The job's output, if it ran to completion: always for [`Outcome::Ran`], and for an
    /// [`Outcome::Lost`] whose job completed as its lock was lost.
    pub fn output(self) -> Option<T> {
        match self {
            Outcome::Ran { output, .. } => Some(output),
            Outcome::Lost { output, .. } => output,
            Outcome::Skipped { .. } => None,
        }
    }

    /// Why the job was skipped, if it was.
    pub fn skip_reason(&self) -> Option<&SkipReason> {
        match self {
            Outcome::Skipped { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// The run's fencing token (none when skipped).
    pub(crate) fn token(&self) -> Option<FencingToken> {
        match self {
            Outcome::Ran { token, .. } | Outcome::Lost { token, .. } => Some(*token),
            Outcome::Skipped { .. } => None,
        }
    }

    /// The `outcome` of the call's `quorumlock.run_once` span: `ran`, `lost`, or why the tick
    /// was skipped: `held` (another instance is running), `already_ran`, or the failed
    /// acquisition's word (`no_quorum`, `expired`, ...).
    pub(crate) fn span_word(&self) -> &'static str {
        match self {
            Outcome::Ran { .. } => "ran",
            Outcome::Lost { .. } => "lost",
            Outcome::Skipped { reason, .. } => match reason {
                SkipReason::Running => "held",
                SkipReason::AlreadyRan { .. } => "already_ran",
                SkipReason::Unavailable(e) => crate::client::span_outcome(e),
            },
        }
    }
}

/// Why [`RunOnce::run`](super::RunOnce::run) skipped a tick.
#[derive(Debug)]
#[non_exhaustive]
pub enum SkipReason {
    /// Another instance holds the job's lock: it is running the job (this tick or an earlier
    /// one that is still going).
    Running,
    /// The tick's marker says it already ran.
    AlreadyRan {
        /// The run that wrote the marker.
        by: RanBy,
    },
    /// Too few nodes answered to take the lock or to read the tick marker
    /// ([`Error::NoQuorum`]), or they answered so slowly that the lock had no validity left
    /// ([`Error::ValidityExpired`]).
    Unavailable(Error),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Running => f.write_str("another instance is running"),
            SkipReason::AlreadyRan { by } => {
                write!(f, "the tick already ran (token, instance: {by})")
            }
            SkipReason::Unavailable(e) => write!(f, "lock service unavailable: {e}"),
        }
    }
}

/// The run that marked a tick done, from its marker ([`SkipReason::AlreadyRan`]).
///
/// Displayed as the marker holds it, `"<token> <instance id>"`; it also compares equal to that
/// text, as the `String` it replaces did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RanBy {
    /// The run's fencing token; `None` for a marker this library did not write.
    pub token: Option<FencingToken>,
    /// The id of the instance that ran it
    /// ([`RunOnceBuilder::instance`](super::RunOnceBuilder::instance)); the whole marker for a
    /// marker this library did not write.
    pub instance: String,
}

impl RanBy {
    pub(crate) fn encode(token: FencingToken, instance: &str) -> String {
        format!("{token} {instance}")
    }

    pub(crate) fn parse(marker: &str) -> RanBy {
        let parsed = marker
            .split_once(' ')
            .and_then(|(t, i)| Some((FencingToken::new(t.parse().ok()?), i)));
        match parsed {
            Some((token, instance)) => RanBy {
                token: Some(token),
                instance: instance.to_owned(),
            },
            None => RanBy {
                token: None,
                instance: marker.to_owned(),
            },
        }
    }
}

impl fmt::Display for RanBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.token {
            Some(token) => f.write_str(&Self::encode(token, &self.instance)),
            None => f.write_str(&self.instance),
        }
    }
}

impl RanBy {
    /// Whether `text` is this run's marker text.
    fn is_text(&self, text: &str) -> bool {
        match self.token {
            Some(token) => text.split_once(' ').is_some_and(|(t, i)| {
                i == self.instance && !t.starts_with('0') && t.parse() == Ok(token.get())
            }),
            None => text == self.instance,
        }
    }
}

impl PartialEq<str> for RanBy {
    fn eq(&self, other: &str) -> bool {
        self.is_text(other)
    }
}

impl PartialEq<&str> for RanBy {
    fn eq(&self, other: &&str) -> bool {
        self.is_text(other)
    }
}

impl PartialEq<String> for RanBy {
    fn eq(&self, other: &String) -> bool {
        self.is_text(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_name_the_run_that_wrote_them() {
        let by = RanBy::parse(&RanBy::encode(FencingToken::new(12), "host a"));
        assert_eq!(by.token, Some(FencingToken::new(12)));
        assert_eq!(by.instance, "host a");
        assert_eq!(by, "12 host a");
        assert_eq!(by.to_string(), "12 host a");
        // Not ours: kept whole.
        let foreign = RanBy::parse("done");
        assert_eq!((foreign.token, foreign.instance.as_str()), (None, "done"));
        assert_eq!(foreign.to_string(), "done");
    }
}
