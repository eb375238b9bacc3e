//! Quickstart: contention, a dead node, a crashed holder and the handover, with fencing tokens.
//!
//! Uses the masters in `REDLOCK_NODES` (comma-separated URLs) if set; otherwise starts a
//! throwaway local cluster of five `redis-server` processes and removes it at the end.
//!
//!     cargo run --features testkit --example quickstart

use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use quorumlock::{FenceGate, Redlock};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut cluster, urls) = match std::env::var("REDLOCK_NODES") {
        Ok(nodes) => (None, nodes.split(',').map(str::to_owned).collect()),
        Err(_) => {
            let cluster = LocalCluster::start(5)?;
            let urls = cluster.urls();
            println!("started 5 local redis-server masters: {}", urls.join(" "));
            (Some(cluster), urls)
        }
    };
    let locks = Redlock::builder(&urls).build()?;
    let gate = FenceGate::new(); // the protected resource's check
    let ttl = Duration::from_secs(2);
    println!("quorum: {} of {}\n", locks.quorum(), locks.node_count());

    let a = locks.acquire("payout-batch-42", ttl).await?;
    println!(
        "worker A holds the lock, token {}, valid for {:?}",
        a.token(),
        a.validity()
    );
    gate.admit(a.token())?;

    match locks.try_acquire("payout-batch-42", ttl).await {
        Err(e) if e.is_held() => println!("worker B skips: {e}"),
        other => println!("worker B: unexpected {other:?}"),
    }
    a.release().await?;
    println!("worker A released\n");

    if let Some(cluster) = cluster.as_mut() {
        cluster.kill(0)?;
        println!("killed node {} (SIGKILL)", urls[0]);
    }
    let b = locks.acquire("payout-batch-42", ttl).await?;
    println!(
        "worker B holds the lock with 4 of 5 nodes, token {}",
        b.token()
    );
    gate.admit(b.token())?;

    // B crashes: no release, no extension. The lock is free again when its ttl ends.
    let crashed_token = b.token();
    b.forget();
    println!("worker B crashed while holding the lock (ttl {ttl:?})");
    let start = Instant::now();
    let c = locks
        .acquire_timeout("payout-batch-42", ttl, ttl * 3)
        .await?;
    println!(
        "worker C took over after {:?}, token {} (> {crashed_token})",
        start.elapsed(),
        c.token()
    );
    gate.admit(c.token())?;
    match gate.admit(crashed_token) {
        Err(stale) => println!("a late write from B is rejected: {stale}"),
        Ok(()) => println!("BUG: a stale write was accepted"),
    }
    c.release().await?;
    println!("\ndone");
    Ok(())
}
