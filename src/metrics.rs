//! Contention and health metrics through the [`metrics`](https://docs.rs/metrics) facade
//! (feature `metrics`); without the feature every function here is an empty inline call. The
//! names, kinds and labels are listed in `docs/design.md` (section "Metrics"): keep both in step.
//! The per-lock metrics take the lock's name as a `lock` label only when the client opted in
//! (`RedlockBuilder::metrics_lock_label`): `None` here leaves it out.

use std::time::Duration;

#[cfg(feature = "metrics")]
mod imp {
    use super::Duration;

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
}

pub(crate) use imp::*;
