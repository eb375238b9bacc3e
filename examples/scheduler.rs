//! A job scheduled on every instance, run by exactly one instance per tick.
//!
//! As one instance among several (run it in two or three terminals against the same nodes):
//!
//! ```text
//! REDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example scheduler --features testkit
//! ```
//!
//! The crate runs the loop (`RunOnce::run_every` on a `Schedule`); SIGTERM or Ctrl-C finishes
//! the running job and leaves. Without `REDLOCK_NODES` it starts its own local 5-node cluster,
//! runs three instances in this process for a few ticks, checks that every tick from the first
//! to the last ran exactly once (a tick that never ran is an error too), and exits.
//!
//! Environment: `SCHEDULER_PERIOD_MS` (tick period, default 2000), `SCHEDULER_TICKS` (ticks in
//! the self-contained demo, default 5), `SCHEDULER_ID` (instance id).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use quorumlock::{CancellationToken, Redlock, RunOnce, Schedule};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let period = Duration::from_millis(env_or("SCHEDULER_PERIOD_MS", 2000));
    match std::env::var("REDLOCK_NODES") {
        Ok(nodes) => {
            let id = std::env::var("SCHEDULER_ID")
                .unwrap_or_else(|_| format!("pid-{}", std::process::id()));
            let urls: Vec<String> = nodes.split(',').map(str::to_owned).collect();
            instance(&urls, id, period, on_signal(), Arc::default()).await
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

/// Who ran each tick, shared by the in-process instances of the demo.
type Shared = Arc<Mutex<BTreeMap<u64, Vec<String>>>>;

/// One scheduler instance: the crate runs the loop, one tick per period, until `stop` (SIGTERM
/// or Ctrl-C when run alone; the end of the demo otherwise). A run in progress is finished
/// first.
async fn instance(
    urls: &[String],
    id: String,
    period: Duration,
    stop: CancellationToken,
    ledger: Shared,
) -> Result<(), Failure> {
    let locks = Redlock::builder(urls).build()?;
    let job = RunOnce::builder(locks, "refresh-report")
        .marker_ttl(period * 10)
        .instance(&id)
        .build()?;
    let schedule = Schedule::every(period)?;
    job.run_every(schedule, stop, |ctx| {
        let (ledger, id) = (Arc::clone(&ledger), id.clone());
        async move {
            let tick: u64 = ctx.tick().parse().unwrap_or_default();
            ledger
                .lock()
                .unwrap()
                .entry(tick)
                .or_default()
                .push(id.clone());
            println!("[{id}] tick {tick}: running (token {})", ctx.token());
            // The work: half a second, stamped with the run's fencing token.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await?;
    println!("[{id}] stopped");
    Ok(())
}

/// A token cancelled on SIGTERM or Ctrl-C.
fn on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    let cancel = stop.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        cancel.cancel();
    });
    stop
}

async fn demo(period: Duration) -> Result<(), Failure> {
    let ticks = env_or("SCHEDULER_TICKS", 5);
    let cluster = LocalCluster::start(5)?;
    let urls = cluster.urls();
    println!("started 5 local redis-server nodes; 3 instances, a tick every {period:?}\n");
    let ledger = Shared::default();
    let stop = CancellationToken::new();
    let runs = (0..3).map(|i| {
        let (urls, ledger, stop) = (urls.clone(), Arc::clone(&ledger), stop.clone());
        tokio::spawn(
            async move { instance(&urls, format!("inst-{i}"), period, stop, ledger).await },
        )
    });
    let runs: Vec<_> = runs.collect();
    // Until `ticks` ticks have run, then stop every instance (each finishes its run first).
    let deadline = tokio::time::Instant::now() + period * u32::try_from(ticks + 3)?;
    // `ticks` ticks in a row, from the first that ran.
    let in_a_row = |runs: &BTreeMap<u64, Vec<String>>| {
        runs.keys()
            .next()
            .is_some_and(|&first| (first..first + ticks).all(|t| runs.contains_key(&t)))
    };
    while !in_a_row(&ledger.lock().unwrap()) {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("fewer than {ticks} ticks ran in time").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    for r in futures::future::join_all(runs).await {
        r??;
    }
    println!();
    let ledger = ledger.lock().unwrap();
    let (Some(&first), Some(&last)) = (ledger.keys().next(), ledger.keys().last()) else {
        return Err("no tick ran".into());
    };
    // Every tick of the range, so that a tick nobody ran (or nobody tried) shows too.
    let mut wrong = 0;
    for tick in first..=last {
        match ledger.get(&tick).map(Vec::as_slice) {
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
