//! A clock jump on one node, in the scenario Kleppmann described: a holder with a bare majority
//! loses its key on one of those nodes because that node's clock jumped forward.
//!
//! The jump is simulated (every key's remaining ttl on the node is cut by the jump, see
//! `nemesis::jump_clock`): the server's own clock does not move, so the client's clock-jump
//! check cannot see it, which is the case it leaves open (a jump no reading of `TIME` shows).
//! A real step of a server's clock, which the check holds out, is `tests/safety/s17_clock_jump.rs`.

use std::time::Duration;

use crate::checker::check;
use crate::history::Recorder;
use crate::nemesis::FaultKind;
use crate::nemesis::jump_clock;
use crate::proxy::ProxyNet;
use crate::resource::Resource;
use crate::runner::{SHORT, Scenario, run, seed};
use crate::support::cluster;
use crate::workload::{ClientSpec, Held};

const WAIT: Duration = Duration::from_secs(5);

/// A is cut from node 0 and acquires on nodes 1 and 2; node 2's clock jumps past the ttl, so
/// A's key there expires; B, who sees every node, acquires on nodes 0 and 2.
///
/// Expected: mutual exclusion is broken (Redlock assumes bounded clock drift): the checker
/// reports the overlap. Tokens still grow (fencing counters never expire, so node 2's counter
/// carries A's token into B's) and fencing rejects A's next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_jump_under_a_bare_majority_breaks_exclusion_and_fencing_catches_it() {
    let c = cluster(3);
    let urls = c.urls();
    let net = ProxyNet::start(1, &urls).await.unwrap();
    let (rec, resource) = (Recorder::new(), Resource::gate());
    let ttl = Duration::from_secs(10);
    let a_locks = ClientSpec::new(0, net.urls(0), ttl, 0).locks();
    let b_locks = ClientSpec::new(1, urls.clone(), ttl, 0).locks();
    b_locks.status(crate::workload::KEY).await.unwrap(); // connected before the first round
    // A few short leases first; then no key may be left anywhere (a release can leave one
    // behind on a node until its ttl, see `t50_data_loss::no_key_left`).
    let warm = Duration::from_secs(1);
    for _ in 0..3 {
        let h = Held::acquire(&b_locks, 1, warm, WAIT, &rec).await.unwrap();
        assert!(h.write(&resource, &rec).await);
        h.release(&rec).await.unwrap();
    }
    crate::t50_data_loss::no_key_left(&urls, warm).await;
    a_locks.status(crate::workload::KEY).await.unwrap(); // A is connected to every node

    tracing::info!("--- A is cut from node 0 and acquires on nodes 1 and 2");
    net.link(0, 0).set_blackhole(true);
    let a = Held::acquire(&a_locks, 0, ttl, WAIT, &rec).await.unwrap();
    assert!(a.write(&resource, &rec).await);

    tracing::info!("--- node 2's clock jumps forward by more than the ttl");
    assert!(
        jump_clock(&urls[2], ttl + Duration::from_secs(1), None)
            .await
            .0
            >= 1,
        "A's key expired there"
    );

    let b = Held::acquire(&b_locks, 1, ttl, WAIT, &rec)
        .await
        .expect("nodes 0 and 2 are free: a majority");
    assert!(!a.lock().is_lost(), "A's validity still runs: two holders");
    assert!(b.token > a.token, "{} > {}", b.token, a.token);
    assert!(b.write(&resource, &rec).await);
    assert!(!a.write(&resource, &rec).await, "A's write is stale");

    net.heal();
    let (a_session, b_session) = (a.session, b.session);
    b.release(&rec).await.unwrap();
    let _ = a.release(&rec).await;

    let r = check(&rec.snapshot(), Duration::from_secs(5));
    assert_eq!(r.overlaps, vec![(a_session, b_session)], "{r:?}");
    assert!(r.token_regressions.is_empty(), "{r:?}");
    assert!(r.uncaught.is_empty(), "{r:?}");
    assert_eq!((r.stale_rejected, r.caught), (1, 1), "{r:?}");
}

/// The same fault drawn at random: a client is cut from a minority of five nodes, and as soon as
/// it holds the lock on the bare majority it still sees, one node of that majority jumps
/// forward by 1 to 2 ttl; three clients contend throughout.
///
/// Expected: at least one jump fired as targeted (it expired the key of a holder that counted
/// on that node for its bare majority: otherwise the run tested nothing); overlaps are
/// possible; every one is caught: tokens still grow, no write that fencing should refuse gets
/// through, nothing hangs, the other clients keep acquiring during each jump, and the lock is
/// acquired again within 7.5 s of every heal.
///
/// Whether a jump fires depends on timing (the cut client must win the lock within half the
/// fault's hold while two others contend), so a run whose five jumps all missed is run again
/// with the next seed, up to five runs; each run must be safe either way. False-failure bound:
/// loaded runs fired 8 of 15 jumps (2, 3 and 3 of 5); with a floor of p = 0.35 per jump, a run
/// misses all five with at most 0.65^5 = 0.116, and five runs in a row with at most 2.1e-5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_clock_jumps_are_caught_by_fencing() {
    let scn = Scenario::new("clock-jump", &[FaultKind::ClockJump]);
    let first = seed(70);
    for attempt in 0..5 {
        let out = run(&scn, first + attempt, SHORT * 2).await;
        out.assert_busy(10);
        out.assert_caught();
        out.assert_recovered();
        if out.report.jumps_fired >= 1 {
            return;
        }
        println!(
            "[chaos clock-jump] no jump hit a bare-majority holder in run {attempt}: running again"
        );
    }
    panic!("no clock jump hit a bare-majority holder in five runs: the test tested nothing");
}
