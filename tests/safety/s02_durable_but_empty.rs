//! Item 2: a node configured for durability (`appendonly yes`, `appendfsync always`) is trusted
//! across a restart only when its data demonstrably survived it (the durability marker written
//! before the restart is still there). One that comes back empty (a container without a volume,
//! a replaced disk) is held out and repaired like any restarted node, so no second holder can
//! assemble a quorum beside a valid lock, nor draw the same fencing token.

use quorumlock::testkit::{LocalCluster, ServerOptions};
use quorumlock::{Lock, Redlock, RestartGuard};

use crate::support::{LONG_TTL, builder, holders, init_tracing, warm};

const KEY: &str = "durable";

/// Three `appendfsync always` nodes; `observer` has met every node before the restarts. A lock
/// (token 1) stands on nodes 0 and 1 only (node 2 was down when it was taken); then node 2
/// restarts keeping its data and node 0 restarts with its data directory gone.
async fn lock_then_restarts() -> (LocalCluster, Redlock, Lock) {
    init_tracing();
    let mut cluster = LocalCluster::start_with(3, &ServerOptions::new().aof_always())
        .unwrap_or_else(|e| panic!("{e}"));
    let urls = cluster.urls();
    let observer = builder(&cluster).build().unwrap();
    warm(&observer).await;
    let holder = builder(&cluster).build().unwrap();
    cluster.kill(2).unwrap();
    let lock = holder
        .try_acquire(KEY, LONG_TTL)
        .await
        .expect("holder acquires");
    assert_eq!(
        holders(&urls[..2], KEY),
        2,
        "the lock stands on nodes 0 and 1"
    );
    cluster.restart(2).unwrap(); // data kept: the marker written before survives
    cluster.restart_empty(0).unwrap(); // data directory lost
    (cluster, observer, lock)
}

fn assert_no_second_holder(second: Result<Lock, quorumlock::Error>, first: &Lock) {
    if let Ok(second) = &second {
        panic!(
            "a second holder acquired {KEY:?} while the first still holds it (tokens {} and {})",
            first.token(),
            second.token()
        );
    }
}

/// With node 1 gone, an acquisition of another key needs nodes 0 and 2: it fails naming node 0
/// (came back empty) as held out, and not node 2 (kept its data).
async fn assert_only_the_emptied_node_is_held_out(cluster: &mut LocalCluster, locks: &Redlock) {
    cluster.kill(1).unwrap();
    let names = locks.node_names();
    let e = locks
        .try_acquire("probe", LONG_TTL)
        .await
        .expect_err("node 0 is held out, node 1 is down")
        .to_string();
    assert!(e.contains(&format!("{}: held out", names[0])), "{e}");
    assert!(!e.contains(&format!("{}: held out", names[2])), "{e}");
}

/// A client that saw node 0 before it came back empty holds it out and repairs it, although
/// the node runs with `appendfsync always`; node 2, restarted with its data, counts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_fsynced_node_that_comes_back_empty_is_held_out() {
    let (mut cluster, observer, lock) = lock_then_restarts().await;
    // Reconnects to every node (the restarts broke its connections): it reads the new run ids.
    warm(&observer).await;
    let second = observer.try_acquire(KEY, LONG_TTL).await;
    assert_no_second_holder(second, &lock);
    assert_only_the_emptied_node_is_held_out(&mut cluster, &observer).await;
    let _ = lock.release().await;
}

/// A client that meets node 0 only after it came back empty, under the strict guard, holds it
/// out: the marker there was written after the restart (by another client), so it proves
/// nothing about what survived. Node 2's marker predates its restart: it is trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_first_met_after_an_empty_restart_is_not_trusted_for_its_fsync_policy() {
    let (mut cluster, _observer, lock) = lock_then_restarts().await;
    // Another client meets the nodes first, writing the marker on node 0 anew.
    let other = builder(&cluster).build().unwrap();
    warm(&other).await;
    let strict = builder(&cluster)
        .restart_guard(RestartGuard::Strict)
        .build()
        .unwrap();
    let second = strict.try_acquire(KEY, LONG_TTL).await;
    assert_no_second_holder(second, &lock);
    assert_only_the_emptied_node_is_held_out(&mut cluster, &strict).await;
    let _ = lock.release().await;
}
