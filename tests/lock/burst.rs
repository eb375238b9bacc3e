//! A burst from one client against healthy nodes: thousands of locks taken, dropped or
//! released at once. The client's own queue to each node is long; the nodes are healthy and
//! answer throughout. Nothing may be left standing after `flush`, and no failure may name a
//! node that answered all along.

use std::time::Duration;

use futures::future::join_all;

use crate::LONG;
use crate::support::*;

/// Locks per burst: enough that the client's queue to each node is several node timeouts
/// long on a 2-core machine (thousands of scripts per node).
const BURST: usize = 8000;

/// A node timeout short against the burst's queue, long against one command.
const SHORT: Duration = Duration::from_millis(50);

/// Lock keys of this test's prefix standing on one node.
fn standing(url: &str, prefix: &str) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("quorumlock:{{{prefix}-*}}"))
        .query(&mut conn(url))
        .expect("KEYS");
    keys.len()
}

fn standing_everywhere(urls: &[String], prefix: &str) -> Vec<usize> {
    urls.iter().map(|u| standing(u, prefix)).collect()
}

async fn take_all(locks: &quorumlock::Redlock, prefix: &str) -> Vec<quorumlock::Lock> {
    let mut held = Vec::with_capacity(BURST);
    // In batches: the burst under test is the release, not the acquisition.
    let keys: Vec<String> = (0..BURST).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in keys.chunks(20) {
        let got = join_all(chunk.iter().map(|k| locks.try_acquire(k, LONG))).await;
        for lock in got {
            held.push(lock.expect("a batch of 20 acquires on healthy nodes"));
        }
    }
    held
}

#[tokio::test]
async fn t80_a_dropped_burst_is_released_by_flush() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster).node_timeout(SHORT).build().unwrap();
    warm(&locks).await;
    let held = take_all(&locks, "drop").await;
    drop(held);
    let report = locks.flush().await;
    let left = standing_everywhere(&urls, "drop");
    assert_eq!(
        left,
        vec![0; urls.len()],
        "lock keys left standing on healthy nodes after {BURST} dropped locks and flush ({report:?})"
    );
    assert_eq!(report.undelivered(), 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t81_a_released_burst_blames_no_healthy_node() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster).node_timeout(SHORT).build().unwrap();
    warm(&locks).await;
    let held = take_all(&locks, "rel").await;
    let results = join_all(held.into_iter().map(|lock| lock.release())).await;
    let failed: Vec<_> = results.into_iter().filter_map(Result::err).collect();
    assert!(
        failed.is_empty(),
        "{} of {BURST} releases at once failed on healthy nodes; first: {}",
        failed.len(),
        failed[0]
    );
    let report = locks.flush().await;
    assert_eq!(
        standing_everywhere(&urls, "rel"),
        vec![0; urls.len()],
        "lock keys left standing after every release succeeded and flush ({report:?})"
    );
}

#[tokio::test]
async fn t82_a_burst_of_acquisitions_blames_no_healthy_node() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster).node_timeout(SHORT).build().unwrap();
    warm(&locks).await;
    let keys: Vec<String> = (0..BURST).map(|i| format!("acq-{i}")).collect();
    let results = join_all(keys.iter().map(|k| locks.try_acquire(k, LONG))).await;
    let mut held = Vec::new();
    let mut blamed = Vec::new();
    for r in results {
        match r {
            Ok(lock) => held.push(lock),
            // The client may say it is overloaded; it may not blame the nodes.
            Err(e) if e.is_overloaded() => {}
            Err(e) => blamed.push(e),
        }
    }
    assert!(
        blamed.is_empty(),
        "{} of {BURST} acquisitions at once failed naming healthy nodes; first: {}",
        blamed.len(),
        blamed[0]
    );
    drop(held);
    let report = locks.flush().await;
    assert_eq!(
        standing_everywhere(&urls, "acq"),
        vec![0; urls.len()],
        "lock keys left standing after a burst of acquisitions was dropped and flushed ({report:?})"
    );
}
