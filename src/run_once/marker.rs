//! Tick markers: a run's `RanBy` written on the nodes under the job's key and the tick's
//! name, so a late instance skips a tick that already ran; read with proven absence (a node
//! that lost its data within the marker's expiry proves nothing), see `docs/safety.md`,
//! "Run-once markers across restarts".

use std::time::{Duration, SystemTime};

use super::{RanBy, RunOnce, SkipReason, Tick};
use crate::core::quorum;
use crate::core::token::FencingToken;
use crate::error::{Error, FailureList};

/// What a tick's marker read found.
pub(super) enum Marker {
    Absent,
    Present(RanBy),
    Unreadable(Error),
}

impl RunOnce {
    /// `Err` with the reason to skip when the tick already ran or its marker cannot be read.
    pub(super) async fn check_marker(&self, tick: &Tick) -> Result<(), SkipReason> {
        if self.marker_ttl.is_none() {
            return Ok(());
        }
        match self.read_marker(tick).await {
            Marker::Absent => Ok(()),
            Marker::Present(by) => {
                tracing::debug!(job = %self.job, %tick, %by, "tick already ran; skipping");
                Err(SkipReason::AlreadyRan { by })
            }
            Marker::Unreadable(e) => {
                tracing::debug!(job = %self.job, %tick, error = %e, "cannot read the tick marker from a quorum; skipping this tick");
                Err(SkipReason::Unavailable(e))
            }
        }
    }

    fn marker_key(&self, tick: &str) -> String {
        format!(
            "{}:tick:{tick}",
            self.locks.engine().keys().lock_key(&self.job)
        )
    }

    /// Reads the tick marker from every node: present anywhere means the tick ran (markers are
    /// written on a quorum, and the nodes that answer here are a quorum).
    ///
    /// Absent needs a quorum of answers from nodes this client has not seen lose their data
    /// (restart or failover without proof it survived) within the marker's expiry, after the
    /// tick's start (allowing for the clock skew): such a node may have lost the marker with
    /// the rest (its counters are repaired, its markers are not), so its "absent" proves
    /// nothing until every marker it may have lost has expired anyway (`docs/safety.md`,
    /// "Run-once markers across restarts").
    pub(super) async fn read_marker(&self, tick: &Tick) -> Marker {
        let key = self.marker_key(tick.name());
        let expiry = self.marker_ttl.unwrap_or_default();
        let may_hide = |seen: Option<SystemTime>| {
            seen.and_then(|t| t.checked_add(self.clock_skew))
                .is_none_or(|seen| quorum::loss_may_hide_marker(tick.start(), seen))
        };
        let read = self
            .locks
            .engine()
            .read_proving_absence(&key, expiry, may_hide);
        match read.await {
            Ok(None) => Marker::Absent,
            Ok(Some(by)) => Marker::Present(RanBy::parse(&by)),
            Err(e) => Marker::Unreadable(e),
        }
    }

    /// Writes the tick marker on every node; true when a quorum has it.
    pub(super) async fn write_marker(
        &self,
        tick: &str,
        token: FencingToken,
        ttl: Duration,
    ) -> bool {
        let by = RanBy::encode(token, &self.instance);
        let replies = self
            .locks
            .engine()
            .write_marker(&self.marker_key(tick), &by, ttl)
            .await;
        // OK (written) and nil (already there) both leave the marker on the node.
        let marked = replies.answered();
        let quorum = self.locks.quorum();
        if marked < quorum {
            tracing::warn!(job = %self.job, tick, marked, needed = quorum, failures = %FailureList(&replies.failures()), "tick marker did not reach a quorum; a late instance may run this tick again");
        }
        marked >= quorum
    }
}
