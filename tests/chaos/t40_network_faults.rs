//! Network faults through the proxy: latency, blackholes, connection resets, and partitions in
//! which different clients see different majorities.
//!
//! Liveness everywhere: after each heal the lock is acquired again within
//! `3 x ttl + connect timeout + 4 s` (7.5 s with the 1 s ttl: 4 s of slack for a loaded box).

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

/// Latency injected at the holder's deadline (issue 12, item 1): A's extension is sent 50 ms
/// before its deadline and its calls land 1 s late, after A's keys expired and B acquired,
/// wrote and released. A's node timeout is long enough that the late answers arrive inside
/// its round, as they did when a late extension revived the lock and returned `Ok`.
///
/// Expected: no overlap (A's extension is not `Ok`, A's section ends at its deadline and it
/// writes nothing after it), strictly growing tokens, nothing for fencing to catch, and no key
/// re-created on any node by the late calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_injected_at_the_holders_deadline_never_extends_past_it() {
    use std::time::Duration;

    use crate::checker::check;
    use crate::history::{Fault, Mono, Recorder};
    use crate::proxy::ProxyNet;
    use crate::resource::Resource;
    use crate::support::{cluster, holders};
    use crate::t50_data_loss::no_key_left;
    use crate::workload::{ClientSpec, Held, KEY};

    let wait = Duration::from_secs(5);
    let c = cluster(3);
    let urls = c.urls();
    let net = ProxyNet::start(1, &urls).await.unwrap();
    let (rec, resource) = (Recorder::new(), Resource::gate());
    let ttl = Duration::from_secs(1);
    let late = Duration::from_secs(1);
    let long = Duration::from_secs(8);
    let a_locks = quorumlock::Redlock::builder(net.urls(0))
        .node_timeout(long)
        .build()
        .unwrap();
    let b_locks = ClientSpec::new(1, urls.clone(), ttl, 0).locks();
    for locks in [&a_locks, &b_locks] {
        let s = locks.status(KEY).await.unwrap();
        assert_eq!(s.answered(), urls.len(), "connected everywhere first");
    }
    let a = Held::acquire(&a_locks, 0, ttl, wait, &rec).await.unwrap();
    assert!(a.write(&resource, &rec).await);

    tracing::info!("--- latency on every link of A, 50 ms before its deadline; A extends");
    tokio::time::sleep(
        a.lock()
            .validity()
            .saturating_sub(Duration::from_millis(50)),
    )
    .await;
    let start = Mono::now();
    for n in 0..urls.len() {
        net.link(0, n).set_latency(late);
    }
    let b_side = async {
        no_key_left(&urls, ttl).await;
        let b = Held::acquire(&b_locks, 1, ttl, wait, &rec)
            .await
            .expect("A's keys expired: free");
        assert!(b.write(&resource, &rec).await);
        b.release(&rec).await.unwrap();
    };
    tokio::join!(a.extend(long, &rec), b_side);
    // A careful holder writes only while its lock is valid.
    if !a.lock().is_lost() {
        a.write(&resource, &rec).await;
    }
    // A status read travels behind A's late calls: once answered everywhere, they have run.
    let s = a_locks.status(KEY).await.unwrap();
    assert_eq!(s.answered(), urls.len());
    net.heal();
    rec.fault(Fault {
        what: format!("+{late:?} on every link of A from 50 ms before its deadline"),
        start,
        healed: Mono::now(),
        available_after: None,
    });
    let lost = a.lock().is_lost();
    let revived = holders(&urls, KEY);
    let _ = a.release(&rec).await;

    let r = check(&rec.snapshot(), wait);
    assert!(
        r.overlaps.is_empty(),
        "A's late extension overlapped B: {r:?}"
    );
    assert!(r.token_regressions.is_empty(), "{r:?}");
    assert!(r.past_validity.is_empty(), "{r:?}");
    assert!(r.uncaught.is_empty(), "{r:?}");
    assert!(r.hung.is_empty(), "{r:?}");
    assert!(lost, "A's lock stays lost");
    assert_eq!(revived, 0, "the late extension re-created the key");
}
