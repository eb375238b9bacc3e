//! Several keys at once (`acquire_all`): all or nothing, no deadlock between opposite orders
//! (also with a node killed and a node stopped), never two holders of a key, one token per
//! resource.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use crate::{PATIENCE, WORKLOAD_BOUND, WORKLOAD_TTL};
use quorumlock::Error;

/// Who holds each key now, in this process: a second holder of a key is an overlap.
#[derive(Default)]
struct Occupancy {
    busy: Mutex<HashMap<String, usize>>,
}

impl Occupancy {
    fn enter(&self, who: usize, keys: &[&str]) {
        let mut busy = self.busy.lock().unwrap();
        for k in keys {
            if let Some(other) = busy.insert((*k).to_owned(), who) {
                panic!("{k} held by {other} and {who} at once");
            }
        }
    }

    fn leave(&self, keys: &[&str]) {
        let mut busy = self.busy.lock().unwrap();
        for k in keys {
            busy.remove(*k);
        }
    }
}

/// Three clients, each taking its set `ROUNDS` times (sets overlap, in opposite orders); every
/// acquisition must succeed within the patience, and the whole within the bound.
async fn opposite_orders(cluster: &quorumlock::testkit::LocalCluster) {
    let sets: [&[&str]; 3] = [&["a", "b", "c"], &["c", "b", "a"], &["b", "d", "a"]];
    let occupancy = Arc::new(Occupancy::default());
    let done = Arc::new(AtomicUsize::new(0));
    const ROUNDS: usize = 15;
    let mut tasks = Vec::new();
    for (who, set) in sets.into_iter().enumerate() {
        // One client each: nothing shared but the nodes.
        let locks = client(cluster);
        let (occupancy, done) = (Arc::clone(&occupancy), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let all = locks
                    .acquire_all_timeout(set.iter().copied(), WORKLOAD_TTL, PATIENCE)
                    .await
                    .unwrap_or_else(|e| panic!("client {who} ({set:?}): {e}"));
                assert_eq!(all.locks().len(), set.len());
                occupancy.enter(who, set);
                tokio::time::sleep(Duration::from_millis(5)).await; // the work
                assert!(
                    !all.is_lost(),
                    "lost while working: {:?}",
                    all.lost_reason()
                );
                occupancy.leave(set);
                // Under node faults a release may miss a quorum (the rest expires): not a loss.
                match all.release().await {
                    Ok(()) => {}
                    Err(e) if e.is_no_quorum() => {}
                    Err(e) => panic!("client {who}: release: {e}"),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let all = futures::future::try_join_all(tasks);
    tokio::time::timeout(WORKLOAD_BOUND, all)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "stalled: {} of {} acquisitions done",
                done.load(Ordering::SeqCst),
                3 * ROUNDS
            )
        })
        .expect("no task panicked");
    assert_eq!(done.load(Ordering::SeqCst), 3 * ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p10_overlapping_sets_in_opposite_orders_complete_without_deadlock_or_overlap() {
    let cluster = cluster(5);
    opposite_orders(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p13_opposite_orders_with_a_node_killed_and_a_node_stopped() {
    let mut cluster = cluster(5);
    cluster.kill(3).unwrap();
    cluster.pause(4).unwrap();
    opposite_orders(&cluster).await;
    cluster.resume(4).unwrap();
}

#[tokio::test]
async fn p11_one_held_resource_fails_the_whole_set_and_leaves_nothing_taken() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let (a, b) = (client(&cluster), client(&cluster));
    let held = b.try_acquire("k2", WORKLOAD_TTL).await.unwrap();

    let err = a
        .acquire_all(["k3", "k2", "k1"], WORKLOAD_TTL)
        .await
        .unwrap_err();
    assert!(err.is_held(), "{err}");
    assert!(
        matches!(&err, Error::Held { key, .. } if key == "k2"),
        "{err}"
    );
    // k1 (sorted first) was taken and is released before the error returns, on a quorum at
    // least; k3 (after the refused k2) was never asked for.
    assert!(holders(&urls, "k1") <= 2, "k1 still held on a quorum");
    assert_eq!(holders(&urls, "k3"), 0, "k3 was taken");
    let k1 = b
        .try_acquire("k1", WORKLOAD_TTL)
        .await
        .expect("k1 free at once");
    k1.release().await.unwrap();
    // The holder of k2 was never disturbed.
    assert!(!held.is_lost());
    held.release().await.unwrap();

    let all = a
        .acquire_all(["k3", "k2", "k1"], WORKLOAD_TTL)
        .await
        .expect("all free");
    assert_eq!(all.keys().collect::<Vec<_>>(), ["k1", "k2", "k3"]);
    all.release().await.unwrap();
}

#[tokio::test]
async fn p12_one_token_per_resource_and_lost_when_any_lock_is() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);

    let first = locks.acquire_all(["x", "y"], WORKLOAD_TTL).await.unwrap();
    let (x1, y1) = (first.token("x").unwrap(), first.token("y").unwrap());
    assert!(first.token("z").is_none());
    assert!(first.validity() > Duration::ZERO);
    first.release().await.unwrap();
    // y alone moves on; x's counter is its own.
    locks
        .try_acquire("y", WORKLOAD_TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let second = locks.acquire_all(["y", "x"], WORKLOAD_TTL).await.unwrap();
    assert!(second.token("x").unwrap() > x1);
    assert!(second.token("y").unwrap().get() >= y1.get() + 2);

    // Someone else's value on every node for y: the next extension of y finds it gone, and the
    // whole guard is lost.
    for url in &urls {
        set_foreign(url, "y", "intruder", WORKLOAD_TTL);
    }
    tokio::time::timeout(WAIT, second.extend(WORKLOAD_TTL))
        .await
        .expect("bounded")
        .expect_err("y is no longer ours");
    tokio::time::timeout(WAIT, second.lost())
        .await
        .expect("the guard is lost when any lock is");
    assert!(second.is_lost());
    assert!(second.lost_reason().is_some());
    let _ = second.release().await;
}
