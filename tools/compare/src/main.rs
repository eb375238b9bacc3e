//! One run, one table: quorumlock against the floor (a hand-written Redlock round on the `redis`
//! crate), the Redlock crates on crates.io (`rslock`, `redlock`) and node-redlock 5 (ioredis 5,
//! in a Node.js child process, `node/`), every tokio client on both runtime flavours (multi-thread
//! and current-thread), on the same five local
//! `redis-server` nodes, keys and scenarios; healthy, then with one node paused (SIGSTOP), two
//! paused, and one killed. Prints the table and writes it to `docs/benchmarks.md` (between
//! markers, keeping the hand-written notes around it).
//!
//! ```text
//! cargo run --release --manifest-path tools/compare/Cargo.toml -- [--quick] [--impls 'a;b'] [--runtimes 'mt;ct'] [--scenarios 's1;s2'] [--phases 'healthy;paused1;paused2;killed1'] [--ops N] [--fresh-keys] [--no-doc] [--out PATH]
//! ```
//!
//! Each scenario runs in five slices, the implementations taking turns within each slice, so
//! a change of load on a shared machine touches every implementation alike.

mod clients;
#[path = "../../../benches/support/floor.rs"]
mod floor;
mod node;
mod plot;
mod report;
mod workload;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use tokio::runtime::Runtime;

use crate::clients::Client;
use crate::report::{Phase, Row, Rt};
use crate::workload::{Op, Spec};

/// The default implementations (`floor-1task`, an experiment, runs only when named).
const IMPLS: [&str; 10] = [
    "floor",
    "floor+fence",
    "floor+pipefence",
    "floor+pipefence+notice",
    "quorumlock",
    "quorumlock-io",
    "quorumlock-nofence",
    "node-redlock",
    "rslock",
    "redlock",
];
const SLICES: u32 = 5;
/// `redlock` opens a TCP connection per node and command; cap its operations per slice so a run
/// does not exhaust the loopback's ephemeral ports.
const REDLOCK_OPS_PER_SLICE: u64 = 1_000;
/// Lock names per worker in the acquire+release scenarios: every operation's name is free (no
/// two operations in flight share one), and names come back as in a real system that locks a
/// large but bounded set of resources. quorumlock's fencing counters never expire, so with
/// never-repeating names every operation would add a key to every node (see `--fresh-keys`).
const NAMES_PER_WORKER: u64 = 1_000;

/// One scenario: what the workers do, how many, for how long at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    op: Op,
    tasks: usize,
    /// Operations per worker over the whole scenario, at most.
    max_ops: u64,
    /// Wall-clock budget per implementation over the whole scenario.
    budget: Duration,
}

const fn scenario(
    name: &'static str,
    op: Op,
    tasks: usize,
    max_ops: u64,
    budget_ms: u64,
) -> Scenario {
    Scenario {
        name,
        op,
        tasks,
        max_ops,
        budget: Duration::from_millis(budget_ms),
    }
}

const HEALTHY: [Scenario; 7] = [
    scenario("acquire, 1 task", Op::Acquire, 1, 3_000, 4_000),
    scenario(
        "acquire+release, 1 task",
        Op::AcquireRelease,
        1,
        3_000,
        4_000,
    ),
    scenario("extend, 1 task", Op::Extend, 1, 3_000, 4_000),
    scenario(
        "acquire+release, 16 tasks",
        Op::AcquireRelease,
        16,
        u64::MAX,
        3_000,
    ),
    scenario(
        "acquire+release, 64 tasks",
        Op::AcquireRelease,
        64,
        u64::MAX,
        3_000,
    ),
    scenario("one key, 8 tasks", Op::Contended, 8, u64::MAX, 3_000),
    scenario(
        "one key, 8 tasks waiting",
        Op::ContendedWait,
        8,
        u64::MAX,
        3_000,
    ),
];

const FAULTY: [Scenario; 3] = [
    scenario(
        "acquire+release, 1 task",
        Op::AcquireRelease,
        1,
        1_500,
        3_000,
    ),
    scenario(
        "acquire+release, 16 tasks",
        Op::AcquireRelease,
        16,
        u64::MAX,
        2_000,
    ),
    scenario(
        "one key, 8 tasks waiting",
        Op::ContendedWait,
        8,
        u64::MAX,
        2_000,
    ),
];

struct Args {
    quick: bool,
    /// Phases to run (ids as in `Phase::id`); empty: all.
    phases: Vec<String>,
    /// Fixed operation count per worker and a budget long enough for it (profiling).
    ops: Option<u64>,
    /// A new lock name for every operation, in every scenario.
    fresh_keys: bool,
    impls: Vec<String>,
    /// tokio flavours every tokio client runs on.
    runtimes: Vec<Rt>,
    scenarios: Vec<String>,
    doc: Option<std::path::PathBuf>,
}

fn args() -> Args {
    let mut a = Args {
        quick: false,
        phases: Vec::new(),
        ops: None,
        fresh_keys: false,
        impls: IMPLS.iter().map(|s| (*s).to_owned()).collect(),
        runtimes: vec![Rt::Mt, Rt::Ct],
        scenarios: Vec::new(),
        doc: Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks.md"),
        ),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        // Scenario names contain commas: lists are separated by ';'.
        let list = |v: Option<String>| -> Vec<String> {
            v.unwrap_or_default()
                .split(';')
                .map(str::to_owned)
                .collect()
        };
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--phases" => a.phases = list(it.next()),
            "--fresh-keys" => a.fresh_keys = true,
            "--ops" => a.ops = it.next().and_then(|n| n.parse().ok()),
            "--impls" => a.impls = list(it.next()),
            "--runtimes" => {
                a.runtimes = list(it.next())
                    .iter()
                    .map(|r| match r.as_str() {
                        "mt" => Rt::Mt,
                        "ct" => Rt::Ct,
                        other => panic!("unknown runtime {other}: mt or ct"),
                    })
                    .collect();
            }
            "--scenarios" => a.scenarios = list(it.next()),
            "--no-doc" => a.doc = None,
            "--out" => a.doc = it.next().map(Into::into),
            other => {
                panic!("unknown argument {other}; see the header of tools/compare/src/main.rs")
            }
        }
    }
    a
}

/// One implementation on one runtime.
struct Entry {
    name: String,
    rt: Rt,
    client: Arc<Client>,
}

struct Runner {
    mt: Runtime,
    ct: Runtime,
    args: Args,
    clients: Vec<Entry>,
    stragglers: Vec<JoinHandle<()>>,
    rows: Vec<Row>,
    /// The redis-server processes (their CPU time is charged to each run).
    servers: Vec<u32>,
    /// A plain connection to each node for `INFO commandstats`.
    stats: Vec<Option<redis::Connection>>,
    /// Nodes paused or killed in the current phase (not asked for their counts).
    down: Vec<usize>,
}

/// Commands a node has run since it started (`INFO commandstats`), `INFO` itself left out.
fn node_commands(conn: &mut redis::Connection) -> Option<u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).ok()?;
    let mut total = 0;
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if name == "info" {
            continue;
        }
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse::<u64>().ok())?;
        total += calls;
    }
    Some(total)
}

impl Runner {
    /// Commands run by the nodes that are up, summed; `None` when one did not answer.
    fn commands(&mut self) -> Option<u64> {
        let mut total = 0;
        for (i, conn) in self.stats.iter_mut().enumerate() {
            if self.down.contains(&i) {
                continue;
            }
            total += node_commands(conn.as_mut()?)?;
        }
        Some(total)
    }

    fn wanted(&self, s: &Scenario) -> bool {
        self.args.scenarios.is_empty() || self.args.scenarios.iter().any(|w| s.name.contains(w))
    }

    /// Runs one scenario for every implementation that takes part, in interleaved slices.
    fn scenario(&mut self, phase: Phase, s: Scenario) {
        if !self.wanted(&s) {
            return;
        }
        let scale = if self.args.quick { 4 } else { 1 };
        let mut rows: Vec<Row> = Vec::new();
        for Entry { name, rt, client } in &self.clients {
            let skip = if (name.starts_with("floor+")
                && (phase != Phase::Healthy || s.op == Op::Extend))
                || (s.op == Op::ContendedWait && name != "floor" && name != "quorumlock")
                || (s.op == Op::Extend && client.node().is_some() && phase != Phase::Healthy)
            {
                Some(None)
            } else if s.op == Op::Extend && !client.can_extend() {
                Some(Some("no extend API".to_owned()))
            } else {
                self.rows
                    .iter()
                    .find(|r| r.phase == phase && &r.imp == name && r.rt == *rt && r.hung > 0)
                    .map(|r| Some(format!("not run: hung in \"{}\"", r.scenario)))
            };
            match skip {
                Some(None) => {}
                Some(Some(note)) => self.rows.push(Row::skipped(phase, s.name, name, *rt, note)),
                None => rows.push(Row::new(phase, s.name, name, *rt, s.tasks)),
            }
        }
        for slice in 0..SLICES {
            for row in rows.iter_mut().filter(|r| r.hung == 0) {
                let client = Arc::clone(
                    &self
                        .clients
                        .iter()
                        .find(|e| e.name == row.imp && e.rt == row.rt)
                        .expect("client")
                        .client,
                );
                let mut max_ops = (s.max_ops / u64::from(SLICES) / scale).max(1);
                if client.blocking() {
                    max_ops = max_ops.min(REDLOCK_OPS_PER_SLICE / s.tasks as u64).max(1);
                }
                let mut budget = s.budget / SLICES / scale as u32;
                if let Some(ops) = self.args.ops {
                    (max_ops, budget) = (ops, Duration::from_secs(3600));
                }
                let spec = Spec {
                    op: s.op,
                    tasks: s.tasks,
                    max_ops,
                    budget,
                    // Acquire-only leaves its locks to expire: a new name every time there.
                    names: (s.op != Op::Acquire && !self.args.fresh_keys)
                        .then_some(NAMES_PER_WORKER),
                    prefix: if s.op == Op::Acquire || self.args.fresh_keys {
                        format!(
                            "{}:{}:{}:{}:{slice}:{}",
                            row.imp,
                            row.rt.id(),
                            phase.id(),
                            s.name,
                            rand::random::<u32>()
                        )
                    } else {
                        format!("{}:{}:{}:{}", row.imp, row.rt.id(), phase.id(), s.name)
                    },
                };
                let before = self.commands();
                let rt = if row.rt == Rt::Ct { &self.ct } else { &self.mt };
                let out = workload::run(rt, &client, &spec, &self.servers, &mut self.stragglers);
                let after = self.commands();
                row.add(out, after.zip(before).map(|(a, b)| a.saturating_sub(b)));
            }
        }
        for row in &rows {
            eprintln!("{}", row.progress());
        }
        self.rows.extend(rows);
    }

    fn phase(&mut self, phase: Phase, scenarios: &[Scenario]) {
        eprintln!("== {}", phase.label());
        for s in scenarios {
            self.scenario(phase, *s);
        }
    }

    /// A few acquire+release rounds per client: connections up, scripts loaded.
    fn warm_up(&mut self) {
        for Entry { name, rt, client } in &self.clients {
            let spec = Spec {
                op: Op::AcquireRelease,
                tasks: 1,
                max_ops: 100,
                budget: Duration::from_secs(5),
                prefix: format!("{name}:warm-up:{}", rand::random::<u32>()),
                names: None,
            };
            let on = if *rt == Rt::Ct { &self.ct } else { &self.mt };
            let out = workload::run(on, client, &spec, &self.servers, &mut self.stragglers);
            let ok: u64 = out.workers.iter().map(|w| w.ok).sum();
            assert!(
                ok > 0,
                "{name} ({}) cannot acquire on a healthy cluster: {:?}",
                rt.id(),
                out.workers
            );
        }
    }

    /// Brings the cluster from one fault state to the next: node 0 paused, nodes 0 and 1
    /// paused, node 0 killed (after the paused ones resume and the clients are warm again).
    fn enter(&mut self, cluster: &mut LocalCluster, from: Phase, to: Phase) {
        let paused = |p: Phase| match p {
            Phase::Paused1 => vec![0],
            Phase::Paused2 => vec![0, 1],
            Phase::Healthy | Phase::Killed1 => vec![],
        };
        let (was, will) = (paused(from), paused(to));
        for i in will.iter().filter(|i| !was.contains(i)) {
            cluster.pause(*i).expect("pause a node");
        }
        let resumed: Vec<_> = was.iter().filter(|i| !will.contains(i)).collect();
        for i in &resumed {
            cluster.resume(**i).expect("resume a node");
        }
        if !resumed.is_empty() {
            self.join_stragglers(Duration::from_secs(20));
            self.warm_up();
        }
        if to == Phase::Killed1 {
            cluster.kill(0).expect("kill node 0");
        }
        self.down = match to {
            Phase::Healthy => vec![],
            Phase::Paused1 | Phase::Killed1 => vec![0],
            Phase::Paused2 => vec![0, 1],
        };
    }

    /// Waits for blocked threads (released by a resume) for up to `within`.
    fn join_stragglers(&mut self, within: Duration) {
        let until = Instant::now() + within;
        while self.stragglers.iter().any(|h| !h.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let (done, stuck): (Vec<_>, Vec<_>) =
            self.stragglers.drain(..).partition(|h| h.is_finished());
        for h in done {
            let _ = h.join();
        }
        if !stuck.is_empty() {
            eprintln!(
                "{} blocked worker threads did not finish; left detached",
                stuck.len()
            );
        }
    }
}

fn main() {
    let args = args();
    let mt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let started = Instant::now();
    let machine = report::Machine::read();
    let mut cluster = LocalCluster::start(5).unwrap_or_else(|e| panic!("{e}"));
    let urls = cluster.urls();
    let mut clients = Vec::new();
    for name in &args.impls {
        // Connections are made on the runtime that will drive them (redis-rs spawns each
        // multiplexed connection's driver task on the runtime it is created on).
        let own = name == "redlock" || name == "node-redlock";
        let rts = if own {
            vec![Rt::Own]
        } else {
            args.runtimes.clone()
        };
        for rt in rts {
            let on = if rt == Rt::Ct { &ct } else { &mt };
            let client = Arc::new(on.block_on(Client::connect(name, &urls)));
            clients.push(Entry {
                name: name.clone(),
                rt,
                client,
            });
        }
    }
    let stats = urls
        .iter()
        .map(|u| {
            let c = redis::Client::open(u.as_str()).ok()?;
            let conn = c.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
            conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            Some(conn)
        })
        .collect();
    let mut r = Runner {
        mt,
        ct,
        args,
        clients,
        stragglers: Vec::new(),
        rows: Vec::new(),
        servers: (0..cluster.len())
            .filter_map(|i| cluster.get(i).and_then(|s| s.pid()))
            .collect(),
        stats,
        down: Vec::new(),
    };
    r.warm_up();
    let mut state = Phase::Healthy;
    for (phase, scenarios) in [
        (Phase::Healthy, &HEALTHY[..]),
        (Phase::Paused1, &FAULTY[..]),
        (Phase::Paused2, &FAULTY[..]),
        (Phase::Killed1, &FAULTY[..]),
    ] {
        if !r.args.phases.is_empty() && !r.args.phases.iter().any(|p| p == phase.id()) {
            continue;
        }
        r.enter(&mut cluster, state, phase);
        state = phase;
        r.phase(phase, scenarios);
    }
    r.join_stragglers(Duration::from_secs(5));

    let report = report::render(&r.rows, &machine, started.elapsed(), r.args.quick);
    println!("{}", report.table);
    println!("{}", report.summary);
    if let Some(path) = &r.args.doc {
        report::write_doc(path, &report)
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        // The two plots beside the table (`docs/img/`), linked from the README.
        let img = path.parent().unwrap_or(Path::new(".")).join("img");
        match plot::write(&r.rows, &img) {
            Ok(files) => files.iter().for_each(|f| eprintln!("wrote {f}")),
            Err(e) => eprintln!("plots not written to {}: {e}", img.display()),
        }
    }
    drop(cluster);
}
