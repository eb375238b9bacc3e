//! Item 4: a node whose memory policy can evict lock keys (`maxmemory` set with a `volatile-*`
//! or `allkeys-*` policy) is reported: a warning per node, its risk in `status()`; and in strict
//! mode it is held out of every quorum, so an acquisition fails naming the policy instead of
//! standing on keys the node may drop without any restart.

use std::time::Duration;

use quorumlock::testkit::{LocalCluster, ServerOptions};
use quorumlock::{EvictionGuard, EvictionRisk};

use crate::support::{Captured, builder, conn, init_tracing, value_on, warm};

const KEY: &str = "evicted";
/// Far longer than the test: only an eviction (or the test) removes a holder's key.
const HELD_TTL: Duration = Duration::from_secs(60);
/// Small enough to fill in a moment, above what an idle server uses (about 1 MB).
const MAXMEMORY: u64 = 4 << 20;

fn evicting_cluster(n: usize) -> LocalCluster {
    init_tracing();
    LocalCluster::start_with(
        n,
        &ServerOptions::new().maxmemory(MAXMEMORY, "volatile-lru"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Writes keys with a ttl (as any cache sharing the server would) until `KEY`'s lock key is
/// gone from the node; bounded.
fn fill_until_evicted(url: &str) {
    let mut c = conn(url);
    let value = "x".repeat(1024);
    for batch in 0..400 {
        let mut pipe = redis::pipe();
        for i in 0..100 {
            pipe.cmd("SET")
                .arg(format!("cache:{batch}:{i}"))
                .arg(&value)
                .arg("PX")
                .arg(3_600_000)
                .ignore();
        }
        let _: () = pipe.query(&mut c).expect("fill");
        if value_on(url, KEY).is_none() {
            return;
        }
    }
    panic!("the lock key on {url} was never evicted");
}

/// The risk is real (the lock key is evicted while the lock is valid, on two of three nodes, and
/// a second client acquires the same lock); the default client says so: a warning per node and
/// the risk in `status()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_can_evict_lock_keys_is_reported_in_status() {
    let cluster = evicting_cluster(3);
    let urls = cluster.urls();
    let first = builder(&cluster).build().unwrap();
    warm(&first).await;
    let status = first.status(KEY).await.unwrap();
    for node in &status.nodes {
        assert_eq!(
            node.eviction,
            EvictionRisk::LockKeys {
                policy: "volatile-lru".to_owned()
            },
            "{}",
            node.node
        );
    }
    let lock = first.try_acquire(KEY, HELD_TTL).await.expect("acquire");
    fill_until_evicted(&urls[0]);
    fill_until_evicted(&urls[1]);
    // What the warning is about: a second holder beside a valid lock, no restart involved.
    let second = builder(&cluster).build().unwrap();
    let overlap = second.try_acquire(KEY, HELD_TTL).await;
    assert!(
        overlap.is_ok(),
        "the evicted keys let a second client acquire: {:?}",
        overlap.err()
    );
    drop(lock);
}

/// In strict mode such nodes are held out: the acquisition fails naming the policy, and the
/// nodes' state in `status()` still shows what they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_holds_out_a_node_that_can_evict_lock_keys() {
    let cluster = evicting_cluster(3);
    let strict = builder(&cluster)
        .eviction_guard(EvictionGuard::Strict)
        .build()
        .unwrap();
    warm(&strict).await;
    let e = strict
        .try_acquire(KEY, HELD_TTL)
        .await
        .expect_err("no node counts toward a quorum");
    assert!(e.is_no_quorum(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("strict eviction guard") && text.contains("volatile-lru"),
        "{text}"
    );
    let status = strict.status(KEY).await.unwrap();
    assert_eq!(status.answered(), 3);
    assert!(status.nodes.iter().all(|n| n.eviction.is_risky()));
}

/// A node without `maxmemory` (the default) or with `noeviction` reports no risk, and strict
/// mode keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_keeps_nodes_that_cannot_evict() {
    init_tracing();
    let cluster =
        LocalCluster::start_with(3, &ServerOptions::new().maxmemory(MAXMEMORY, "noeviction"))
            .unwrap_or_else(|e| panic!("{e}"));
    let strict = builder(&cluster)
        .eviction_guard(EvictionGuard::Strict)
        .build()
        .unwrap();
    let lock = strict.try_acquire(KEY, HELD_TTL).await.expect("acquire");
    let status = strict.status(KEY).await.unwrap();
    assert_every_node(&status, EvictionRisk::None);
    lock.release().await.unwrap();
}

/// A node that refuses `CONFIG GET` (managed services rename it) still has its risk read, from
/// `INFO memory` (`maxmemory`, `maxmemory_policy`): a `volatile-lru` node is reported and held
/// out under the strict guard, a node without `maxmemory` reports none and counts, and neither
/// lists a setting as unchecked (without AOF, `appendfsync` is not needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_config_get_has_its_risk_read_from_info() {
    init_tracing();
    let cluster = LocalCluster::start_with(3, &ServerOptions::new().config_disabled())
        .unwrap_or_else(|e| panic!("{e}"));
    let strict = builder(&cluster)
        .eviction_guard(EvictionGuard::Strict)
        .build()
        .unwrap();
    let lock = strict.try_acquire(KEY, HELD_TTL).await.expect("acquire");
    let status = strict.status(KEY).await.unwrap();
    assert_eq!(status.answered(), 3, "{status:?}");
    assert_every_node(&status, EvictionRisk::None);
    assert!(
        status.nodes.iter().all(|n| n.unchecked.is_empty()),
        "{status:?}"
    );
    lock.release().await.unwrap();

    let risky = LocalCluster::start_with(
        3,
        &ServerOptions::new()
            .config_disabled()
            .maxmemory(MAXMEMORY, "volatile-lru"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let strict = builder(&risky)
        .eviction_guard(EvictionGuard::Strict)
        .build()
        .unwrap();
    let e = strict.try_acquire(KEY, HELD_TTL).await.unwrap_err();
    assert!(e.to_string().contains("volatile-lru"), "{e}");
    let status = strict.status(KEY).await.unwrap();
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.eviction.is_risky() && n.unchecked.is_empty()),
        "{status:?}"
    );
}

/// The warning names the node, the policy and what it risks, once per node: a reconnect (here
/// after a restart) to a node with the same policy does not repeat it. A current-thread
/// runtime, so the connect tasks log to this thread's subscriber.
#[tokio::test]
async fn the_eviction_warning_names_node_and_policy_once_per_node() {
    let mut cluster = evicting_cluster(3);
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let locks = builder(&cluster).build().unwrap();
    warm(&locks).await;
    cluster.restart(0).unwrap();
    warm(&locks).await;
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("may evict lock keys"))
        .collect();
    assert_eq!(warnings.len(), 3, "one per node: {text}");
    for name in locks.node_names() {
        let line = warnings
            .iter()
            .find(|l| l.contains(&format!("node={name} ")))
            .unwrap_or_else(|| panic!("a warning for {name}: {text}"));
        assert!(
            line.contains("volatile-lru") && line.contains("lock keys can be evicted"),
            "{line}"
        );
    }
}

/// Every node of `status` reports `risk`.
fn assert_every_node(status: &quorumlock::LockStatus, risk: EvictionRisk) {
    assert!(
        status.nodes.iter().all(|n| n.eviction == risk),
        "every node should report {risk:?}: {status:?}"
    );
}
