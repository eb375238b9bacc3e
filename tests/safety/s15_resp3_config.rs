//! Issue 26, item 6: over RESP3 (`?protocol=resp3`, or a user's RESP3 `redis::Client`) `CONFIG
//! GET` replies with a map, not a flat list. Both shapes are read the same way, so the eviction
//! guard and the durability check work over RESP3 too: a `volatile-lru` node is reported and
//! held out under `EvictionGuard::Strict`, and an `appendfsync always` node that restarts with
//! its data counts at once.

use std::time::Duration;

use quorumlock::testkit::{LocalCluster, ServerOptions};
use quorumlock::{Error, EvictionGuard, EvictionRisk, NodeError, Redlock};

use crate::support::{NODE_TIMEOUT, TTL, init_tracing, warm};

/// The cluster's node URLs, asking for RESP3.
fn resp3_urls(cluster: &LocalCluster) -> Vec<String> {
    cluster
        .urls()
        .into_iter()
        .map(|u| format!("{u}/?protocol=resp3"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15a_over_resp3_the_eviction_policy_is_read_and_strict_mode_holds_the_node_out() {
    init_tracing();
    let cluster =
        LocalCluster::start_with(3, &ServerOptions::new().maxmemory(4 << 20, "volatile-lru"))
            .unwrap_or_else(|e| panic!("{e}"));
    let locks = Redlock::builder(resp3_urls(&cluster))
        .node_timeout(NODE_TIMEOUT)
        .eviction_guard(EvictionGuard::Strict)
        .build()
        .unwrap();
    let status = locks.status("s15a").await.unwrap();
    for node in &status.nodes {
        assert_eq!(
            (&node.eviction, node.unchecked.as_slice()),
            (
                &EvictionRisk::LockKeys {
                    policy: "volatile-lru".to_owned()
                },
                &[][..]
            ),
            "{}",
            node.node
        );
    }
    match locks.try_acquire("s15a", TTL).await {
        Err(Error::NoQuorum { failures, .. }) => assert!(
            failures
                .iter()
                .all(|f| matches!(f.cause, NodeError::Evicting(_))),
            "{failures:?}"
        ),
        other => panic!("a volatile-lru node counted under the strict guard: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15b_over_resp3_an_always_fsynced_node_that_kept_its_data_counts_at_once() {
    init_tracing();
    let mut cluster = LocalCluster::start_with(3, &ServerOptions::new().aof_always())
        .unwrap_or_else(|e| panic!("{e}"));
    let locks = Redlock::builder(resp3_urls(&cluster))
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .max_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    warm(&locks).await;
    // Node 0 restarts with its data (append-only file, fsynced on every write): with node 1
    // paused, an acquisition needs it, at once.
    cluster.restart(0).unwrap();
    cluster.pause(1).unwrap();
    let mut last = None;
    for _ in 0..50 {
        match locks.try_acquire("s15b", TTL).await {
            Ok(lock) => {
                cluster.resume(1).unwrap();
                lock.release().await.ok();
                return;
            }
            Err(e) => {
                if let Error::NoQuorum { failures, .. } = &e {
                    assert!(
                        !failures
                            .iter()
                            .any(|f| matches!(f.cause, NodeError::HeldOut { .. })),
                        "an always-fsynced node that kept its data was held out: {e}"
                    );
                }
                last = Some(e);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.resume(1).unwrap();
    panic!("never acquired with node 0 back: {last:?}");
}
