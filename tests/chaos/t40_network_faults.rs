//! Network faults through the proxy: latency, blackholes, connection resets, and partitions in
//! which different clients see different majorities.
//!
//! Liveness everywhere: after each heal the lock is acquired again within
//! `3 x ttl + connect timeout + 1.5 s` (5 s with the 1 s ttl).

use crate::nemesis::FaultKind;
use crate::runner::{SHORT, Scenario, expect_safe};

/// 20 to 250 ms added each way on random links (beyond the 300 ms node timeout for a round
/// trip at the top of the range).
///
/// Expected: no overlap, strictly growing tokens, no write past validity (validity is computed
/// from the slow round), no hung operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_keeps_exclusion() {
    expect_safe(Scenario::new("latency", &[FaultKind::Latency]), 40, SHORT).await;
}

/// Whole nodes or random links blackholed: bytes stop, connections stay open, and what was
/// held is delivered on heal (late acquisitions land after their round gave up).
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholes_keep_exclusion() {
    expect_safe(
        Scenario::new("blackhole", &[FaultKind::Blackhole]),
        41,
        SHORT,
    )
    .await;
}

/// Every connection to random nodes reset with an RST, up to three times in a row.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation;
/// clients reconnect (a reset is not a restart: the run id is unchanged, nothing is held out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_resets_keep_exclusion() {
    expect_safe(Scenario::new("reset", &[FaultKind::Reset]), 42, SHORT).await;
}

/// Each client sees its own subset of nodes: usually a majority, not the same one, sometimes
/// only a minority. Any two majorities share a node, whose fencing counter carries the token.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_seeing_different_majorities_keep_exclusion_and_token_order() {
    let scn = Scenario::new("client-partition", &[FaultKind::ClientPartition]);
    expect_safe(scn, 43, SHORT).await;
}
