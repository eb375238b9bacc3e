//! Where a sequential acquire+release's time goes, split into the acquire and the release, and
//! what the first operation after an idle spell pays: the floor and quorumlock (fencing on and
//! off) take turns in slices of `--ops` operations, with `--gap-ms` of idleness before each
//! slice (the comparison tool's slices leave each client idle while the others run).
//!
//! ```sh
//! cargo run --release --manifest-path tools/compare/Cargo.toml --bin tail -- \
//!     [--ops 300] [--slices 10] [--gap-ms 0] [--paused] [--runtime mt|ct]
//! ```
//!
//! `--paused` SIGSTOPs node 0 after the warm-up (the client is connected to it: its calls
//! hang). Prints one line per implementation: p50 and p99 of the acquire, the release and both,
//! the median acquire and release of each slice's first operation, and how many operations
//! took over 1 ms (in runs of consecutive slow ones, which the box's other work causes for
//! every implementation alike, or alone). `RUST_LOG=quorumlock=trace` prints the library's
//! events, with a `SLOW` line after each operation over 800 µs.

use std::time::{Duration, Instant};

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;

#[path = "../../../../benches/support/floor.rs"]
#[allow(unused_imports, dead_code)]
mod floor;
use floor::Floor;

const TTL: Duration = Duration::from_secs(10);

enum Client {
    Ours(Redlock),
    Floor(Floor),
}

/// One acquire+release on `key`; returns the instant the acquire ended.
async fn once(client: &Client, key: &str) -> Instant {
    match client {
        Client::Ours(locks) => {
            let lock = locks.try_acquire(key, TTL).await.expect("acquire");
            let acquired = Instant::now();
            lock.release().await.expect("release");
            acquired
        }
        Client::Floor(f) => {
            let value = Floor::new_value();
            assert!(
                f.acquire(key, &value, TTL.as_millis() as u64).await,
                "acquire"
            );
            let acquired = Instant::now();
            assert!(f.release(key, &value).await, "release");
            acquired
        }
    }
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn us(d: Duration) -> String {
    format!("{} µs", d.as_micros())
}

fn main() {
    let (mut ops, mut slices, mut gap_ms, mut paused, mut ct) = (300, 10, 0, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = || args.next().and_then(|v| v.parse().ok()).expect("a number");
        match a.as_str() {
            "--ops" => ops = num(),
            "--slices" => slices = num(),
            "--gap-ms" => gap_ms = num() as u64,
            "--paused" => paused = true,
            "--runtime" => ct = args.next().as_deref() == Some("ct"),
            other => {
                panic!("unknown argument {other}; see the header of tools/compare/src/bin/tail.rs")
            }
        }
    }
    let log = std::env::var_os("RUST_LOG").is_some();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut cluster = LocalCluster::start(5).expect("five nodes");
    let urls = cluster.urls();
    let rt = if ct {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    }
    .expect("runtime");
    let ours = |fencing| {
        Client::Ours(
            Redlock::builder(&urls)
                .fencing(fencing)
                .build()
                .expect("config"),
        )
    };
    let floor = rt.block_on(Floor::connect(&urls)).expect("floor connects");
    let clients = [
        ("floor", Client::Floor(floor)),
        ("quorumlock", ours(true)),
        ("quorumlock-nofence", ours(false)),
    ];
    rt.block_on(async {
        for (name, c) in &clients {
            for i in 0..200 {
                once(c, &format!("{name}:warm-up:{i}")).await;
            }
        }
    });
    if paused {
        cluster.pause(0).expect("pause node 0");
    }
    // Per implementation: (acquire, release) of every operation, slice by slice.
    let mut taken: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); clients.len()];
    for slice in 0..slices {
        for (ci, (name, c)) in clients.iter().enumerate() {
            std::thread::sleep(Duration::from_millis(gap_ms));
            rt.block_on(async {
                for i in 0..ops {
                    let start = Instant::now();
                    let acquired = once(c, &format!("{name}:{slice}:{i}")).await;
                    let (acq, rel) = (acquired - start, acquired.elapsed());
                    if log && acq + rel > Duration::from_micros(800) {
                        eprintln!(
                            "SLOW {name} slice {slice} op {i}: acquire {acq:?} release {rel:?}"
                        );
                    }
                    taken[ci].push((acq, rel));
                }
            });
        }
    }
    if paused {
        cluster.resume(0).expect("resume node 0");
    }
    println!(
        "{} runtime, {} nodes, {slices} slices of {ops} after {gap_ms} ms idle",
        if ct { "current-thread" } else { "multi-thread" },
        if paused {
            "node 0 of 5 paused"
        } else {
            "5 healthy"
        }
    );
    for (ci, (name, _)) in clients.iter().enumerate() {
        let t = &taken[ci];
        let acq: Vec<_> = t.iter().map(|x| x.0).collect();
        let rel: Vec<_> = t.iter().map(|x| x.1).collect();
        let both: Vec<_> = t.iter().map(|x| x.0 + x.1).collect();
        let first: Vec<_> = t.iter().step_by(ops).copied().collect();
        let slow = |j: usize, at: u64| both.get(j).is_some_and(|d| *d > Duration::from_micros(at));
        let over = (0..both.len()).filter(|&j| slow(j, 1000)).count();
        let alone = (0..both.len())
            .filter(|&j| slow(j, 1000) && !slow(j.wrapping_sub(1), 600) && !slow(j + 1, 600))
            .count();
        println!(
            "{name:19} acquire p50/p99 {} / {}  release {} / {}  both {} / {}  first of a slice: acquire {}, release {}  over 1 ms: {over} ({alone} alone)",
            us(pct(&acq, 0.5)),
            us(pct(&acq, 0.99)),
            us(pct(&rel, 0.5)),
            us(pct(&rel, 0.99)),
            us(pct(&both, 0.5)),
            us(pct(&both, 0.99)),
            us(pct(&first.iter().map(|x| x.0).collect::<Vec<_>>(), 0.5)),
            us(pct(&first.iter().map(|x| x.1).collect::<Vec<_>>(), 0.5)),
        );
    }
}
