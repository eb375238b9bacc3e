//! How evenly contenders share a lock (a distribution, so a benchmark and not a test: the design
//! promises no starvation, which `tests/waiting/turns.rs` w15 checks, but not a fair share).
//!
//! Each run starts five masters, kills two (exactly a quorum left, the hardest case), and lets
//! six contenders in three clients (two tasks each) take the lock, hold it for a yield and
//! release it, until 60 acquisitions were made. It prints each run's counts and, over all runs,
//! the smallest and largest count of any contender beside what six fair contenders would give
//! (each acquisition a fair draw: the fewest in a run is 0 about 1 run in 9,400, the most 23 or
//! more about 1 run in 3,400).
//!
//! `cargo bench --features testkit --bench fairness` (`FAIRNESS_RUNS`, default 20).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;

const CONTENDERS_PER_CLIENT: usize = 2;
const CLIENTS: usize = 3;
const TOTAL: usize = 60;

async fn one_run() -> Vec<usize> {
    let mut cluster = LocalCluster::start(5).unwrap_or_else(|e| panic!("{e}"));
    cluster.kill(3).expect("kill");
    cluster.kill(4).expect("kill");
    let clients: Vec<Redlock> = (0..CLIENTS)
        .map(|_| {
            Redlock::builder(cluster.urls())
                .node_timeout(Duration::from_millis(300))
                .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
                .build()
                .expect("valid config")
        })
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = clients
        .iter()
        .flat_map(|c| std::iter::repeat_n(c.clone(), CONTENDERS_PER_CLIENT))
        .map(|locks| {
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut mine = 0;
                while done.load(Ordering::SeqCst) < TOTAL {
                    let Ok(lock) = locks
                        .acquire_timeout("fair", Duration::from_secs(5), Duration::from_secs(10))
                        .await
                    else {
                        continue;
                    };
                    if done.fetch_add(1, Ordering::SeqCst) < TOTAL {
                        mine += 1;
                    }
                    tokio::task::yield_now().await;
                    let _ = lock.release().await;
                }
                mine
            })
        })
        .collect();
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await.expect("contender"));
    }
    counts
}

fn main() {
    // `cargo bench` passes `--bench`; this program takes no arguments of its own.
    let runs: usize = std::env::var("FAIRNESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (mut fewest, mut most) = (usize::MAX, 0);
    let mut below_a_third = 0;
    for run in 0..runs {
        let counts = rt.block_on(one_run());
        let (min, max) = (
            *counts.iter().min().expect("contenders"),
            *counts.iter().max().expect("contenders"),
        );
        fewest = fewest.min(min);
        most = most.max(max);
        if min * 3 < max {
            below_a_third += 1;
        }
        println!("run {run:>3}: {counts:?} (fewest {min}, most {max})");
    }
    println!(
        "{runs} runs of {TOTAL} acquisitions by {} contenders: fewest {fewest}, most {most} \
         (a fair draw: 10 each on average); runs whose fewest was under a third of their most: \
         {below_a_third}",
        CLIENTS * CONTENDERS_PER_CLIENT
    );
}
