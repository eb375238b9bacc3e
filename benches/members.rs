//! What each kind of quorum member costs (issue 15): acquire+release and extend on a Redlock of
//! one member of each kind (a standalone master, a Redis Cluster, a Sentinel-managed primary),
//! then on three members where one or all are Clusters or one is a Sentinel member. The
//! standalone figures in the same group are the baseline: report ratios to them.
//!
//! `cargo bench --features testkit --bench members`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use quorumlock::Redlock;
use quorumlock::testkit::{LocalCluster, RedisClusterMember, SentinelGroup};
use tokio::runtime::Runtime;

const TTL: Duration = Duration::from_secs(10);

fn next_key() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("bench:{}", N.fetch_add(1, Ordering::Relaxed))
}

fn client(rt: &Runtime, urls: Vec<String>) -> Redlock {
    // A generous node timeout: the box is shared, and a timeout would end the run, not slow it.
    let locks = Redlock::builder(urls)
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("valid config");
    rt.block_on(async {
        for _ in 0..20 {
            let lock = locks.try_acquire(&next_key(), TTL).await.expect("warm-up");
            lock.release().await.expect("warm-up release");
        }
    });
    locks
}

fn measure(c: &mut Criterion, group: &str, targets: &[(&str, Redlock)], rt: &Runtime) {
    let mut g = c.benchmark_group(group);
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    for (name, locks) in targets {
        g.bench_function(format!("{name}/acquire+release"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let lock = locks.try_acquire(&next_key(), TTL).await.expect("acquire");
                        lock.release().await.expect("release");
                    }
                    start.elapsed()
                })
            })
        });
        let held = rt
            .block_on(locks.try_acquire(&next_key(), Duration::from_secs(600)))
            .expect("acquire for extend");
        g.bench_function(format!("{name}/extend"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        held.extend(Duration::from_secs(600)).await.expect("extend");
                    }
                    start.elapsed()
                })
            })
        });
        rt.block_on(held.release()).expect("release");
    }
    g.finish();
}

fn members(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let standalone = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let clusters: Vec<RedisClusterMember> = (0..3)
        .map(|_| RedisClusterMember::start().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let sentinel = SentinelGroup::start().unwrap_or_else(|e| panic!("{e}"));
    let s = standalone.urls();

    let one = [
        ("standalone", client(&rt, vec![s[0].clone()])),
        ("cluster", client(&rt, vec![clusters[0].url()])),
        ("sentinel", client(&rt, vec![sentinel.url()])),
    ];
    measure(c, "one-member", &one, &rt);

    let three = [
        ("3-standalone", client(&rt, s.clone())),
        (
            "2-standalone+cluster",
            client(&rt, vec![s[0].clone(), s[1].clone(), clusters[0].url()]),
        ),
        (
            "2-standalone+sentinel",
            client(&rt, vec![s[0].clone(), s[1].clone(), sentinel.url()]),
        ),
        (
            "3-cluster",
            client(&rt, clusters.iter().map(RedisClusterMember::url).collect()),
        ),
    ];
    measure(c, "three-members", &three, &rt);
}

criterion_group!(benches, members);
criterion_main!(benches);
