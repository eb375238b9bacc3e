//! What a tick's outcome tells operators: a counter per job and outcome (feature `metrics`),
//! and one warning per outage per job rather than one per tick.
//!
//! `quorumlock_run_once_ticks_total{run_once, outcome}` counts every tick an instance called for,
//! once, by what happened: `ran`, `failed` (ran and returned `Err`, under
//! [`RunOnce::try_run`](super::RunOnce::try_run)), `caught_up` (a missed tick run late),
//! `lost` (the lock was lost while it ran), `skipped_held` (another instance was running),
//! `skipped_already_ran`, and `skipped_unavailable` with a `reason` label (`no_quorum`,
//! `expired`, ...: the failed acquisition's word). Alert on a rate of `skipped_unavailable`,
//! or on no `ran`/`caught_up`/`skipped_already_ran` across the fleet for longer than a period.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Outcome, RunOnce, SkipReason};
use crate::client::span_outcome;

/// Ticks skipped as unavailable in a row, shared by the clones of one [`RunOnce`]: the first
/// is logged at warn, the rest at debug, and the first tick that is not logs the outage's end.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    skipped: AtomicU64,
}

/// How a tick ended, for the counter: `(outcome, reason)`.
fn words<T>(outcome: &Outcome<T>, failed: bool, caught_up: bool) -> (&'static str, &'static str) {
    match outcome {
        Outcome::Ran { .. } if caught_up => ("caught_up", ""),
        Outcome::Ran { .. } if failed => ("failed", ""),
        Outcome::Ran { .. } => ("ran", ""),
        Outcome::Lost { .. } => ("lost", ""),
        Outcome::Skipped { reason, .. } => match reason {
            SkipReason::Running => ("skipped_held", ""),
            SkipReason::AlreadyRan { .. } => ("skipped_already_ran", ""),
            SkipReason::Unavailable(e) => ("skipped_unavailable", span_outcome(e)),
        },
    }
}

impl RunOnce {
    /// Counts a tick's outcome and logs an outage's start and end (once each).
    pub(crate) fn report<T>(&self, outcome: &Outcome<T>, failed: bool, caught_up: bool) {
        let (word, reason) = words(outcome, failed, caught_up);
        count(&self.job, word, reason);
        let tick = outcome.tick();
        match outcome {
            Outcome::Skipped {
                reason: SkipReason::Unavailable(e),
                ..
            } => {
                if self.outage.skipped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(job = %self.job, tick, error = %e, "too few lock nodes answered; skipping this job's ticks until a quorum is back (logged once per outage)");
                } else {
                    tracing::debug!(job = %self.job, tick, error = %e, "still too few lock nodes; skipping this tick");
                }
            }
            _ => {
                let skipped = self.outage.skipped.swap(0, Ordering::Relaxed);
                if skipped > 0 {
                    tracing::info!(job = %self.job, tick, skipped, "the lock nodes answer again; ticks run again");
                }
            }
        }
    }
}

#[cfg(feature = "metrics")]
fn count(job: &str, outcome: &'static str, reason: &'static str) {
    if reason.is_empty() {
        metrics::counter!("quorumlock_run_once_ticks_total", "run_once" => job.to_owned(), "outcome" => outcome)
            .increment(1);
    } else {
        metrics::counter!("quorumlock_run_once_ticks_total", "run_once" => job.to_owned(), "outcome" => outcome, "reason" => reason)
            .increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
fn count(_job: &str, _outcome: &'static str, _reason: &'static str) {}
