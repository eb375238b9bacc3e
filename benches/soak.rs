//! A soak shaped like production (issue 27): several OS processes, each a fresh client, use
//! locks on hundreds of keys of skewed popularity, hold them through 10 ms–2 s of work with
//! `keep_alive`, wait for held ones, share a semaphore and campaign in an election, while a
//! nemesis kills (restarting empty), pauses and resumes a minority of the five nodes.
//!
//! Every critical section enters and leaves a fenced resource on a separate `redis-server`
//! (one Lua call each way), which judges what the clients cannot see themselves: two sections
//! of one key at once (**overlaps**), a section whose token is not above the last one entered
//! for its key (**token regressions**), and the time from a release to the next section of the
//! same key when someone was waiting for it (**handover**).
//!
//! It reports, over time (one row every 10 s) and in total: acquisitions per second; overlaps
//! and token regressions; Redis commands and Redis CPU per acquisition (`INFO commandstats`,
//! `INFO cpu` of the five nodes); client CPU per acquisition and client RSS at start and end
//! (`/proc` of the worker processes); handover p50/p99; waiting time p50/p99/max per task;
//! token growth per acquisition; the nodes' key counts at start and end; errors by kind. It
//! writes the table (Markdown) and two SVG plots (commands per second, handover p50, faults
//! marked) to `SOAK_OUT` (default `target/soak`).
//!
//! ```sh
//! cargo bench --features testkit --bench soak                 # 10 minutes
//! SOAK_SECS=60 cargo bench --features testkit --bench soak    # the 1-minute quick mode
//! ```
//!
//! `SOAK_WORKERS` (default 3) processes of `SOAK_TASKS` (default 4) lock tasks each; `SOAK_KEYS`
//! (default 300) keys, key `i` drawn with weight `1 / (i + 1)` (Zipf). Set `SOAK_NEMESIS=0` for a
//! run without faults.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quorumlock::redis;
use quorumlock::testkit::{LocalCluster, RedisServer, ServerOptions};
use quorumlock::{Election, Error, Redlock, Semaphore};

const NODES: usize = 5;
const TTL: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(5);
const ROW: Duration = Duration::from_secs(10);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if std::env::var_os("SOAK_WORKER").is_some() {
        worker::main();
        return;
    }
    driver::main();
}

/// The fenced resource's two scripts, on its own `redis-server`.
mod resource {
    /// KEYS[1] occupant, KEYS[2] last token, KEYS[3] last leave (µs); ARGV[1] token, ARGV[2]
    /// 1 if the caller waited for the key. Returns {overlap, regression, handover µs or -1}.
    pub(crate) const ENTER: &str = r#"
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local overlap = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  overlap = 1
  redis.call('INCR', 'soak:overlaps')
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)
local regression = 0
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) <= last then
  regression = 1
  redis.call('INCR', 'soak:regressions')
else
  redis.call('SET', KEYS[2], ARGV[1])
end
local handover = -1
local left = redis.call('GET', KEYS[3])
if ARGV[2] == '1' and left then
  handover = now - tonumber(left)
end
return {overlap, regression, handover}
"#;

    /// KEYS[1] occupant, KEYS[2] last leave (µs); ARGV[1] token. Clears the occupant if it is
    /// us, and stamps the leave.
    pub(crate) const LEAVE: &str = r#"
local t = redis.call('TIME')
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
redis.call('SET', KEYS[2], t[1] * 1000000 + t[2], 'PX', 60000)
return 1
"#;
}

/// One worker process: a fresh client, `SOAK_TASKS` lock tasks, a semaphore task and an
/// election candidate. Prints one `row` line per second and a `done` line at the end.
mod worker {
    use super::*;

    #[derive(Default)]
    struct Counts {
        acquired: AtomicU64,
        held: AtomicU64,
        no_quorum: AtomicU64,
        lost: AtomicU64,
        other: AtomicU64,
        overlaps: AtomicU64,
        regressions: AtomicU64,
        permits: AtomicU64,
        terms: AtomicU64,
    }

    fn count_error(c: &Counts, e: &Error) {
        let n = match e {
            Error::Held { .. } => &c.held,
            Error::NoQuorum { .. } | Error::ValidityExpired { .. } => &c.no_quorum,
            Error::Lost { .. } => &c.lost,
            _ => &c.other,
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// Zipf over `keys` names: key `i` with weight `1 / (i + 1)`.
    fn pick(keys: usize, unit: f64) -> usize {
        let total: f64 = (1..=keys).map(|i| 1.0 / i as f64).sum();
        let mut x = unit * total;
        for i in 0..keys {
            x -= 1.0 / (i + 1) as f64;
            if x <= 0.0 {
                return i;
            }
        }
        keys - 1
    }

    /// 10 ms to 2 s, most of it short (log-uniform).
    fn work() -> Duration {
        let ms = (10f64.ln() + rand::random::<f64>() * (2000f64.ln() - 10f64.ln())).exp();
        Duration::from_millis(ms as u64)
    }

    pub(crate) fn main() {
        let nodes: Vec<String> = std::env::var("SOAK_NODES")
            .expect("SOAK_NODES")
            .split(',')
            .map(str::to_owned)
            .collect();
        let resource = std::env::var("SOAK_RESOURCE").expect("SOAK_RESOURCE");
        let secs: u64 = env_or("SOAK_SECS", 600);
        let tasks: usize = env_or("SOAK_TASKS", 4);
        let keys: usize = env_or("SOAK_KEYS", 300);
        let me: usize = env_or("SOAK_WORKER", 0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let rss_start = proc_stat().1;
        let waits = Arc::new(Mutex::new(Vec::<u64>::new()));
        let counts = Arc::new(Counts::default());
        rt.block_on(async {
            let locks = Redlock::builder(nodes)
                .node_timeout(Duration::from_millis(250))
                .build()
                .expect("valid config");
            let res = redis::Client::open(resource).expect("resource url");
            let fenced = Fenced {
                conn: res
                    .get_multiplexed_async_connection()
                    .await
                    .expect("resource"),
                enter: redis::Script::new(resource::ENTER),
                leave: redis::Script::new(resource::LEAVE),
            };
            let end = tokio::time::Instant::now() + Duration::from_secs(secs);
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..tasks {
                let (counts, waits) = (Arc::clone(&counts), Arc::clone(&waits));
                set.spawn(lock_task(
                    locks.clone(),
                    fenced.clone(),
                    counts,
                    waits,
                    end,
                    keys,
                ));
            }
            // A semaphore of 3 permits, one task per worker.
            set.spawn(semaphore_task(locks.clone(), Arc::clone(&counts), end));
            // An election: one candidate per worker, leading for a while, then resigning.
            set.spawn(election_task(locks.clone(), Arc::clone(&counts), end, me));
            // One line a second: cumulative counts.
            let reporter = tokio::spawn(report_rows(Arc::clone(&counts)));
            while set.join_next().await.is_some() {}
            reporter.abort();
            locks.flush().await;
        });
        let (cpu, rss_end) = proc_stat();
        let waits = waits.lock().expect("waits");
        let list: Vec<String> = waits.iter().map(u64::to_string).collect();
        println!("done {cpu} {rss_start} {rss_end} {}", list.join(","));
    }

    /// The fenced resource, as a lock task reaches it: its connection and its two scripts.
    #[derive(Clone)]
    struct Fenced {
        conn: redis::aio::MultiplexedConnection,
        enter: redis::Script,
        leave: redis::Script,
    }

    /// Until `end`: acquire a key drawn from `keys` (waiting for it), enter the resource, work
    /// until done or lost, leave, release; waits and outcomes counted.
    async fn lock_task(
        locks: Redlock,
        fenced: Fenced,
        counts: Arc<Counts>,
        waits: Arc<Mutex<Vec<u64>>>,
        end: tokio::time::Instant,
        keys: usize,
    ) {
        let Fenced {
            mut conn,
            enter,
            leave,
        } = fenced;
        while tokio::time::Instant::now() < end {
            let key = format!("soak:{}", pick(keys, rand::random::<f64>()));
            let asked = Instant::now();
            let lock = match locks.acquire_timeout(&key, TTL, WAIT).await {
                Ok(lock) => lock,
                Err(e) => {
                    count_error(&counts, &e);
                    continue;
                }
            };
            let waited = asked.elapsed();
            waits
                .lock()
                .expect("waits")
                .push(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
            counts.acquired.fetch_add(1, Ordering::Relaxed);
            lock.keep_alive();
            let token = lock.token().get();
            let (occupant, last, left) = (
                format!("{key}:in"),
                format!("{key}:tok"),
                format!("{key}:left"),
            );
            let r: redis::RedisResult<(i64, i64, i64)> = enter
                .key(&occupant)
                .key(&last)
                .key(&left)
                .arg(token)
                .arg(u8::from(waited > Duration::from_millis(20)))
                .invoke_async(&mut conn)
                .await;
            if let Ok((overlap, regression, handover)) = r {
                counts
                    .overlaps
                    .fetch_add(u64::try_from(overlap).unwrap_or(0), Ordering::Relaxed);
                counts
                    .regressions
                    .fetch_add(u64::try_from(regression).unwrap_or(0), Ordering::Relaxed);
                if handover >= 0 {
                    println!("handover {handover}");
                }
            }
            // Work until done or the lock is lost: then leave at once.
            tokio::select! {
                () = tokio::time::sleep(work()) => {}
                () = lock.lost() => {}
            }
            let _: redis::RedisResult<i64> = leave
                .key(&occupant)
                .key(&left)
                .arg(token)
                .invoke_async(&mut conn)
                .await;
            if let Err(e) = lock.release().await {
                count_error(&counts, &e);
            }
        }
    }

    /// Until `end`: take a permit of the 3 of "soak:sem", work, give it back.
    async fn semaphore_task(locks: Redlock, counts: Arc<Counts>, end: tokio::time::Instant) {
        let sem = Semaphore::new(&locks, "soak:sem", 3).expect("semaphore");
        while tokio::time::Instant::now() < end {
            match sem.acquire_timeout(TTL, WAIT).await {
                Ok(permit) => {
                    counts.permits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(work()).await;
                    let _ = permit.release().await;
                }
                Err(e) => count_error(&counts, &e),
            }
        }
    }

    /// Until `end`: campaign as `worker-{me}`, lead until done or lost, resign.
    async fn election_task(
        locks: Redlock,
        counts: Arc<Counts>,
        end: tokio::time::Instant,
        me: usize,
    ) {
        let election = Election::builder(locks, "soak:leader")
            .candidate(format!("worker-{me}"))
            .ttl(TTL)
            .build()
            .expect("election");
        while tokio::time::Instant::now() < end {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            match election.campaign_timeout(left).await {
                Ok(term) => {
                    counts.terms.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        () = tokio::time::sleep(work() * 2) => {}
                        () = term.lost() => {}
                    }
                    let _ = term.resign().await;
                }
                Err(e) => count_error(&counts, &e),
            }
        }
    }

    /// One `row` line a second: the cumulative counts, CPU and RSS.
    async fn report_rows(counts: Arc<Counts>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let c = &counts;
            let (cpu, rss) = proc_stat();
            println!(
                "row {} {} {} {} {} {} {} {} {} {cpu} {rss}",
                c.acquired.load(Ordering::Relaxed),
                c.held.load(Ordering::Relaxed),
                c.no_quorum.load(Ordering::Relaxed),
                c.lost.load(Ordering::Relaxed),
                c.other.load(Ordering::Relaxed),
                c.overlaps.load(Ordering::Relaxed),
                c.regressions.load(Ordering::Relaxed),
                c.permits.load(Ordering::Relaxed),
                c.terms.load(Ordering::Relaxed),
            );
        }
    }

    /// This process's CPU time (µs, user + system) and resident set (KiB), from `/proc`.
    fn proc_stat() -> (u64, u64) {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the comm field.
        let cpu_us = (ticks(11) + ticks(12)) * 10_000;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (cpu_us, rss)
    }
}

/// The driver: the nodes, the resource, the workers, the nemesis, and the report.
mod driver {
    use super::*;

    /// One sample of the nodes, each second: (seconds since the start, commands so far, Redis
    /// CPU so far in µs, acquisitions so far).
    type Sample = (f64, u64, u64, u64);

    /// The latest `row` of each worker, and its handovers.
    #[derive(Default, Clone)]
    struct WorkerState {
        row: Vec<u64>,
        handovers: Vec<(f64, u64)>,
        done: Option<Vec<u64>>,
        waits: Vec<u64>,
    }

    /// Each node's commands and CPU (µs) so far, `None` where it did not answer.
    fn sample(urls: &[String]) -> Vec<Option<(u64, u64)>> {
        urls.iter().map(|url| sample_one(url)).collect()
    }

    fn sample_one(url: &str) -> Option<(u64, u64)> {
        let (mut calls, mut cpu) = (0u64, 0u64);
        {
            let client = redis::Client::open(url).ok()?;
            let mut conn = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .ok()?;
            let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .arg("cpu")
                .query(&mut conn)
                .ok()?;
            for line in info.lines() {
                if let Some(rest) = line.strip_prefix("cmdstat_") {
                    // Our own INFO calls are not the workload's.
                    if rest.starts_with("info:") {
                        continue;
                    }
                    calls += rest
                        .split_once("calls=")
                        .and_then(|(_, r)| r.split(',').next())
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                for field in ["used_cpu_sys:", "used_cpu_user:"] {
                    if let Some(v) = line.strip_prefix(field) {
                        cpu += (v.trim().parse::<f64>().unwrap_or(0.0) * 1e6) as u64;
                    }
                }
            }
        }
        Some((calls, cpu))
    }

    /// Running totals over the nodes' counters, which restart from zero with their node and
    /// are unreadable while it is paused: per node, each sample adds its increase since the
    /// last one it answered (all of it after a restart).
    #[derive(Default)]
    struct Totals {
        last: Vec<Option<(u64, u64)>>,
        calls: u64,
        cpu: u64,
    }

    impl Totals {
        fn add(&mut self, now: &[Option<(u64, u64)>]) {
            self.last.resize(now.len(), None);
            for (last, now) in self.last.iter_mut().zip(now) {
                let Some((calls, cpu)) = *now else { continue };
                let (c0, u0) = match *last {
                    Some((c0, u0)) if c0 <= calls && u0 <= cpu => (c0, u0),
                    // First sample, or the node restarted (its counters start again).
                    Some(_) => (0, 0),
                    None => (calls, cpu),
                };
                self.calls += calls - c0;
                self.cpu += cpu - u0;
                *last = Some((calls, cpu));
            }
        }
    }

    fn keys_on(urls: &[String]) -> Vec<u64> {
        urls.iter()
            .map(|url| {
                redis::Client::open(url.as_str())
                    .ok()
                    .and_then(|c| {
                        c.get_connection_with_timeout(Duration::from_millis(500))
                            .ok()
                    })
                    .and_then(|mut c| redis::cmd("DBSIZE").query::<u64>(&mut c).ok())
                    .unwrap_or(0)
            })
            .collect()
    }

    fn percentile(sorted: &[u64], p: f64) -> u64 {
        if sorted.is_empty() {
            return 0;
        }
        let i = ((sorted.len() - 1) as f64 * p).round() as usize;
        sorted[i.min(sorted.len() - 1)]
    }

    pub(crate) fn main() {
        let secs: u64 = env_or("SOAK_SECS", 600);
        let workers: usize = env_or("SOAK_WORKERS", 3);
        let nemesis_on = env_or("SOAK_NEMESIS", 1u8) == 1;
        let out = std::env::var("SOAK_OUT").unwrap_or_else(|_| "target/soak".to_owned());
        std::fs::create_dir_all(&out).expect("SOAK_OUT");
        let mut cluster = LocalCluster::start(NODES).unwrap_or_else(|e| panic!("{e}"));
        let resource = RedisServer::start(&ServerOptions::new()).unwrap_or_else(|e| panic!("{e}"));
        let urls = cluster.urls();
        let exe = std::env::current_exe().expect("current exe");
        let states: Arc<Mutex<Vec<WorkerState>>> =
            Arc::new(Mutex::new(vec![WorkerState::default(); workers]));
        let began = Instant::now();
        let keys_start = keys_on(&urls);
        let mut totals = Totals::default();
        totals.add(&sample(&urls));
        // Taken once warm (60 s in, or a tenth of a shorter run): flat means flat after that.
        let warm_at = began + Duration::from_secs((secs / 10).min(60));
        let mut warm: Option<(Vec<u64>, Vec<u64>)> = None;
        let mut children: Vec<Child> = Vec::new();
        let mut readers = Vec::new();
        for w in 0..workers {
            let (child, reader) =
                spawn_worker(&exe, w, &urls, &resource.url(), secs, &states, began);
            children.push(child);
            readers.push(reader);
        }

        // The nemesis and the sampler, on this thread.
        let mut faults: Vec<(f64, String)> = Vec::new();
        let mut samples: Vec<Sample> = Vec::new();
        let mut next_fault = Instant::now() + Duration::from_secs(15);
        let end = began + Duration::from_secs(secs);
        let mut nemesis = Nemesis {
            rng_state: 0x5eed,
            paused: None,
        };
        let mut next_sample = Instant::now();
        while Instant::now() < end {
            if Instant::now() >= next_sample {
                let (acquired, rss) = take_sample(&urls, &states, &mut totals);
                if warm.is_none() && Instant::now() >= warm_at {
                    warm = Some((rss, keys_on(&urls)));
                }
                samples.push((
                    began.elapsed().as_secs_f64(),
                    totals.calls,
                    totals.cpu,
                    acquired,
                ));
                next_sample += Duration::from_secs(1);
            }
            if nemesis_on && Instant::now() >= next_fault {
                let at = began.elapsed().as_secs_f64();
                faults.push((at, nemesis.strike(&mut cluster)));
                next_fault = Instant::now() + Duration::from_secs(10 + nemesis.next_rand(20));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(n) = nemesis.paused.take() {
            let _ = cluster.resume(n);
        }
        for mut c in children {
            let _ = c.wait();
        }
        for r in readers {
            let _ = r.join();
        }
        totals.add(&sample(&urls));
        let keys_end = keys_on(&urls);
        let (rss_warm, keys_warm) = warm.unwrap_or_default();
        report(
            &out,
            secs,
            &states.lock().expect("states"),
            (&samples, &faults),
            (totals.calls, totals.cpu),
            (&keys_start, &keys_warm, &keys_end, &rss_warm),
            &resource.url(),
        );
    }

    /// Starts worker process `w` on `urls` and the resource, and a thread reading its lines.
    fn spawn_worker(
        exe: &std::path::Path,
        w: usize,
        urls: &[String],
        resource_url: &str,
        secs: u64,
        states: &Arc<Mutex<Vec<WorkerState>>>,
        began: Instant,
    ) -> (Child, std::thread::JoinHandle<()>) {
        let mut child = Command::new(exe)
            .env("SOAK_WORKER", w.to_string())
            .env("SOAK_NODES", urls.join(","))
            .env("SOAK_RESOURCE", resource_url)
            .env("SOAK_SECS", secs.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("worker process");
        let stdout = child.stdout.take().expect("piped");
        let states = Arc::clone(states);
        let reader = std::thread::spawn(move || {
            read_worker(stdout, w, &states, began);
        });
        (child, reader)
    }

    /// Reads worker `w`'s lines into its state: its latest `row`, its handovers (timed from
    /// `began`), and its `done` line.
    fn read_worker(
        stdout: std::process::ChildStdout,
        w: usize,
        states: &Mutex<Vec<WorkerState>>,
        began: Instant,
    ) {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut parts = line.split_whitespace();
            let kind = parts.next().unwrap_or("");
            let mut st = states.lock().expect("states");
            let at = began.elapsed().as_secs_f64();
            match kind {
                "row" => st[w].row = parts.filter_map(|p| p.parse().ok()).collect(),
                "handover" => {
                    if let Some(us) = parts.next().and_then(|p| p.parse().ok()) {
                        st[w].handovers.push((at, us));
                    }
                }
                "done" => {
                    let nums: Vec<u64> = parts
                        .by_ref()
                        .take(3)
                        .filter_map(|p| p.parse().ok())
                        .collect();
                    st[w].waits = parts
                        .next()
                        .unwrap_or("")
                        .split(',')
                        .filter_map(|p| p.parse().ok())
                        .collect();
                    st[w].done = Some(nums);
                }
                _ => {}
            }
        }
    }

    /// Adds the nodes' counters to `totals`; returns the acquisitions the workers reported
    /// so far, and their RSS.
    fn take_sample(
        urls: &[String],
        states: &Mutex<Vec<WorkerState>>,
        totals: &mut Totals,
    ) -> (u64, Vec<u64>) {
        totals.add(&sample(urls));
        let st = states.lock().expect("states");
        (
            st.iter().map(|s| s.row.first().copied().unwrap_or(0)).sum(),
            st.iter()
                .map(|s| s.row.get(10).copied().unwrap_or(0))
                .collect(),
        )
    }

    /// The driver's nemesis: a fixed-seed generator, and the node it paused, if any.
    struct Nemesis {
        rng_state: u64,
        paused: Option<usize>,
    }

    impl Nemesis {
        /// The next number below `n`.
        fn next_rand(&mut self, n: u64) -> u64 {
            self.rng_state = self
                .rng_state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.rng_state >> 33) % n
        }

        /// Resumes the paused node if there is one, else kills a random node and restarts it
        /// (empty, or with its data) or pauses it. Returns what it did.
        fn strike(&mut self, cluster: &mut LocalCluster) -> String {
            if let Some(n) = self.paused.take() {
                let _ = cluster.resume(n);
                return format!("resume node {n}");
            }
            let n = usize::try_from(self.next_rand(NODES as u64)).unwrap_or(0);
            match self.next_rand(3) {
                0 => {
                    let _ = cluster.kill(n);
                    std::thread::sleep(Duration::from_secs(1));
                    let _ = cluster.restart_empty(n);
                    format!("kill node {n}, restart empty")
                }
                1 => {
                    let _ = cluster.pause(n);
                    self.paused = Some(n);
                    format!("pause node {n}")
                }
                _ => {
                    let _ = cluster.kill(n);
                    std::thread::sleep(Duration::from_secs(1));
                    let _ = cluster.restart(n);
                    format!("kill node {n}, restart (data kept)")
                }
            }
        }
    }

    fn report(
        out: &str,
        secs: u64,
        states: &[WorkerState],
        (samples, faults): (&[Sample], &[(f64, String)]),
        (calls, redis_cpu): (u64, u64),
        (keys_start, keys_warm, keys_end, rss_warm): (&[u64], &[u64], &[u64], &[u64]),
        resource: &str,
    ) {
        let total = |i: usize| -> u64 {
            states
                .iter()
                .map(|s| s.row.get(i).copied().unwrap_or(0))
                .sum()
        };
        let acquired = total(0).max(1);
        let client_cpu = client_cpu(states);
        let handovers = sorted(states.iter().flat_map(|s| s.handovers.iter().map(|h| h.1)));
        let waits = sorted(states.iter().flat_map(|s| s.waits.iter().copied()));
        // Token growth: the resource's last token per key over the acquisitions.
        let growth = token_growth(resource);
        let mut md = String::new();
        let _ = writeln!(md, "| figure | value |\n| --- | ---: |");
        let rows: Vec<(&str, String)> = vec![
            ("duration", format!("{secs} s, {} faults", faults.len())),
            (
                "lock acquisitions (per second)",
                format!("{} ({:.1})", total(0), total(0) as f64 / secs as f64),
            ),
            (
                "semaphore permits / election terms",
                format!("{} / {}", total(7), total(8)),
            ),
            ("overlaps (must be 0)", total(5).to_string()),
            ("token regressions (must be 0)", total(6).to_string()),
            (
                "errors: held after the wait / no quorum / lost / other",
                format!("{} / {} / {} / {}", total(1), total(2), total(3), total(4)),
            ),
            (
                "Redis commands per lock acquisition (5 nodes, all the workload included)",
                format!("{:.1}", calls as f64 / acquired as f64),
            ),
            (
                "Redis CPU per lock acquisition (5 nodes, all the workload included)",
                format!("{:.0} µs", redis_cpu as f64 / acquired as f64),
            ),
            (
                "client CPU per lock acquisition (semaphore, election and keep-alive included)",
                format!("{:.0} µs", client_cpu as f64 / acquired as f64),
            ),
            (
                "client RSS start → warm → end (KiB, per worker)",
                rss_per_worker(states, rss_warm),
            ),
            (
                "handover p50 / p99 (µs)",
                format!(
                    "{} / {} (n = {})",
                    percentile(&handovers, 0.5),
                    percentile(&handovers, 0.99),
                    handovers.len()
                ),
            ),
            (
                "waiting p50 / p99 / max (ms)",
                format!(
                    "{:.1} / {:.1} / {:.1}",
                    percentile(&waits, 0.5) as f64 / 1e3,
                    percentile(&waits, 0.99) as f64 / 1e3,
                    waits.last().copied().unwrap_or(0) as f64 / 1e3
                ),
            ),
            (
                "token growth per acquisition (sum of last tokens / acquisitions)",
                format!("{:.2}", growth as f64 / acquired as f64),
            ),
            (
                "node keys start → warm → end",
                format!("{keys_start:?} → {keys_warm:?} → {keys_end:?}"),
            ),
        ];
        for (k, v) in &rows {
            let _ = writeln!(md, "| {k} | {v} |");
        }
        write_over_time(&mut md, samples, faults);
        std::fs::write(format!("{out}/soak.md"), &md).expect("write soak.md");
        // Plots: commands per second, and the handover p50 per 10 s window.
        write_plots(out, states, samples, faults, secs);
        println!("{md}");
        println!("written: {out}/soak.md, {out}/soak-commands.svg, {out}/soak-handover.svg");
    }

    /// The workers' CPU (µs), from their `done` lines.
    fn client_cpu(states: &[WorkerState]) -> u64 {
        states
            .iter()
            .filter_map(|s| s.done.as_ref())
            .map(|d| d[0])
            .sum()
    }

    /// Each worker's RSS (KiB) at start, once warm and at the end: `start → warm → end`.
    fn rss_per_worker(states: &[WorkerState], rss_warm: &[u64]) -> String {
        states
            .iter()
            .zip(rss_warm.iter().chain(std::iter::repeat(&0)))
            .filter_map(|(s, warm)| s.done.as_ref().map(|d| (d[1], *warm, d[2])))
            .map(|(a, w, b)| format!("{a} → {w} → {b}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `values`, sorted.
    fn sorted(values: impl Iterator<Item = u64>) -> Vec<u64> {
        let mut v: Vec<u64> = values.collect();
        v.sort_unstable();
        v
    }

    /// Token growth: the resource's last token per key, summed.
    fn token_growth(resource: &str) -> u64 {
        redis::Client::open(resource)
            .ok()
            .and_then(|c| c.get_connection().ok())
            .map(|mut c| {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("soak:*:tok")
                    .query(&mut c)
                    .unwrap_or_default();
                keys.iter()
                    .map(|k| redis::cmd("GET").arg(k).query::<u64>(&mut c).unwrap_or(0))
                    .sum::<u64>()
            })
            .unwrap_or(0)
    }

    /// The table over time (every `ROW`: acquisitions, commands, their ratio) and the faults.
    fn write_over_time(md: &mut String, samples: &[Sample], faults: &[(f64, String)]) {
        let _ = writeln!(
            md,
            "\nOver time (every {} s):\n\n| t (s) | acquisitions/s | Redis commands/s | commands/acquisition |\n| ---: | ---: | ---: | ---: |",
            ROW.as_secs()
        );
        let step = ROW.as_secs() as usize;
        let mut i = 0;
        while i + step < samples.len() {
            let (a, b) = (samples[i], samples[i + step]);
            let dt = b.0 - a.0;
            let acq = b.3.saturating_sub(a.3);
            let cmds = b.1.saturating_sub(a.1);
            let _ = writeln!(
                md,
                "| {:.0} | {:.1} | {:.0} | {:.1} |",
                b.0,
                acq as f64 / dt,
                cmds as f64 / dt,
                cmds as f64 / acq.max(1) as f64
            );
            i += step;
        }
        let _ = writeln!(md, "\nFaults:\n");
        for (t, f) in faults {
            let _ = writeln!(md, "- {t:.0} s: {f}");
        }
    }

    /// The two plots: commands per second, and the handover p50 per `ROW` window.
    fn write_plots(
        out: &str,
        states: &[WorkerState],
        samples: &[Sample],
        faults: &[(f64, String)],
        secs: u64,
    ) {
        let cmd_rate: Vec<(f64, f64)> = samples
            .windows(2)
            .map(|w| {
                (
                    w[1].0,
                    w[1].1.saturating_sub(w[0].1) as f64 / (w[1].0 - w[0].0),
                )
            })
            .collect();
        let mut windows: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for s in states {
            for (t, us) in &s.handovers {
                windows
                    .entry((*t / ROW.as_secs_f64()) as u64)
                    .or_default()
                    .push(*us);
            }
        }
        let handover_p50: Vec<(f64, f64)> = windows
            .into_iter()
            .map(|(w, mut v)| {
                v.sort_unstable();
                (
                    (w as f64 + 0.5) * ROW.as_secs_f64(),
                    percentile(&v, 0.5) as f64 / 1e3,
                )
            })
            .collect();
        std::fs::write(
            format!("{out}/soak-commands.svg"),
            svg(
                "Redis commands per second (5 nodes)",
                "commands/s",
                &cmd_rate,
                faults,
                secs,
            ),
        )
        .expect("svg");
        std::fs::write(
            format!("{out}/soak-handover.svg"),
            svg(
                "Handover p50 per 10 s (ms)",
                "ms",
                &handover_p50,
                faults,
                secs,
            ),
        )
        .expect("svg");
    }

    /// A line plot of `points` over `0..secs`, with a red tick for every fault.
    fn svg(
        title: &str,
        unit: &str,
        points: &[(f64, f64)],
        faults: &[(f64, String)],
        secs: u64,
    ) -> String {
        let (w, h, left, bottom, top) = (800.0, 300.0, 60.0, 30.0, 30.0);
        let max_y = points.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let x = |t: f64| left + (w - left - 10.0) * t / secs as f64;
        let y = |v: f64| h - bottom - (h - bottom - top) * v / max_y;
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{left}\" y=\"18\">{title}</text>\n\
             <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
             <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n\
             <text x=\"5\" y=\"{}\">{max_y:.0} {unit}</text><text x=\"5\" y=\"{}\">0</text>\n\
             <text x=\"{}\" y=\"{}\">{secs} s</text>\n",
            h - bottom,
            w - 10.0,
            h - bottom,
            h - bottom,
            top + 4.0,
            h - bottom,
            w - 50.0,
            h - 10.0
        );
        for (t, what) in faults {
            let _ = writeln!(
                s,
                "<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"red\" stroke-dasharray=\"3,3\"><title>{what}</title></line>",
                x(*t),
                h - bottom
            );
        }
        let path: Vec<String> = points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"1.5\" points=\"{}\"/>",
            path.join(" ")
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"red\">dashed: faults</text>\n</svg>",
            w - 120.0,
            top - 8.0
        );
        s
    }
}
