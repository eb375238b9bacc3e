//! Client cost per operation, in figures that do not depend on the machine's load: heap
//! allocations per acquire+release (counted by this binary's global allocator), and, run under
//! `valgrind --tool=cachegrind`, instructions per operation (see `tools/compare/cost.sh`,
//! which takes the difference of two runs so that start-up and connects cancel out).
//!
//! ```sh
//! cargo run --release --manifest-path tools/compare/Cargo.toml --bin cost -- \
//!     [--impl quorumlock|quorumlock-io|quorumlock-nofence|floor|floor+fence|floor+pipefence|floor+pipefence+notice|wire+pipefence|floor+fcall] [--ops N] [--tasks T] [--redis] [--runtime ct|mt]
//! ```
//!
//! `--runtime mt` runs the workload on a tokio multi-thread runtime (as many workers as CPUs)
//! instead of the default current-thread one. Every run also prints this process's context
//! switches per operation (voluntary / involuntary, summed over its threads from
//! `/proc/self/task/*/status`): a voluntary switch is a thread going to sleep (a wake-up of
//! another thread usually follows), so it counts the cross-thread hand-offs of an operation
//! whatever the box's load.
//!
//! With `--redis`, a second line gives the nodes' side of the measured run: their CPU per
//! operation (`INFO cpu`, user + system, summed over the five) and, per command, calls and
//! microseconds per operation from `INFO commandstats` (reset after the warm-up; commands a
//! script calls are counted too, so a `GET` inside the release script shows as `get`).
//!
//! Five local `redis-server` nodes (quorumlock's `testkit`), a current-thread tokio runtime (so
//! that instruction counts do not depend on how work spreads over threads), `T` tasks each
//! making acquire+release on keys of their own, `N` operations in all after a warm-up.
//! Prints one line: `impl tasks ops allocs/op bytes/op`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;

#[path = "../../../../benches/support/floor.rs"]
#[allow(unused_imports)]
mod floor;
use floor::Floor;
#[path = "../../../../src/node/resp.rs"]
#[allow(dead_code)]
mod resp;
#[path = "../../../../src/node/wire.rs"]
#[allow(dead_code)]
mod wire;
#[path = "../wire_floor.rs"]
mod wire_floor;

/// The system allocator, counting calls and bytes.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to `System` unchanged; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const TTL: Duration = Duration::from_secs(10);
const TTL_MS: u64 = 10_000;

/// With `--redis`: what the five nodes did per operation, from `INFO commandstats` (calls and
/// the server's own microseconds per command) after a `CONFIG RESETSTAT` taken after warm-up.
mod redis_side {
    use std::collections::BTreeMap;

    pub async fn connect(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
        let mut out = Vec::new();
        for u in urls {
            let client = redis::Client::open(u.as_str()).expect("url");
            out.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connects"),
            );
        }
        out
    }

    /// One section of a server's `INFO`.
    async fn info(server: &redis::aio::MultiplexedConnection, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut server.clone())
            .await
            .expect("info")
    }

    /// The servers' CPU seconds so far (user + system), summed.
    pub async fn cpu(servers: &[redis::aio::MultiplexedConnection]) -> f64 {
        let mut sum = 0.0;
        for s in servers {
            for line in info(s, "cpu").await.lines() {
                for f in ["used_cpu_sys:", "used_cpu_user:"] {
                    if let Some(v) = line.strip_prefix(f) {
                        sum += v.trim().parse::<f64>().unwrap_or(0.0);
                    }
                }
            }
        }
        sum
    }

    /// The servers' reads and writes of client sockets since the last reset (`INFO stats`
    /// `total_reads_processed`, `total_writes_processed`), summed: how well commands were
    /// batched per read and replies per write.
    pub async fn io(servers: &[redis::aio::MultiplexedConnection]) -> (f64, f64) {
        let (mut reads, mut writes) = (0.0, 0.0);
        for s in servers {
            for line in info(s, "stats").await.lines() {
                let num = |v: &str| v.trim().parse::<f64>().unwrap_or(0.0);
                if let Some(v) = line.strip_prefix("total_reads_processed:") {
                    reads += num(v);
                } else if let Some(v) = line.strip_prefix("total_writes_processed:") {
                    writes += num(v);
                }
            }
        }
        (reads, writes)
    }

    pub async fn reset(servers: &[redis::aio::MultiplexedConnection]) {
        for s in servers {
            let mut s = s.clone();
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut s)
                .await
                .expect("resetstat");
        }
    }

    /// `redis calls/op … usec/op …` per command, summed over the nodes (this call's own
    /// `INFO` excluded).
    pub async fn report(servers: &[redis::aio::MultiplexedConnection], ops: f64) -> String {
        let mut calls: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for s in servers {
            for line in info(s, "commandstats").await.lines() {
                let Some(rest) = line.strip_prefix("cmdstat_") else {
                    continue;
                };
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                if name == "info" || name == "config|resetstat" {
                    continue;
                }
                let field = |f: &str| -> f64 {
                    fields
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(f))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0.0)
                };
                let e = calls.entry(name.to_owned()).or_default();
                e.0 += field("calls=");
                e.1 += field("usec=");
            }
        }
        let total: f64 = calls.values().map(|c| c.1).sum::<f64>() / ops;
        let mut line = format!("redis usec/op={total:.2} (commandstats, 5 nodes):");
        for (name, (c, u)) in calls {
            line += &format!(" {name} {:.2}x {:.2}us", c / ops, u / ops);
        }
        line
    }
}

#[derive(Clone)]
enum Impl {
    Ours(Redlock),
    Floor(Floor),
    FloorFence(Floor),
    FloorPipeFence(Floor),
    /// The floor releasing with `FCALL` of a Redis 7 function instead of `EVALSHA`.
    FloorFcall(Floor),
    /// `floor+pipefence` released by the library's release script (the waiters check).
    FloorPipeFenceNotice(Floor),
    /// `floor+pipefence`'s commands over quorumlock's own connection layer.
    WirePipeFence(std::sync::Arc<wire_floor::WireFloor>),
}

impl Impl {
    async fn op(&self, key: &str) {
        match self {
            Impl::Ours(locks) => {
                let lock = locks.try_acquire(key, TTL).await.expect("acquire");
                lock.release().await.expect("release");
            }
            Impl::Floor(f) => {
                let value = Floor::new_value();
                assert!(f.acquire(key, &value, TTL_MS).await);
                assert!(f.release(key, &value).await);
            }
            Impl::FloorFence(f) => {
                let (lock_key, fence_key) = floor::fenced_keys(key);
                let value = Floor::new_value();
                assert!(
                    f.acquire_fenced(&lock_key, &fence_key, &value, TTL_MS)
                        .await
                );
                assert!(f.release(&lock_key, &value).await);
            }
            Impl::FloorFcall(f) => {
                let value = Floor::new_value();
                assert!(f.acquire(key, &value, TTL_MS).await);
                assert!(f.release_fcall(key, &value).await);
            }
            Impl::FloorPipeFence(f) => {
                let (lock_key, fence_key) = floor::fenced_keys(key);
                let value = Floor::new_value();
                let won = f.acquire_pipelined(&lock_key, &fence_key, &value, TTL_MS);
                assert!(won.await);
                assert!(f.release(&lock_key, &value).await);
            }
            Impl::FloorPipeFenceNotice(f) => {
                let (lock_key, fence_key) = floor::fenced_keys(key);
                let value = Floor::new_value();
                let won = f.acquire_pipelined(&lock_key, &fence_key, &value, TTL_MS);
                assert!(won.await);
                assert!(f.release_notice(&lock_key, &value).await);
            }
            // The same two steps over the crate's own connection layer.
            Impl::WirePipeFence(w) => {
                let (lock_key, fence_key) = floor::fenced_keys(key);
                let value = Floor::new_value();
                let won = w.acquire_pipelined(&lock_key, &fence_key, &value, TTL_MS);
                assert!(won.await);
                assert!(w.release(&lock_key, &value).await);
            }
        }
    }
}

/// `tasks` tasks, `ops` operations in all, each task on keys of its own.
async fn run(imp: &Impl, tasks: usize, ops: usize, round: &str) {
    let per_task = ops / tasks;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let imp = imp.clone();
            let round = round.to_owned();
            tokio::spawn(async move {
                let key = format!("cost:{round}:{t}");
                for _ in 0..per_task {
                    imp.op(&key).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
}

/// Voluntary and involuntary context switches of this process so far, summed over its threads
/// (threads that ended are not counted: tokio's workers live as long as the runtime).
fn ctx_switches() -> (u64, u64) {
    let mut sum = (0, 0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return sum;
    };
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            let field = |p: &str| {
                line.strip_prefix(p)
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let Some(v) = field("voluntary_ctxt_switches:") {
                sum.0 += v;
            } else if let Some(v) = field("nonvoluntary_ctxt_switches:") {
                sum.1 += v;
            }
        }
    }
    sum
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = arg(&args, "--impl").unwrap_or_else(|| "quorumlock".into());
    let ops: usize = arg(&args, "--ops").map_or(2000, |s| s.parse().expect("--ops N"));
    let tasks: usize = arg(&args, "--tasks").map_or(1, |s| s.parse().expect("--tasks T"));
    let cluster = LocalCluster::start(5).unwrap_or_else(|e| panic!("{e}"));
    let urls = cluster.urls();
    let flavour = arg(&args, "--runtime").unwrap_or_else(|| "ct".into());
    let rt = match flavour.as_str() {
        "ct" => tokio::runtime::Builder::new_current_thread(),
        "mt" => tokio::runtime::Builder::new_multi_thread(),
        other => panic!("unknown --runtime {other}: ct or mt"),
    }
    .enable_all()
    .build()
    .expect("runtime");
    let imp = rt.block_on(async {
        match which.as_str() {
            "quorumlock" | "quorumlock-nofence" | "quorumlock-io" => Impl::Ours(
                Redlock::builder(&urls)
                    .fencing(which != "quorumlock-nofence")
                    // `quorumlock-io`: with an I/O thread of its own.
                    .io_thread(if which == "quorumlock-io" {
                        quorumlock::IoThread::Always
                    } else {
                        quorumlock::IoThread::Never
                    })
                    // Generous: under valgrind the client runs ~50x slower.
                    .node_timeout(Duration::from_secs(5))
                    .connect_timeout(Duration::from_secs(20))
                    .build()
                    .expect("config"),
            ),
            "floor" => Impl::Floor(Floor::connect(&urls).await.expect("floor connects")),
            "floor+fence" => Impl::FloorFence(Floor::connect(&urls).await.expect("floor connects")),
            "floor+pipefence" => {
                Impl::FloorPipeFence(Floor::connect(&urls).await.expect("floor connects"))
            }
            "floor+pipefence+notice" => {
                Impl::FloorPipeFenceNotice(Floor::connect(&urls).await.expect("floor connects"))
            }
            "wire+pipefence" => Impl::WirePipeFence(std::sync::Arc::new(
                wire_floor::WireFloor::connect(&urls).await,
            )),
            "floor+fcall" => {
                let f = Floor::connect(&urls).await.expect("floor connects");
                f.load_functions().await.expect("FUNCTION LOAD (Redis 7)");
                Impl::FloorFcall(f)
            }
            other => panic!("unknown --impl {other}"),
        }
    });
    // Warm-up: connections, scripts, the runtime's and the allocator's first growth.
    rt.block_on(run(&imp, tasks, tasks * 50, "warm"));
    let servers = rt.block_on(redis_side::connect(&urls));
    rt.block_on(redis_side::reset(&servers));
    let cpu0 = rt.block_on(redis_side::cpu(&servers));
    let (a0, b0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    let cs0 = ctx_switches();
    rt.block_on(run(&imp, tasks, ops, "measure"));
    let cs1 = ctx_switches();
    let (a1, b1) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    let done = (ops / tasks * tasks) as f64;
    println!(
        "{which} runtime={flavour} tasks={tasks} ops={} allocs/op={:.2} bytes/op={:.0} ctxsw/op={:.2}/{:.2}",
        ops / tasks * tasks,
        (a1 - a0) as f64 / done,
        (b1 - b0) as f64 / done,
        cs1.0.saturating_sub(cs0.0) as f64 / done,
        cs1.1.saturating_sub(cs0.1) as f64 / done,
    );
    if args.iter().any(|a| a == "--redis") {
        let cpu = rt.block_on(redis_side::cpu(&servers)) - cpu0;
        let (reads, writes) = rt.block_on(redis_side::io(&servers));
        println!(
            "redis cpu usec/op={:.1} reads/op={:.2} writes/op={:.2} {}",
            cpu * 1e6 / done,
            reads / done,
            writes / done,
            rt.block_on(redis_side::report(&servers, done))
        );
    }
    if let Impl::Ours(locks) = &imp {
        rt.block_on(locks.flush());
    }
}
