//! Every fault that the lock is meant to survive, mixed in one seeded schedule.

use crate::nemesis::FaultKind;
use crate::runner::{SHORT, Scenario, expect_safe};

/// The faults a correctly deployed Redlock survives.
pub const SURVIVABLE: &[FaultKind] = &[
    FaultKind::KillMinority,
    FaultKind::KillMinorityDelayed,
    FaultKind::PauseNodes,
    FaultKind::Latency,
    FaultKind::Blackhole,
    FaultKind::Reset,
    FaultKind::ClientPartition,
];

/// Kills with immediate restarts (default restart guard), delayed restarts, paused nodes,
/// latency, blackholes, resets and per-client partitions, drawn at random.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation;
/// the lock is acquired again within 7.5 s of every heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivable_faults_mixed_keep_exclusion() {
    expect_safe(Scenario::new("mixed", SURVIVABLE), 80, SHORT * 2).await;
}
