//! A node's health, decided from what it reports: hold-out arithmetic after a restart (from
//! `uptime_in_seconds`), whether its data survived, the restart guard's verdict, one server
//! reached by two URLs, and the eviction risk of its memory policy. Also the two guard
//! settings that steer these decisions. Pure: see [`crate::core`].

use std::time::Duration;

use crate::eviction::EvictionRisk;

/// How the client treats a node that may have lost its lock keys in a restart.
///
/// The Redlock safety argument needs a node that restarts without its data (no `fsync`ed AOF) to
/// stay out of every quorum for longer than the largest ttl in use. Operators forget this, so the
/// client enforces it from what it sees: each node's `run_id` and `uptime_in_seconds`. A node
/// with `appendfsync always` whose data demonstrably survived (its durability marker, written on
/// an earlier run, is still there) is trusted across restarts under every guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RestartGuard {
    /// Trust every node.
    Off,
    /// (Default) A node whose run id changed across a reconnect (this client saw it restart)
    /// counts toward no quorum until the maximum ttl has passed since its restart.
    #[default]
    Restarted,
    /// As `Restarted`, and also hold out a node whose uptime is below the maximum ttl on first
    /// contact. For short-lived processes (a CLI) that cannot have seen the restart. The
    /// hold-out is checked against the max ttl in use at each call, so a longer ttl used after
    /// connecting lengthens it.
    Strict,
}

/// How the client treats a node whose memory policy can evict lock keys (see [`EvictionRisk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EvictionGuard {
    /// (Default) Warn once per node (node, policy, what it risks) and report the risk in
    /// [`Redlock::status`](crate::Redlock::status); the node still counts toward quorums.
    #[default]
    Warn,
    /// As `Warn`, and hold such a node out of every quorum ([`NodeError::Evicting`](crate::NodeError::Evicting)).
    /// A node whose policy cannot be read (`CONFIG` disabled, as on some managed services)
    /// still counts: its risk is reported as [`EvictionRisk::Unknown`].
    Strict,
}

/// Classifies a node's [`EvictionRisk`] from its `maxmemory` and `maxmemory-policy` values (`None`: not
/// readable). Pure.
pub(crate) fn classify_eviction(maxmemory: Option<&str>, policy: Option<&str>) -> EvictionRisk {
    let (Some(maxmemory), Some(policy)) = (maxmemory, policy) else {
        return EvictionRisk::Unknown;
    };
    let Ok(maxmemory) = maxmemory.trim().parse::<u64>() else {
        return EvictionRisk::Unknown;
    };
    let policy = policy.trim().to_ascii_lowercase();
    if maxmemory == 0 || policy == "noeviction" {
        EvictionRisk::None
    } else if policy.starts_with("volatile-") {
        EvictionRisk::LockKeys { policy }
    } else if policy.starts_with("allkeys-") {
        EvictionRisk::LockKeysAndCounters { policy }
    } else {
        // A policy this version does not know: assume the worst it could do.
        EvictionRisk::LockKeysAndCounters { policy }
    }
}

/// How a connect met the node, for the restart guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Meeting {
    /// This client never connected to it before.
    First,
    /// The same run id as last time: no restart.
    Same,
    /// A new run id: the node restarted since this client last saw it.
    Restarted,
}

/// Whether the node's keyspace demonstrably survived its start: it runs with `appendfsync
/// always` (`fsync_always`), its durability marker holds a run id other than the current one
/// (written before this run started, and still there), and, for a client that saw the run
/// before, that one was durable too (`durable_before`). A marker holding the current run id was
/// written after the start (perhaps by another client that met the node first): it proves
/// nothing. Pure.
pub(crate) fn data_survived(
    fsync_always: bool,
    marker: Option<&str>,
    run_id: &str,
    durable_before: Option<bool>,
) -> bool {
    fsync_always && durable_before != Some(false) && marker.is_some_and(|m| m != run_id)
}

/// The restart guard's verdict on a connect: `(hold out, repair)`. A held-out node counts
/// toward no quorum until the max ttl in use has passed since its start (checked on every
/// call); a node to repair has its fencing counters restored from the others first. A node
/// whose data survived is neither. Pure.
pub(crate) fn restart_verdict(
    guard: RestartGuard,
    meeting: Meeting,
    survived: bool,
) -> (bool, bool) {
    if guard == RestartGuard::Off || survived {
        return (false, false);
    }
    match meeting {
        Meeting::Restarted => (true, true),
        // Young on first contact may mean restarted without its data: time only, since
        // nothing says its counters fell behind.
        Meeting::First if guard == RestartGuard::Strict => (true, false),
        Meeting::First | Meeting::Same => (false, false),
    }
}

/// The first node other than `i` that shares a server with `i`. Pure.
///
/// Each node's record is one run id (a standalone server, a Sentinel member's primary) or, for
/// a Cluster member, its masters' identities joined by commas (`run id/replication id`, see
/// `node/health.rs`): two records share a server when any run id appears in both. So two URLs
/// of one Cluster whose views differ (one saw a failover the other did not yet) are still one
/// vote, and so is a standalone URL that reaches one of a Cluster member's masters.
pub(crate) fn twin(run_ids: &[Option<String>], i: usize) -> Option<usize> {
    let mine = run_ids.get(i)?.as_deref()?;
    run_ids
        .iter()
        .enumerate()
        .find(|&(j, r)| j != i && r.as_deref().is_some_and(|r| share_a_server(mine, r)))
        .map(|(j, _)| j)
}

/// Whether two records (see [`twin`]) name a run id in common.
fn share_a_server(a: &str, b: &str) -> bool {
    let ids = |s: &str| -> Vec<String> {
        s.split(',')
            .map(|e| e.split('/').next().unwrap_or(e).to_owned())
            .filter(|e| !e.is_empty())
            .collect()
    };
    let theirs = ids(b);
    ids(a).iter().any(|x| theirs.contains(x))
}

/// One reading of a node's wall clock (its `TIME`) against our deadline clock: ours just before
/// the command was sent and just after its reply arrived, the node's in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClockReading {
    /// Our clock before the send.
    pub(crate) sent: Duration,
    /// Our clock after the reply.
    pub(crate) received: Duration,
    /// The node's wall clock (since the Unix epoch).
    pub(crate) server: Duration,
}

/// How far a node's wall clock moved forward beyond what can have passed between two readings
/// of it, or `None` when it moved no more than that plus the drift allowance. At most
/// `later.received − earlier.sent` passed (on our clock, which counts through a suspend); the
/// allowance is `drift_factor` of that plus 2 ms (the lock's own drift rule). A clock that
/// moved backward is no jump here: it keeps keys longer, never drops them early. Pure.
pub(crate) fn clock_jump(
    earlier: ClockReading,
    later: ClockReading,
    drift_factor: f64,
) -> Option<Duration> {
    let passed = later.received.saturating_sub(earlier.sent);
    let moved = later.server.checked_sub(earlier.server)?;
    let allowed = passed + super::timing::drift(passed, drift_factor);
    moved.checked_sub(allowed).filter(|d| !d.is_zero())
}

/// The youngest a node that reports `uptime` can be: `uptime − 1 s`.
///
/// `uptime_in_seconds` is the difference of two whole-second wall-clock readings (now and the
/// start), so it can read 1 when the node started a few milliseconds ago (started at x.99 s,
/// asked at (x+1).01 s). The node's age is only known to be above `uptime - 1 s`: that is what
/// the hold-out counts from. (Taking `uptime` at face value let a restarted node count up to a
/// second early: with a 1 s ttl, at once, and the chaos suite saw the overlap.)
pub(crate) fn youngest_age(uptime: Duration) -> Duration {
    uptime.saturating_sub(Duration::from_secs(1))
}

/// How much longer a node that reports `uptime` must be held out so that `max_ttl` has passed
/// since its start ([`youngest_age`]), or `None` if it already has.
pub(crate) fn hold_out_for(uptime: Duration, max_ttl: Duration) -> Option<Duration> {
    max_ttl
        .checked_sub(youngest_age(uptime))
        .filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_out_counts_from_the_youngest_age_the_uptime_allows() {
        let s = Duration::from_secs;
        // Uptime 1 may mean a few ms old: held out for the whole max ttl.
        assert_eq!(hold_out_for(s(0), s(1)), Some(s(1)));
        assert_eq!(hold_out_for(s(1), s(1)), Some(s(1)));
        assert_eq!(hold_out_for(s(2), s(1)), None);
        assert_eq!(hold_out_for(s(10), s(30)), Some(s(21)));
        assert_eq!(hold_out_for(s(31), s(30)), None);
        assert_eq!(hold_out_for(s(40), s(30)), None);
    }

    #[test]
    fn a_clock_jump_is_what_the_node_moved_beyond_what_passed_here() {
        let ms = Duration::from_millis;
        let at = |sent, received, server| ClockReading {
            sent: ms(sent),
            received: ms(received),
            server: ms(server),
        };
        let first = at(1_000, 1_001, 500_000);
        // 10 s passed here and there: no jump.
        assert_eq!(clock_jump(first, at(11_000, 11_001, 510_000), 0.01), None);
        // Within the allowance (1 % of 10.001 s plus 2 ms).
        assert_eq!(clock_jump(first, at(11_000, 11_001, 510_100), 0.01), None);
        // 30 s forward on the node.
        assert_eq!(
            clock_jump(first, at(11_000, 11_001, 540_000), 0.01),
            Some(ms(29_897) - Duration::from_micros(10))
        );
        // Backward: no jump.
        assert_eq!(clock_jump(first, at(11_000, 11_001, 400_000), 0.01), None);
    }

    #[test]
    fn data_survives_only_with_fsync_always_and_a_marker_from_an_earlier_run() {
        // The marker was written by an earlier run and is still there.
        assert!(data_survived(true, Some("r1"), "r2", None));
        assert!(data_survived(true, Some("r1"), "r2", Some(true)));
        // Written by this run (perhaps by another client after an empty restart): no proof.
        assert!(!data_survived(true, Some("r2"), "r2", None));
        // Gone: the keyspace did not survive.
        assert!(!data_survived(true, None, "r2", Some(true)));
        // Not fsynced on every write now, or not durable in the run this client saw before.
        assert!(!data_survived(false, Some("r1"), "r2", None));
        assert!(!data_survived(true, Some("r1"), "r2", Some(false)));
    }

    #[test]
    fn twins_share_any_run_id() {
        let r = |s: &str| Some(s.to_owned());
        let records = vec![
            r("a/r1,b/r2,c/r3"),
            r("a/r1,b/r2,d/r4"),
            r("e"),
            r("c"),
            None,
            r("f/r9"),
        ];
        assert_eq!(twin(&records, 0), Some(1), "overlapping Cluster views");
        assert_eq!(twin(&records, 1), Some(0));
        assert_eq!(
            twin(&records, 3),
            Some(0),
            "a standalone URL of a Cluster master"
        );
        assert_eq!(twin(&records, 2), None);
        assert_eq!(twin(&records, 4), None);
        assert_eq!(twin(&records, 5), None);
        assert_eq!(twin(&[r("x"), r("x")], 1), Some(0));
    }

    #[test]
    fn restart_verdicts() {
        use Meeting::{First, Same};
        use RestartGuard::{Off, Strict};
        let seen = Meeting::Restarted;
        let default = RestartGuard::Restarted;
        for meeting in [First, Same, seen] {
            assert_eq!(restart_verdict(Off, meeting, false), (false, false));
            for guard in [default, Strict] {
                assert_eq!(restart_verdict(guard, meeting, true), (false, false));
            }
        }
        assert_eq!(restart_verdict(default, seen, false), (true, true));
        assert_eq!(restart_verdict(Strict, seen, false), (true, true));
        assert_eq!(restart_verdict(Strict, First, false), (true, false));
        assert_eq!(restart_verdict(default, First, false), (false, false));
        assert_eq!(restart_verdict(Strict, Same, false), (false, false));
    }

    #[test]
    fn eviction_risk_from_the_memory_policy() {
        let c = classify_eviction;
        assert_eq!(c(Some("0"), Some("volatile-lru")), EvictionRisk::None);
        assert_eq!(c(Some("4194304"), Some("noeviction")), EvictionRisk::None);
        assert_eq!(
            c(Some("4194304"), Some("volatile-ttl")),
            EvictionRisk::LockKeys {
                policy: "volatile-ttl".to_owned()
            }
        );
        assert_eq!(
            c(Some("4194304"), Some("allkeys-lru")),
            EvictionRisk::LockKeysAndCounters {
                policy: "allkeys-lru".to_owned()
            }
        );
        assert!(c(Some("1"), Some("some-future-policy")).is_risky());
        assert_eq!(c(None, Some("allkeys-lru")), EvictionRisk::Unknown);
        assert_eq!(c(Some("lots"), Some("allkeys-lru")), EvictionRisk::Unknown);
        assert_eq!(c(Some("1"), None), EvictionRisk::Unknown);
    }
}
