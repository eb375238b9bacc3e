//! No faults: the baseline every other case is compared with.

use crate::runner::{SHORT, Scenario, expect_safe};

/// Three clients contend for one key on five healthy nodes for a few seconds.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation,
/// no stale write at all (nobody ever holds a lock it lost), and a steady stream of handovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_contend_without_violations() {
    let out = expect_safe(Scenario::new("none", &[]), 20, SHORT).await;
    assert!(out.report.sections >= 20, "{}", out.explain());
    assert_eq!(out.report.stale_rejected, 0, "{}", out.explain());
}
