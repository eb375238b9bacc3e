//! Contention and health metrics through the [`metrics`](https://docs.rs/metrics) facade
//! (feature `metrics`); without the feature every function here is an empty inline call. The
//! names, kinds, units and labels are listed in `docs/observability.md` (the rustdoc's
//! `guide::observability`) and described to the recorder by [`describe`]: keep the three in step
//! (a unit test checks the guide's table).
//! The per-lock metrics take the lock's name as a `lock` label only when the client opted in
//! (`RedlockBuilder::metrics_lock_label`): `None` here leaves it out.

use std::time::Duration;

#[cfg(feature = "metrics")]
mod imp {
    use super::Duration;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use metrics::Unit;

    /// Describes every metric to the installed recorder (`# HELP` and units in Prometheus),
    /// once per process: called when a client is built, so after the recorder is installed.
    pub(crate) fn describe() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            metrics::describe_counter!("quorumlock_attempts_total", Unit::Count, "Acquisition rounds started (each retry is one).");
            metrics::describe_counter!("quorumlock_acquire_total", Unit::Count, "Acquisition calls ended, by outcome (acquired, held, no_quorum, ...).");
            metrics::describe_histogram!("quorumlock_acquire_wait_seconds", Unit::Seconds, "Time an acquisition call took, by outcome.");
            metrics::describe_histogram!("quorumlock_node_latency_seconds", Unit::Seconds, "Latency of calls that a node answered, by node and operation.");
            metrics::describe_counter!("quorumlock_node_errors_total", Unit::Count, "Failed node calls, by node, operation and error kind.");
            metrics::describe_counter!("quorumlock_node_abandoned_total", Unit::Count, "Node calls left unanswered when their round was decided, by node and operation.");
            metrics::describe_counter!("quorumlock_locks_lost_total", Unit::Count, "Held locks lost (expired, taken over, unreachable or revoked).");
            metrics::describe_gauge!("quorumlock_locks_held", Unit::Count, "Locks this process holds now.");
            metrics::describe_histogram!("quorumlock_lock_hold_seconds", Unit::Seconds, "How long locks were held, from acquisition to release or loss.");
            metrics::describe_counter!("quorumlock_extensions_failed_total", Unit::Count, "Extension calls that failed, by reason (not_owner, revoked, expired, unreachable, too_slow).");
            metrics::describe_gauge!("quorumlock_node_held_out", Unit::Count, "1 while a node answers but counts toward no quorum, by node and reason (held_out: restart hold-out, repairing, same_server, evicting).");
            metrics::describe_gauge!("quorumlock_node_up", Unit::Count, "1 while a node's last call succeeded, 0 once one failed, by node.");
            metrics::describe_counter!("quorumlock_node_clock_jumps_total", Unit::Count, "A node's wall clock seen jumping forward between two readings of its TIME (held out for the max ttl and repaired), by node.");
            metrics::describe_histogram!("quorumlock_takeover_seconds", Unit::Seconds, "From a waiting acquisition's wake-up (after: release, a notice; expiry, the holder's key gone) to its grant.");
            metrics::describe_gauge!("quorumlock_leader", Unit::Count, "Terms this process leads now, by election (1 while it is the leader).");
            metrics::describe_counter!("quorumlock_terms_total", Unit::Count, "Terms this process won, by election.");
            metrics::describe_counter!("quorumlock_terms_lost_total", Unit::Count, "Terms this process led that ended lost (not resigned), by election.");
            metrics::describe_counter!("quorumlock_run_once_ticks_total", Unit::Count, "Ticks a run-once job was called for, by job, outcome (ran, failed, caught_up, lost, skipped_held, skipped_already_ran, skipped_unavailable) and reason.");
            metrics::describe_counter!("quorumlock_revokes_total", Unit::Count, "Revokes run by this process (redlock break), by outcome (revoked, nothing).");
        });
    }

    /// A held lock's share of `quorumlock_locks_held` and its `quorumlock_lock_hold_seconds`:
    /// counted from [`start`](Self::start) until the first [`end`](Self::end) (or the drop).
    #[derive(Debug, Default)]
    pub(crate) struct Held {
        since: Option<(Instant, Option<String>)>,
        ended: AtomicBool,
    }

    impl Held {
        /// Not counted yet (before [`start`](Self::start)).
        pub(crate) fn idle() -> Self {
            Held::default()
        }

        pub(crate) fn start(lock: Option<&str>) -> Self {
            gauge_held(lock.map(str::to_owned)).increment(1.0);
            Held {
                since: Some((Instant::now(), lock.map(str::to_owned))),
                ended: AtomicBool::new(false),
            }
        }

        pub(crate) fn end(&self) {
            let Some((since, lock)) = &self.since else {
                return;
            };
            if self.ended.swap(true, Ordering::AcqRel) {
                return;
            }
            gauge_held(lock.clone()).decrement(1.0);
            let held = since.elapsed().as_secs_f64();
            match lock {
                Some(lock) => {
                    metrics::histogram!("quorumlock_lock_hold_seconds", "lock" => lock.clone())
                        .record(held)
                }
                None => metrics::histogram!("quorumlock_lock_hold_seconds").record(held),
            }
        }
    }

    impl Drop for Held {
        fn drop(&mut self) {
            self.end();
        }
    }

    /// A term this process leads in an election: `quorumlock_leader{election}` counts it from
    /// [`start`](Self::start) until the first [`end`](Self::end); each term counts once in
    /// `quorumlock_terms_total`, and a term that ended lost (not resigned) in
    /// `quorumlock_terms_lost_total`.
    #[derive(Debug)]
    pub(crate) struct Leading {
        election: String,
        ended: AtomicBool,
        done: tokio_util::sync::CancellationToken,
    }

    impl Leading {
        pub(crate) fn start(election: &str) -> std::sync::Arc<Self> {
            metrics::gauge!("quorumlock_leader", "election" => election.to_owned()).increment(1.0);
            metrics::counter!("quorumlock_terms_total", "election" => election.to_owned())
                .increment(1);
            std::sync::Arc::new(Leading {
                election: election.to_owned(),
                ended: AtomicBool::new(false),
                done: tokio_util::sync::CancellationToken::new(),
            })
        }

        /// Ends the term's count at the first of `lost` firing (then `lost_term()` tells a loss
        /// from a resignation) and [`end`](Self::end): a task on the current runtime, if any.
        pub(crate) fn watch(
            self: &std::sync::Arc<Self>,
            lost: tokio_util::sync::CancellationToken,
            lost_term: impl Fn() -> bool + Send + 'static,
        ) {
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let leading = std::sync::Arc::clone(self);
            handle.spawn(async move {
                tokio::select! {
                    () = lost.cancelled() => leading.end(lost_term()),
                    () = leading.done.cancelled() => {}
                }
            });
        }

        pub(crate) fn end(&self, lost: bool) {
            if self.ended.swap(true, Ordering::AcqRel) {
                return;
            }
            self.done.cancel();
            let election = self.election.clone();
            metrics::gauge!("quorumlock_leader", "election" => election.clone()).decrement(1.0);
            if lost {
                metrics::counter!("quorumlock_terms_lost_total", "election" => election)
                    .increment(1);
            }
        }
    }

    fn gauge_held(lock: Option<String>) -> metrics::Gauge {
        match lock {
            Some(lock) => metrics::gauge!("quorumlock_locks_held", "lock" => lock),
            None => metrics::gauge!("quorumlock_locks_held"),
        }
    }

    pub(crate) fn extension_failed(reason: &'static str) {
        metrics::counter!("quorumlock_extensions_failed_total", "reason" => reason).increment(1);
    }

    pub(crate) fn node_held_out(node: &str, reason: &'static str, on: bool) {
        metrics::gauge!("quorumlock_node_held_out", "node" => node.to_owned(), "reason" => reason)
            .set(if on { 1.0 } else { 0.0 });
    }

    pub(crate) fn node_up(node: &str, up: bool) {
        metrics::gauge!("quorumlock_node_up", "node" => node.to_owned()).set(if up {
            1.0
        } else {
            0.0
        });
    }

    // `lock`: the user key, when the client was built with `metrics_lock_label(true)`.

    pub(crate) fn attempt(lock: Option<&str>) {
        match lock {
            Some(lock) => {
                metrics::counter!("quorumlock_attempts_total", "lock" => lock.to_owned())
                    .increment(1);
            }
            None => metrics::counter!("quorumlock_attempts_total").increment(1),
        }
    }

    pub(crate) fn acquire(outcome: &'static str, wait: Duration, lock: Option<&str>) {
        match lock {
            Some(lock) => {
                metrics::counter!("quorumlock_acquire_total", "outcome" => outcome, "lock" => lock.to_owned())
                    .increment(1);
                metrics::histogram!("quorumlock_acquire_wait_seconds", "outcome" => outcome, "lock" => lock.to_owned())
                    .record(wait.as_secs_f64());
            }
            None => {
                metrics::counter!("quorumlock_acquire_total", "outcome" => outcome).increment(1);
                metrics::histogram!("quorumlock_acquire_wait_seconds", "outcome" => outcome)
                    .record(wait.as_secs_f64());
            }
        }
    }

    pub(crate) fn node_latency(node: &str, op: &'static str, d: Duration) {
        metrics::histogram!("quorumlock_node_latency_seconds", "node" => node.to_owned(), "op" => op)
            .record(d.as_secs_f64());
    }

    pub(crate) fn node_error(node: &str, op: &'static str, kind: &'static str) {
        metrics::counter!("quorumlock_node_errors_total", "node" => node.to_owned(), "op" => op, "kind" => kind)
            .increment(1);
    }

    pub(crate) fn node_clock_jump(node: &str) {
        metrics::counter!("quorumlock_node_clock_jumps_total", "node" => node.to_owned())
            .increment(1);
    }

    pub(crate) fn node_abandoned(node: &str, op: &'static str) {
        metrics::counter!("quorumlock_node_abandoned_total", "node" => node.to_owned(), "op" => op)
            .increment(1);
    }

    pub(crate) fn lock_lost(lock: Option<&str>) {
        match lock {
            Some(lock) => {
                metrics::counter!("quorumlock_locks_lost_total", "lock" => lock.to_owned())
                    .increment(1);
            }
            None => metrics::counter!("quorumlock_locks_lost_total").increment(1),
        }
    }

    /// A waiting acquisition won `elapsed` after it was woken by a release notice (`release`)
    /// or by its timer once the holder's key was gone or expiring (`expiry`).
    pub(crate) fn takeover(after: &'static str, elapsed: Duration) {
        metrics::histogram!("quorumlock_takeover_seconds", "after" => after)
            .record(elapsed.as_secs_f64());
    }

    /// A revoke ran: `revoked` when it deleted a holder's value, `nothing` otherwise.
    pub(crate) fn revoke(deleted: bool) {
        let outcome = if deleted { "revoked" } else { "nothing" };
        metrics::counter!("quorumlock_revokes_total", "outcome" => outcome).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use super::Duration;

    #[inline(always)]
    pub(crate) fn attempt(_lock: Option<&str>) {}
    #[inline(always)]
    pub(crate) fn acquire(_outcome: &'static str, _wait: Duration, _lock: Option<&str>) {}
    #[inline(always)]
    pub(crate) fn node_error(_node: &str, _op: &'static str, _kind: &'static str) {}
    #[inline(always)]
    pub(crate) fn node_clock_jump(_node: &str) {}
    #[inline(always)]
    pub(crate) fn node_abandoned(_node: &str, _op: &'static str) {}
    #[inline(always)]
    pub(crate) fn lock_lost(_lock: Option<&str>) {}
    #[inline(always)]
    pub(crate) fn revoke(_deleted: bool) {}
    #[inline(always)]
    pub(crate) fn takeover(_after: &'static str, _elapsed: Duration) {}
    #[inline(always)]
    pub(crate) fn describe() {}
    #[inline(always)]
    pub(crate) fn extension_failed(_reason: &'static str) {}
    #[inline(always)]
    pub(crate) fn node_up(_node: &str, _up: bool) {}
    #[inline(always)]
    pub(crate) fn node_held_out(_node: &str, _reason: &'static str, _on: bool) {}

    /// Without the feature: nothing to count.
    #[derive(Debug, Default)]
    pub(crate) struct Leading;

    impl Leading {
        #[inline(always)]
        pub(crate) fn start(_election: &str) -> std::sync::Arc<Self> {
            std::sync::Arc::new(Leading)
        }
        #[inline(always)]
        pub(crate) fn watch(
            self: &std::sync::Arc<Self>,
            _lost: tokio_util::sync::CancellationToken,
            _lost_term: impl Fn() -> bool + Send + 'static,
        ) {
        }
        #[inline(always)]
        pub(crate) fn end(&self, _lost: bool) {}
    }

    /// Without the feature: nothing to count.
    #[derive(Debug, Default)]
    pub(crate) struct Held;

    impl Held {
        #[inline(always)]
        pub(crate) fn idle() -> Self {
            Held
        }
        #[inline(always)]
        pub(crate) fn start(_lock: Option<&str>) -> Self {
            Held
        }
        #[inline(always)]
        pub(crate) fn end(&self) {}
    }
}

pub(crate) use imp::*;

#[cfg(test)]
mod tests {
    /// Every metric this module describes.
    const NAMES: &[&str] = &[
        "quorumlock_attempts_total",
        "quorumlock_acquire_total",
        "quorumlock_acquire_wait_seconds",
        "quorumlock_node_latency_seconds",
        "quorumlock_node_errors_total",
        "quorumlock_node_abandoned_total",
        "quorumlock_locks_lost_total",
        "quorumlock_locks_held",
        "quorumlock_lock_hold_seconds",
        "quorumlock_extensions_failed_total",
        "quorumlock_node_up",
        "quorumlock_node_held_out",
        "quorumlock_revokes_total",
        "quorumlock_node_clock_jumps_total",
        "quorumlock_takeover_seconds",
        "quorumlock_leader",
        "quorumlock_terms_total",
        "quorumlock_terms_lost_total",
        "quorumlock_run_once_ticks_total",
    ];

    /// The guide lists every metric of this module.
    #[test]
    fn every_metric_is_in_the_guide() {
        let guide = include_str!("../docs/observability.md");
        for name in NAMES {
            assert!(guide.contains(&format!("| `{name}` |")), "{name}");
        }
    }
}
