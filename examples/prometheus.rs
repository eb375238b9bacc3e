//! Serve quorumlock's metrics on `/metrics` for Prometheus, with `metrics-exporter-prometheus`.
//!
//! Uses the masters in `REDLOCK_NODES` (comma-separated URLs) if set; otherwise starts a
//! throwaway local cluster of three `redis-server` processes. Serves on `METRICS_ADDR`
//! (default `127.0.0.1:9898`) while a worker takes and releases a lock, for `SECONDS` seconds
//! (default 60):
//!
//!     cargo run --features testkit,metrics --example prometheus
//!     curl -s localhost:9898/metrics | grep quorumlock_
//!
//! `tests/observability.rs` runs [`install`] and scrapes what it serves.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, PrometheusBuilder};
use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;

/// Installs the Prometheus recorder process-wide and serves `/metrics` on `addr` (from a task
/// of the current tokio runtime). Install it before building a `Redlock`: the client describes
/// its metrics (`# HELP`, units) to the recorder installed when it is built.
pub fn install(addr: SocketAddr) -> Result<(), BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        // Buckets for the time histograms, in seconds: Prometheus histograms rather than
        // summaries, so that alerts can aggregate them across processes.
        .set_buckets(&[
            0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0,
        ])?
        .install()
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9898".to_owned())
        .parse()?;
    let seconds: u64 = std::env::var("SECONDS").map_or(Ok(60), |s| s.parse())?;
    install(addr)?;
    let (_cluster, urls) = match std::env::var("REDLOCK_NODES") {
        Ok(nodes) => (None, nodes.split(',').map(str::to_owned).collect()),
        Err(_) => {
            let cluster = LocalCluster::start(3)?;
            let urls = cluster.urls();
            (Some(cluster), urls)
        }
    };
    let locks = Redlock::builder(&urls).build()?;
    println!("serving http://{addr}/metrics for {seconds} s");
    let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while tokio::time::Instant::now() < until {
        let lock = locks.acquire("report", Duration::from_secs(5)).await?;
        tokio::time::sleep(Duration::from_millis(500)).await; // the work
        lock.release().await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
