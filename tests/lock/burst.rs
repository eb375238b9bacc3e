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

/// The node timeout: short against the burst's queue (the client's own work for thousands of
/// calls), long against one command on a loaded machine.
const SHORT: Duration = NODE_TIMEOUT;

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
    take(locks, prefix, BURST).await
}

async fn take(locks: &quorumlock::Redlock, prefix: &str, count: usize) -> Vec<quorumlock::Lock> {
    let mut held = Vec::with_capacity(count);
    // In batches: the burst under test is the release, not the acquisition.
    let keys: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in keys.chunks(20) {
        let got = join_all(chunk.iter().map(|k| locks.try_acquire(k, LONG))).await;
        for lock in got {
            held.push(lock.expect("a batch of 20 acquires on healthy nodes"));
        }
    }
    held
}

#[tokio::test]
async fn t90_a_dropped_burst_is_released_by_flush() {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_a_released_burst_blames_no_healthy_node() {
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
async fn t92_a_burst_of_acquisitions_blames_no_healthy_node() {
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

/// Operations in flight while one node is hung: its connection's queue (the kernel's buffers,
/// then the client's) fills with calls it will not read for a while.
const BEHIND_HUNG: usize = 6000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t93_a_release_behind_a_hung_nodes_backlog_reaches_the_others() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster).node_timeout(SHORT).build().unwrap();
    warm(&locks).await;
    cluster.pause(2).unwrap();
    // Many operations, each reaching the hung node's connection too.
    let mut held = take(&locks, "hung", BEHIND_HUNG).await;
    let last = locks.try_acquire("hung-last", LONG).await.expect("last");
    let dropped = locks
        .try_acquire("hung-dropped", LONG)
        .await
        .expect("dropped");
    // Releases queued behind the hung node's backlog, explicit and in the background.
    let half = held.split_off(held.len() / 2);
    drop(half);
    let released = join_all(held.into_iter().map(|lock| lock.release())).await;
    for r in released {
        r.expect("a release with two healthy nodes of three");
    }
    last.release().await.expect("the last release");
    drop(dropped);
    let report = locks.flush().await;
    let healthy = &urls[..2];
    assert_eq!(
        standing_everywhere(healthy, "hung"),
        vec![0; 2],
        "lock keys left standing on the healthy nodes after releases queued behind a hung node ({report:?})"
    );
    cluster.resume(2).unwrap();
}

/// A ttl whose validity budget a burst of [`BURST`] acquisitions cannot fit in: the nodes
/// alone run 3 × 8,000 scripts, over 100 ms of their CPU on two cores at 10 µs a script.
const BRIEF: Duration = Duration::from_millis(100);

#[tokio::test]
async fn t94_an_overloaded_client_says_so_and_blames_no_node() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster).node_timeout(SHORT).build().unwrap();
    warm(&locks).await;
    let keys: Vec<String> = (0..BURST).map(|i| format!("brief-{i}")).collect();
    let results = join_all(keys.iter().map(|k| locks.try_acquire(k, BRIEF))).await;
    let mut said_so = 0;
    let mut blamed = Vec::new();
    let mut held = Vec::new();
    for r in results {
        match r {
            Ok(lock) => held.push(lock),
            // The two truthful answers: the client's own backlog kept the quorum away past the
            // budget, or a quorum came once no validity was left.
            Err(e) if e.is_overloaded() => {
                let text = e.to_string();
                assert!(
                    text.contains("this client is overloaded") && !text.contains("127.0.0.1"),
                    "the overload names no node: {text}"
                );
                said_so += 1;
            }
            Err(quorumlock::Error::ValidityExpired { .. }) => said_so += 1,
            Err(e) => blamed.push(e),
        }
    }
    assert!(
        blamed.is_empty(),
        "{} of {BURST} acquisitions failed naming nodes; first: {}",
        blamed.len(),
        blamed[0]
    );
    assert!(
        said_so > 0,
        "{BURST} acquisitions cannot all fit in a {BRIEF:?} ttl ({} granted)",
        held.len()
    );
    drop(held);
    let _ = locks.flush().await;
    let _ = urls;
}
