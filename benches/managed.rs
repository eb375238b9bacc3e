//! What the `EVAL` fallback costs (issue 15, item 5): acquire latency on three masters that
//! refuse `EVALSHA` (every script sent as `EVAL` with its body) against three that take
//! `EVALSHA`, in the same run. Report the ratio, never the lone figure.
//!
//! `cargo bench --features testkit --bench managed`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use quorumlock::Redlock;
use quorumlock::testkit::{LocalCluster, ServerOptions};
use tokio::runtime::Runtime;

const TTL: Duration = Duration::from_secs(10);

fn next_key() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("bench:{}", N.fetch_add(1, Ordering::Relaxed))
}

fn client(rt: &Runtime, cluster: &LocalCluster, by_eval: bool) -> Redlock {
    // A generous node timeout: the box is shared, and a timeout would end the run, not slow it.
    let locks = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("valid config");
    rt.block_on(async {
        for _ in 0..20 {
            let lock = locks.try_acquire(&next_key(), TTL).await.expect("warm-up");
            lock.release().await.expect("warm-up release");
        }
        let status = locks.status("warm-up").await.expect("status");
        assert!(
            status.nodes.iter().all(|n| n.scripts_by_eval == by_eval),
            "{status:?}"
        );
    });
    locks
}

fn eval_fallback(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let plain = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let restricted = LocalCluster::start_with(
        3,
        &ServerOptions::new().config_line("user default on nopass ~* &* +@all -evalsha"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let targets = [
        ("evalsha", client(&rt, &plain, false)),
        ("eval-fallback", client(&rt, &restricted, true)),
    ];
    let mut g = c.benchmark_group("managed");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    for (name, locks) in &targets {
        // Only the acquisitions are timed; each is released untimed.
        g.bench_function(format!("{name}/acquire"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        let lock = locks.try_acquire(&next_key(), TTL).await.expect("acquire");
                        spent += start.elapsed();
                        lock.release().await.expect("release");
                    }
                    spent
                })
            })
        });
    }
    g.finish();
    interleaved(&rt, &targets);
}

/// The same comparison with the two targets alternating in short blocks, so that a change in
/// the shared box's load falls on both: per-acquire latencies, p50 of each and their ratio.
fn interleaved(rt: &Runtime, targets: &[(&str, Redlock); 2]) {
    const BLOCKS: usize = 40;
    const PER_BLOCK: usize = 100;
    let mut samples: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    rt.block_on(async {
        for block in 0..BLOCKS {
            for i in [block % 2, 1 - block % 2] {
                for _ in 0..PER_BLOCK {
                    let start = Instant::now();
                    let lock = targets[i]
                        .1
                        .try_acquire(&next_key(), TTL)
                        .await
                        .expect("acquire");
                    samples[i].push(start.elapsed());
                    lock.release().await.expect("release");
                }
            }
        }
    });
    let p50 = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (sha, eval) = (p50(&mut samples[0]), p50(&mut samples[1]));
    println!(
        "managed/interleaved: acquire p50 {} {sha:?}, {} {eval:?}: ratio {:.2}",
        targets[0].0,
        targets[1].0,
        eval.as_secs_f64() / sha.as_secs_f64()
    );
}

criterion_group!(benches, eval_fallback);
criterion_main!(benches);
