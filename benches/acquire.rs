//! Acquire, acquire+release and extend latency against real local `redis-server` nodes: on 1, 3
//! and 5 healthy nodes, and on 5 nodes with one paused (SIGSTOP), two paused and one killed.
//! The floor (a hand-written round on the `redis` crate, `benches/support/floor.rs`) runs in the
//! same groups so every figure has its baseline next to it; `floor/acquire-fenced` is that round
//! with quorumlock's acquire script (SET NX PX + INCR of the fencing counter), to separate what
//! fencing costs in Redis from what the library adds.
//!
//! `cargo bench --features testkit --bench acquire`. The one-table comparison with the other
//! Redlock crates is `tools/compare` (see `docs/benchmarks.md`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;
use tokio::runtime::Runtime;

#[path = "support/floor.rs"]
mod floor;
use floor::Floor;

const TTL: Duration = Duration::from_secs(10);
const TTL_MS: u64 = 10_000;

/// A distinct key per operation, so no operation contends with an earlier one.
fn next_key() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("bench:{}", N.fetch_add(1, Ordering::Relaxed))
}

struct Target {
    locks: Redlock,
    floor: Floor,
}

impl Target {
    fn new(rt: &Runtime, cluster: &LocalCluster) -> Self {
        let urls = cluster.urls();
        let locks = Redlock::builder(&urls).build().expect("valid config");
        let floor = rt.block_on(Floor::connect(&urls)).expect("floor connects");
        // Connect ours (lazily established) before measuring.
        rt.block_on(async {
            for _ in 0..10 {
                let lock = locks.try_acquire(&next_key(), TTL).await.expect("warm-up");
                lock.release().await.expect("warm-up release");
            }
        });
        Target { locks, floor }
    }
}

/// Benchmarks `op` (run sequentially, `iters` times per sample) as `name` in the group.
fn bench<F, Fut>(g: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, mut op: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    op().await;
                }
                start.elapsed()
            })
        })
    });
}

fn ops(g: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, t: &Target) {
    let acquire = || async {
        let key = next_key();
        t.locks.try_acquire(&key, TTL).await.expect("acquire")
    };
    bench(g, rt, "ours/acquire", || async { acquire().await.forget() });
    bench(g, rt, "floor/acquire", || async {
        let (key, value) = (next_key(), Floor::new_value());
        assert!(t.floor.acquire(&key, &value, TTL_MS).await);
    });
    bench(g, rt, "floor/acquire-fenced", || async {
        let (lock_key, fence_key) = floor::fenced_keys(&next_key());
        let value = Floor::new_value();
        let fenced = t
            .floor
            .acquire_fenced(&lock_key, &fence_key, &value, TTL_MS);
        assert!(fenced.await);
    });
    bench(g, rt, "ours/acquire+release", || async {
        acquire().await.release().await.expect("release");
    });
    bench(g, rt, "floor/acquire+release", || async {
        let (key, value) = (next_key(), Floor::new_value());
        assert!(t.floor.acquire(&key, &value, TTL_MS).await);
        assert!(t.floor.release(&key, &value).await);
    });
    let held = rt
        .block_on(t.locks.try_acquire(&next_key(), Duration::from_secs(600)))
        .expect("acquire for extend");
    bench(g, rt, "ours/extend", || async {
        held.extend(Duration::from_secs(600)).await.expect("extend");
    });
    rt.block_on(held.release()).expect("release");
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn healthy(c: &mut Criterion) {
    let rt = runtime();
    for n in [1, 3, 5] {
        let cluster = LocalCluster::start(n).unwrap_or_else(|e| panic!("{e}"));
        let target = Target::new(&rt, &cluster);
        let mut g = c.benchmark_group(format!("healthy-{n}-nodes"));
        ops(&mut g, &rt, &target);
        g.finish();
    }
}

/// A named change to the cluster, applied before its group.
type Fault = (&'static str, fn(&mut LocalCluster));

fn faults(c: &mut Criterion) {
    let rt = runtime();
    let mut cluster = LocalCluster::start(5).unwrap_or_else(|e| panic!("{e}"));
    let target = Target::new(&rt, &cluster);
    let steps: [Fault; 3] = [
        ("5-nodes-1-paused", |c| c.pause(0).expect("pause")),
        ("5-nodes-2-paused", |c| c.pause(1).expect("pause")),
        ("5-nodes-1-killed", |c| {
            c.resume(0).expect("resume");
            c.resume(1).expect("resume");
            c.kill(0).expect("kill");
        }),
    ];
    for (name, apply) in steps {
        apply(&mut cluster);
        let mut g = c.benchmark_group(name);
        ops(&mut g, &rt, &target);
        g.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = healthy, faults
}
criterion_main!(benches);
