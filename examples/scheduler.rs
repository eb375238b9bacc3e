//! A job scheduled on every instance, run by exactly one instance per tick.
//!
//! As one instance among several (run it in two or three terminals against the same nodes):
//!
//! ```text
//! REDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example scheduler --features testkit
//! ```
//!
//! Without `REDLOCK_NODES` it starts its own local 5-node cluster, runs three instances in this
//! process for a few ticks, checks that every tick from the first to the last ran exactly once
//! (a tick that never ran is an error too), and exits.
//!
//! Environment: `SCHEDULER_PERIOD_MS` (tick period, default 2000), `SCHEDULER_TICKS` (ticks in
//! the self-contained demo, default 5), `SCHEDULER_ID` (instance id).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use quorumlock::testkit::LocalCluster;
use quorumlock::{Outcome, Redlock, RunOnce, tick_of};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let period = Duration::from_millis(env_or("SCHEDULER_PERIOD_MS", 2000));
    match std::env::var("REDLOCK_NODES") {
        Ok(nodes) => {
            let id = std::env::var("SCHEDULER_ID")
                .unwrap_or_else(|_| format!("pid-{}", std::process::id()));
            let urls: Vec<String> = nodes.split(',').map(str::to_owned).collect();
            instance(&urls, id, period, u64::MAX, Arc::default()).await
        }
        Err(_) => demo(period).await,
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the in-process instances of the demo did, shared between them.
#[derive(Debug, Default)]
struct Ledger {
    /// Who ran each tick.
    runs: BTreeMap<u64, Vec<String>>,
    /// Every tick some instance tried to run.
    tried: BTreeSet<u64>,
}

type Shared = Arc<Mutex<Ledger>>;

/// One scheduler instance: at every period boundary, try to run the job for that tick.
async fn instance(
    urls: &[String],
    id: String,
    period: Duration,
    ticks: u64,
    ledger: Shared,
) -> Result<(), Failure> {
    let locks = Redlock::builder(urls).build()?;
    let job = RunOnce::builder(locks, "refresh-report")
        .ttl(Duration::from_secs(10))
        .marker_ttl(period * 10)
        .instance(&id)
        .build()?;
    for _ in 0..ticks {
        // Sleep to the next boundary, plus a little per-instance skew as between real hosts.
        let now = SystemTime::now();
        let next = (tick_of(now, period) + 1) * u64::try_from(period.as_millis())?;
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(next);
        let skew = Duration::from_millis(rand::random_range(0..150));
        tokio::time::sleep(at.duration_since(now).unwrap_or_default() + skew).await;

        let tick = tick_of(at, period);
        ledger.lock().unwrap().tried.insert(tick);
        let ledger = Arc::clone(&ledger);
        let worker = id.clone();
        let outcome = job
            .run(tick, |ctx| async move {
                ledger
                    .lock()
                    .unwrap()
                    .runs
                    .entry(tick)
                    .or_default()
                    .push(worker);
                // The work: half a second, stamped with the run's fencing token.
                tokio::time::sleep(Duration::from_millis(500)).await;
                ctx.token()
            })
            .await?;
        match outcome {
            Outcome::Ran { token, .. } => println!("[{id}] tick {tick}: ran (token {token})"),
            Outcome::Skipped { reason, .. } => println!("[{id}] tick {tick}: skipped, {reason}"),
            Outcome::Lost { reason, .. } => {
                println!("[{id}] tick {tick}: lost the lock, {reason}");
            }
            _ => {}
        }
    }
    Ok(())
}

async fn demo(period: Duration) -> Result<(), Failure> {
    let ticks = env_or("SCHEDULER_TICKS", 5);
    let cluster = LocalCluster::start(5)?;
    let urls = cluster.urls();
    println!("started 5 local redis-server nodes; 3 instances, a tick every {period:?}\n");
    let ledger = Shared::default();
    let runs = (0..3).map(|i| {
        let (urls, ledger) = (urls.clone(), Arc::clone(&ledger));
        tokio::spawn(
            async move { instance(&urls, format!("inst-{i}"), period, ticks, ledger).await },
        )
    });
    for r in futures::future::join_all(runs).await {
        r??;
    }
    println!();
    let ledger = ledger.lock().unwrap();
    let (Some(&first), Some(&last)) = (ledger.tried.first(), ledger.tried.last()) else {
        return Err("no tick was tried".into());
    };
    if last - first + 1 < ticks {
        return Err(format!("only ticks {first}..={last} were tried, {ticks} expected").into());
    }
    // Every tick of the range, so that a tick nobody ran (or nobody tried) shows too.
    let mut wrong = 0;
    for tick in first..=last {
        match ledger.runs.get(&tick).map(Vec::as_slice) {
            Some([who]) => println!("tick {tick}: run by {who}"),
            Some(who) => {
                println!(
                    "tick {tick}: run {} times, by {}",
                    who.len(),
                    who.join(", ")
                );
                wrong += 1;
            }
            None => {
                println!("tick {tick}: never ran");
                wrong += 1;
            }
        }
    }
    if wrong > 0 {
        return Err(format!("{wrong} of ticks {first}..={last} did not run exactly once").into());
    }
    println!("every tick from {first} to {last} ran exactly once");
    Ok(())
}
