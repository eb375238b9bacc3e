//! Two costs issue 15 still owed, each beside its baseline in the same run, on 3 local nodes:
//!
//! 1. **The counter layout** (item 1). A fenced acquire round (one `EVALSHA` per node, decided
//!    at a quorum, as `benches/support/floor.rs` does) with two scripts:
//!    - `per-name`: the layout before item 1, `SET NX PX` + `INCR` of the name's own counter
//!      (the floor's `acquire-fenced`; the baseline);
//!    - `slot`: the library's acquire script (read from the library: its form on nodes that do
//!      not pipeline, `docs/safety.md`), `SET NX PX` + `INCR` of the slot's counter.
//!
//!    Before criterion, each script's Redis-side cost (`usec_per_call` of `EVALSHA` in
//!    `INFO commandstats`, after `CONFIG RESETSTAT`, over the same number of calls) is printed.
//! 2. **A member given as the user's `redis::Client`** against the same member by URL:
//!    acquire+release through the library, both clients on the same nodes.
//!
//! `cargo bench --features testkit --bench layout`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Redlock, RedlockBuilder};
use redis::aio::MultiplexedConnection;
use redis::{Script, Value};
use tokio::runtime::Runtime;

const TTL: Duration = Duration::from_secs(10);
const TTL_MS: u64 = 10_000;
/// Calls per script and slice for the Redis-side figure.
const SERVER_CALLS: u64 = 1_000;
/// Slices per target, taken in alternation (target A, B, C, A, B, C, ...): a change in the
/// shared box's load then shows in every target's spread, not as a difference between them.
const SLICES: usize = 9;
/// Operations per slice in the alternating latency figure.
const PER_SLICE: u32 = 300;

const PER_NAME: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0";

fn next_key() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("bench:{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Redis Cluster's hash slot of a key (its hash tag's, when it has one).
fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(key) % 16384
}

/// A tag of at most three characters for every slot, as the library's key layout has.
fn slot_tag(key: &str) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let mut tags = vec![String::new(); 16384];
        let mut strings: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..3 {
            strings = strings
                .iter()
                .flat_map(|p| ALPHABET.iter().map(move |&c| [p.as_slice(), &[c]].concat()))
                .collect();
            for t in &strings {
                let s = usize::from(slot(t));
                if tags[s].is_empty() {
                    tags[s] = String::from_utf8(t.clone()).expect("ascii");
                }
            }
        }
        tags
    });
    &tags[usize::from(slot(key.as_bytes()))]
}

/// One fenced acquire script and the keys it is given for a name.
struct Variant {
    name: &'static str,
    sha: String,
    keys: fn(&str) -> Vec<String>,
}

fn variants() -> Vec<(Variant, &'static str)> {
    let v = |name, code: &'static str, keys| {
        (
            Variant {
                name,
                sha: Script::new(code).get_hash().to_owned(),
                keys,
            },
            code,
        )
    };
    vec![
        v("per-name", PER_NAME, |k| {
            vec![
                format!("quorumlock:{{{k}}}"),
                format!("quorumlock:{{{k}}}:fence"),
            ]
        }),
        v("slot", quorumlock::testkit::acquire_script_source(), |k| {
            vec![
                format!("quorumlock:{{{k}}}"),
                format!("quorumlock:fence:{{{}}}", slot_tag(k)),
            ]
        }),
    ]
}

/// One fenced acquire round: the script on every node at once, decided at a quorum of tokens.
async fn round(conns: &[MultiplexedConnection], variant: &Variant) -> bool {
    let key = next_key();
    let value = format!("{:032x}", rand::random::<u128>());
    let mut cmd = redis::cmd("EVALSHA");
    let keys = (variant.keys)(&key);
    cmd.arg(&variant.sha).arg(keys.len()).arg(&keys);
    cmd.arg(&value).arg(TTL_MS);
    let quorum = conns.len() / 2 + 1;
    let mut calls: FuturesUnordered<_> = conns
        .iter()
        .map(|c| {
            let mut c = c.clone();
            let cmd = &cmd;
            async move { cmd.query_async::<Value>(&mut c).await }
        })
        .collect();
    let mut yes = 0;
    while let Some(reply) = calls.next().await {
        if matches!(reply, Ok(Value::Int(n)) if n > 0) {
            yes += 1;
            if yes >= quorum {
                return true;
            }
        }
    }
    false
}

/// `usec_per_call` of `EVALSHA` summed over the nodes, after `calls` rounds of `variant`.
async fn server_cost(conns: &[MultiplexedConnection], variant: &Variant, calls: u64) -> f64 {
    for c in conns {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut c.clone())
            .await
            .expect("CONFIG RESETSTAT");
    }
    for _ in 0..calls {
        assert!(round(conns, variant).await, "{} round", variant.name);
    }
    let mut total = 0.0;
    for c in conns {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c.clone())
            .await
            .expect("INFO");
        let line = stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .expect("EVALSHA stats");
        let per_call = line
            .split(',')
            .find_map(|f| f.strip_prefix("usec_per_call="))
            .and_then(|v| v.parse::<f64>().ok())
            .expect("usec_per_call");
        total += per_call;
    }
    total / conns.len() as f64
}

fn layout(c: &mut Criterion) {
    let rt = runtime();
    let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let variants = variants();
    let conns: Vec<MultiplexedConnection> = rt.block_on(async {
        let mut conns = Vec::new();
        for url in cluster.urls() {
            let client = redis::Client::open(url).expect("url");
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&redis::AsyncConnectionConfig::new())
                .await
                .expect("connect");
            for (_, code) in &variants {
                let _: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(*code)
                    .query_async(&mut conn)
                    .await
                    .expect("SCRIPT LOAD");
            }
            conns.push(conn);
        }
        conns
    });
    // Redis' side: each script's execution time per call, slices in alternation.
    rt.block_on(async {
        let mut costs = vec![Vec::new(); variants.len()];
        for _ in 0..SLICES {
            for (i, (v, _)) in variants.iter().enumerate() {
                costs[i].push(server_cost(&conns, v, SERVER_CALLS).await);
            }
        }
        report("redis-side EVALSHA usec_per_call", &names(&variants), costs);
    });
    // The round's latency, slices in alternation.
    rt.block_on(async {
        let mut times = vec![Vec::new(); variants.len()];
        for _ in 0..SLICES {
            for (i, (v, _)) in variants.iter().enumerate() {
                let start = Instant::now();
                for _ in 0..PER_SLICE {
                    assert!(round(&conns, v).await);
                }
                times[i].push(start.elapsed().as_secs_f64() * 1e6 / f64::from(PER_SLICE));
            }
        }
        report("fenced acquire round, us", &names(&variants), times);
    });
    let mut g = c.benchmark_group("fenced-acquire-3-nodes");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    for (v, _) in &variants {
        g.bench_function(v.name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        assert!(round(&conns, v).await);
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
}

fn member(c: &mut Criterion) {
    let rt = runtime();
    let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let urls = cluster.urls();
    let tuned = |b: RedlockBuilder| b.node_timeout(Duration::from_millis(500));
    let by_url = tuned(Redlock::builder(&urls))
        .build()
        .expect("valid config");
    let by_client = tuned(urls.iter().fold(RedlockBuilder::default(), |b, u| {
        b.client(redis::Client::open(u.as_str()).expect("url"))
    }))
    .build()
    .expect("valid config");
    let targets = [("url", by_url), ("client", by_client)];
    rt.block_on(async {
        for (_, locks) in &targets {
            for _ in 0..20 {
                let lock = locks.try_acquire(&next_key(), TTL).await.expect("warm-up");
                lock.release().await.expect("warm-up release");
            }
        }
    });
    rt.block_on(async {
        let mut times = vec![Vec::new(); targets.len()];
        for _ in 0..SLICES {
            for (i, (_, locks)) in targets.iter().enumerate() {
                let start = Instant::now();
                for _ in 0..PER_SLICE {
                    let lock = locks.try_acquire(&next_key(), TTL).await.expect("acquire");
                    lock.release().await.expect("release");
                }
                times[i].push(start.elapsed().as_secs_f64() * 1e6 / f64::from(PER_SLICE));
            }
        }
        let names: Vec<&str> = targets.iter().map(|(n, _)| *n).collect();
        report("acquire+release, us", &names, times);
    });
    let mut g = c.benchmark_group("member-3-nodes");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    // Twice each, alternating, so a change in the box's load shows as a difference between
    // the two runs of one target rather than between targets.
    for round in ["a", "b"] {
        for (name, locks) in &targets {
            g.bench_function(format!("{name}/acquire+release/{round}"), |b| {
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
        }
    }
    g.finish();
}

fn names(variants: &[(Variant, &'static str)]) -> Vec<&'static str> {
    variants.iter().map(|(v, _)| v.name).collect()
}

/// Prints each target's median over its slices, its range, and the ratio of medians to the
/// first target's (the baseline).
fn report(what: &str, names: &[&str], mut samples: Vec<Vec<f64>>) {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = samples.iter_mut().map(median).collect();
    for (i, name) in names.iter().enumerate() {
        println!(
            "{what}: {name:<20} median {:>8.2} (range {:.2}..{:.2}) = {:.2}x {}",
            medians[i],
            samples[i][0],
            samples[i][samples[i].len() - 1],
            medians[i] / medians[0],
            names[0]
        );
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

criterion_group!(benches, layout, member);
criterion_main!(benches);
