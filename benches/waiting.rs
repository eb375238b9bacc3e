//! What waiting for a held lock costs and how fast the lock moves on: issue 27's targets, each
//! measured on five local `redis-server` masters against a baseline from the same run (the box
//! is shared: only ratios and counts are comparable between runs).
//!
//! Every client is *fresh* (`Redlock::builder(..).build()` just before it is used, its
//! connections not up yet), as every `redlock` run and every new process is.
//!
//! - **round trip**: p50 of an uncontended `acquire` of a free key (one parallel round); the
//!   unit of the next two rows.
//! - **handover**: a holder releases while a fresh client waits (`acquire_timeout`); the time from
//!   the start of `release()` to the waiter holding the lock, also in round trips of the same
//!   trial (a warm client's acquisition of a free key just before the release: the box's load
//!   changes within a run). Target: two round trips (the release's and the waiter's).
//! - **crashed holder**: a holder acquires (1 s ttl) and forgets the lock, as a crashed process
//!   would; the time from the key's expiry on the last node (read with `PTTL`) to the waiter
//!   holding the lock. Target: p50 within 50 ms.
//! - **rounds per second while held**: a fresh client waits 3 s for a lock a `keep_alive()`
//!   holder keeps; its `SET`s per node per second (`INFO commandstats`: refused or not, a round
//!   is one `SET` per node). Target: at most 4.
//! - **steady contention**: four fresh clients, one task each, take one key in turn (acquire,
//!   release) 200 times; `SET`s per node per acquisition. Target: at most one round per waiting
//!   client per handover plus the winner's (here 4).
//!
//! `cargo bench --features testkit --bench waiting` (`WAITING_TRIALS`, default 40).

use std::time::{Duration, Instant};

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;

const NODES: usize = 5;

fn fresh(cluster: &LocalCluster) -> Redlock {
    Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(250))
        .build()
        .expect("valid config")
}

fn conn(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("a node answers")
}

/// Per node, its `SET` calls so far (`INFO commandstats`, calls made by scripts included).
fn sets(urls: &[String]) -> Vec<u64> {
    urls.iter()
        .map(|u| {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut conn(u))
                .expect("INFO");
            info.lines()
                .find(|l| l.starts_with("cmdstat_set:"))
                .and_then(|l| l.split("calls=").nth(1))
                .and_then(|rest| rest.split(',').next()?.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

fn busiest(before: &[u64], after: &[u64]) -> u64 {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| a - b)
        .max()
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn summary(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    (
        percentile(&v, 0.5),
        percentile(&v, 0.9),
        *v.last().unwrap_or(&Duration::ZERO),
    )
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn round_trip(cluster: &LocalCluster, trials: usize) -> Vec<Duration> {
    let locks = fresh(cluster);
    let mut out = Vec::new();
    // The first acquisitions open the connections: not part of the round trip.
    for i in 0..trials + 5 {
        let start = Instant::now();
        let lock = locks
            .acquire(&format!("rt{i}"), Duration::from_secs(5))
            .await
            .expect("a free key is acquired");
        let took = start.elapsed();
        lock.release().await.expect("released");
        if i >= 5 {
            out.push(took);
        }
    }
    out
}

/// `warm`: one waiting client for every trial (its connections up and its scripts loaded after
/// the first); otherwise a fresh one each time.
/// Per trial, the handover and the round trip measured just before it (a warm client's
/// acquisition of a free key), so the ratio is read at one moment of the box's load.
async fn handover(cluster: &LocalCluster, trials: usize, warm: bool) -> Vec<(Duration, Duration)> {
    let mut out = Vec::new();
    let kept = fresh(cluster);
    let probe = fresh(cluster);
    for i in 0..5 {
        let _ = probe
            .acquire(&format!("probe-warm{i}"), Duration::from_secs(5))
            .await;
    }
    for i in 0..trials {
        let key = format!("handover{i}-{warm}");
        let holder = fresh(cluster);
        let lock = holder
            .acquire(&key, Duration::from_secs(10))
            .await
            .expect("the holder acquires");
        let waiter = if warm { kept.clone() } else { fresh(cluster) };
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let waiting = tokio::spawn({
            let key = key.clone();
            async move {
                let _ = started_tx.send(());
                let won = waiter
                    .acquire_timeout(&key, Duration::from_secs(10), Duration::from_secs(20))
                    .await;
                (Instant::now(), won)
            }
        });
        let _ = started_rx.await;
        // Let the waiter connect, be refused and settle into waiting.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start = Instant::now();
        let probed = probe
            .acquire(&format!("probe{i}-{warm}"), Duration::from_secs(5))
            .await
            .expect("a free key is acquired");
        let round_trip = start.elapsed();
        probed.forget();
        let released = Instant::now();
        lock.release().await.expect("released");
        let (won_at, won) = waiting.await.expect("the waiter task");
        won.expect("the waiter takes the lock")
            .release()
            .await
            .expect("released");
        out.push((won_at.saturating_duration_since(released), round_trip));
    }
    out
}

/// p50 and p90 of the handovers, and of each handover in round trips of its own trial.
fn handover_summary(trials: Vec<(Duration, Duration)>) -> (Duration, Duration, f64, f64) {
    let (h50, h90, _) = summary(trials.iter().map(|t| t.0).collect());
    let mut ratios: Vec<f64> = trials
        .iter()
        .map(|(h, r)| us(*h) / us(*r).max(1.0))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |p: f64| ratios[((ratios.len() - 1) as f64 * p).round() as usize];
    (h50, h90, at(0.5), at(0.9))
}

async fn crashed_holder(cluster: &LocalCluster, trials: usize) -> Vec<Duration> {
    let urls = cluster.urls();
    let mut out = Vec::new();
    for i in 0..trials {
        let key = format!("crashed{i}");
        let holder = fresh(cluster);
        let lock = holder
            .acquire(&key, Duration::from_secs(1))
            .await
            .expect("the holder acquires");
        // A won round's late calls reach the last nodes shortly after it returns.
        tokio::time::sleep(Duration::from_millis(100)).await;
        lock.forget();
        let waiter = fresh(cluster);
        let waiting = tokio::spawn({
            let key = key.clone();
            async move {
                let won = waiter
                    .acquire_timeout(&key, Duration::from_secs(10), Duration::from_secs(20))
                    .await;
                (Instant::now(), won)
            }
        });
        let lock_key = format!("quorumlock:{{{key}}}");
        let read_at = Instant::now();
        let expiry = urls
            .iter()
            .filter_map(|u| {
                redis::cmd("PTTL")
                    .arg(&lock_key)
                    .query::<i64>(&mut conn(u))
                    .ok()
            })
            .max()
            .unwrap_or(0)
            .max(0) as u64;
        let expires_at = read_at + Duration::from_millis(expiry);
        let (won_at, won) = waiting.await.expect("the waiter task");
        won.expect("the waiter takes the lock")
            .release()
            .await
            .expect("released");
        out.push(won_at.saturating_duration_since(expires_at));
    }
    out
}

/// `SET`s on the busiest node per second of waiting, one fresh waiting client.
async fn waiting_rounds(cluster: &LocalCluster) -> f64 {
    let urls = cluster.urls();
    let holder = fresh(cluster);
    let lock = holder
        .acquire("held", Duration::from_secs(2))
        .await
        .expect("the holder acquires");
    lock.keep_alive();
    let before = sets(&urls);
    let wait = Duration::from_secs(3);
    let waiter = fresh(cluster);
    let refused = waiter
        .acquire_timeout("held", Duration::from_secs(2), wait)
        .await;
    assert!(refused.is_err(), "the lock is held throughout");
    // The holder's extensions are script calls (`PEXPIRE`), not `SET`s.
    let rounds = busiest(&before, &sets(&urls));
    lock.release().await.expect("released");
    rounds as f64 / wait.as_secs_f64()
}

/// `SET`s on the busiest node per acquisition, four fresh clients taking one key in turn.
async fn contention(cluster: &LocalCluster, acquisitions: usize) -> f64 {
    let urls = cluster.urls();
    let before = sets(&urls);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let locks = fresh(cluster);
            let done = std::sync::Arc::clone(&done);
            tokio::spawn(async move {
                use std::sync::atomic::Ordering;
                while done.load(Ordering::SeqCst) < acquisitions {
                    let Ok(lock) = locks
                        .acquire_timeout(
                            "contended",
                            Duration::from_secs(5),
                            Duration::from_secs(20),
                        )
                        .await
                    else {
                        continue;
                    };
                    done.fetch_add(1, Ordering::SeqCst);
                    let _ = lock.release().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("contender");
    }
    let made = done.load(std::sync::atomic::Ordering::SeqCst);
    busiest(&before, &sets(&urls)) as f64 / made as f64
}

fn main() {
    // `cargo bench` passes `--bench`; this program takes no arguments of its own.
    let trials: usize = std::env::var("WAITING_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    // `WAITING_RUNTIME=current_thread` for tokio's current-thread runtime.
    let current = std::env::var("WAITING_RUNTIME").is_ok_and(|v| v == "current_thread");
    let rt = if current {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()
    .expect("tokio runtime");
    let cluster = std::sync::Arc::new(LocalCluster::start(NODES).unwrap_or_else(|e| panic!("{e}")));
    // Everything runs in a task, as a user's code does (not in `block_on`'s own thread).
    let task = rt.spawn(async move {
        let cluster = &*cluster;
        let (rt50, rt90, _) = summary(round_trip(cluster, trials * 5).await);
        let (h50, h90, hr50, hr90) = handover_summary(handover(cluster, trials, false).await);
        let (w50, w90, wr50, wr90) = handover_summary(handover(cluster, trials, true).await);
        let (c50, c90, cmax) = summary(crashed_holder(cluster, trials).await);
        let per_second = waiting_rounds(cluster).await;
        let per_acquisition = contention(cluster, 200).await;
        println!("| figure | p50 | p90 | max | target |");
        println!("| --- | ---: | ---: | ---: | --- |");
        println!(
            "| round trip (uncontended acquire, µs) | {:.0} | {:.0} | | the unit below |",
            us(rt50),
            us(rt90)
        );
        println!(
            "| handover, release start → a fresh waiting client holds (µs; in round trips of its trial) | {:.0} ({hr50:.1} rt) | {:.0} ({hr90:.1} rt) | | ≤ 2 rt |",
            us(h50),
            us(h90),
        );
        println!(
            "| the same, one warm waiting client for every trial | {:.0} ({wr50:.1} rt) | {:.0} ({wr90:.1} rt) | | ≤ 2 rt |",
            us(w50),
            us(w90),
        );
        println!(
            "| crashed holder, last node's expiry → waiter holds (ms) | {:.1} | {:.1} | {:.1} | p50 ≤ 50 ms |",
            us(c50) / 1e3,
            us(c90) / 1e3,
            us(cmax) / 1e3
        );
        println!(
            "| rounds per second of one waiting fresh client, keep-alive holder (busiest node) | {per_second:.1} | | | ≤ 4 |"
        );
        println!(
            "| rounds per acquisition, 4 clients on one key (busiest node) | {per_acquisition:.2} | | | ≤ 4 (3 waiters + the winner) |"
        );
        println!(
            "({trials} trials per row; round trip over {} acquisitions; tokio {} runtime)",
            trials * 5,
            if current { "current-thread" } else { "multi-thread" }
        );
    });
    rt.block_on(task).expect("the benchmark task");
}
