//! Measurements for `docs/benchmarks.md` (ignored): rounds per handover under steady
//! contention, and a timestamped trace of handovers with a node hung.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::sets_since;
use crate::support::*;
use quorumlock::Redlock;

/// Rounds per handover under steady contention, for `docs/benchmarks.md` and issue 27's target
/// (at most one round per waiting client per handover, plus the winner's): three fresh clients
/// with two tasks each take a lock 30 times in turn (held 20 ms each). Prints `SET`s per node
/// (one per round that reached it) per acquisition:
/// `cargo test --features testkit --test waiting w91 -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement"]
async fn w91_rounds_per_handover_under_steady_contention() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let clients: Vec<Redlock> = (0..3).map(|_| client(&cluster)).collect();
    let before = sets(&urls);
    let total = 30;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = clients
        .iter()
        .flat_map(|c| [c.clone(), c.clone()])
        .map(|locks| {
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                while done.load(Ordering::SeqCst) < total {
                    let Ok(lock) = locks
                        .acquire_timeout("w91", Duration::from_secs(10), WAIT)
                        .await
                    else {
                        continue;
                    };
                    done.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = lock.release().await;
                }
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(WAIT * 6, t).await.unwrap().unwrap();
    }
    let n = done.load(Ordering::SeqCst) as f64;
    let rounds = sets_since(&urls, &before);
    let per = rounds.iter().map(|&r| r as f64 / n).collect::<Vec<_>>();
    eprintln!(
        "{n} acquisitions by 6 tasks in 3 clients: SET per node {rounds:?}, per acquisition {per:.2?}"
    );
}

/// A timestamped trace of handovers (8 tasks of one client on one key, the default 50 ms node
/// timeout), healthy and with node 0 paused, alternating four times (a change of load on the
/// machine touches both alike), for `docs/benchmarks.md`:
/// `RUST_LOG=quorumlock=trace cargo test --features testkit --test waiting w90 -- --ignored
/// --nocapture`. Prints each phase's acquisitions, the ratio, and the handovers slower than the
/// node timeout (a round that waited for the paused node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement"]
async fn w90_trace_handovers_with_a_node_hung() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "quorumlock=trace".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let mut cluster = cluster(5);
    let node_timeout = Duration::from_millis(50);
    let locks = builder(&cluster)
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    warm(&locks).await;
    // (acquisitions, handovers slower than the node timeout)
    let run = |locks: Redlock| async move {
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let slow = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let last = Arc::new(std::sync::Mutex::new(tokio::time::Instant::now()));
        let stop = tokio::time::Instant::now() + Duration::from_secs(1);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (locks, n, slow, last) = (
                    locks.clone(),
                    Arc::clone(&n),
                    Arc::clone(&slow),
                    Arc::clone(&last),
                );
                tokio::spawn(async move {
                    while tokio::time::Instant::now() < stop {
                        let ttl = Duration::from_secs(10);
                        if let Ok(l) = locks.acquire_timeout("w90", ttl, WAIT).await {
                            n.fetch_add(1, Ordering::SeqCst);
                            {
                                let last = last.lock().unwrap();
                                if last.elapsed() > node_timeout {
                                    slow.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            let _ = l.release().await;
                            *last.lock().unwrap() = tokio::time::Instant::now();
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(WAIT * 2, t).await.unwrap().unwrap();
        }
        (n.load(Ordering::SeqCst), slow.load(Ordering::SeqCst))
    };
    let (mut healthy, mut hung) = ((0, 0), (0, 0));
    for _ in 0..4 {
        let (n, slow) = run(locks.clone()).await;
        eprintln!("healthy: {n} acquisitions, {slow} handovers slower than the node timeout");
        healthy = (healthy.0 + n, healthy.1 + slow);
        cluster.pause(0).unwrap();
        let (n, slow) = run(locks.clone()).await;
        eprintln!("hung: {n} acquisitions, {slow} handovers slower than the node timeout");
        hung = (hung.0 + n, hung.1 + slow);
        cluster.resume(0).unwrap();
    }
    eprintln!(
        "total healthy {healthy:?}, hung {hung:?}: ratio {:.2}",
        hung.0 as f64 / healthy.0 as f64
    );
}
