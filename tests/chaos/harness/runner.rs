//! One chaos run: a cluster, a proxy per (client, node), clients using the lock, a nemesis
//! following a seeded schedule, then the checker's verdict.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::RestartGuard;
use quorumlock::testkit::{LocalCluster, RedisServer, ServerOptions};
use tokio_util::sync::CancellationToken;

use crate::checker::{Report, check};
use crate::child::{ChildClient, ChildSpec};
use crate::history::{History, Mono, Recorder, Section, SessionId};
use crate::nemesis::{self, Env, FaultKind};
use crate::proxy::ProxyNet;
use crate::resource::Resource;
use crate::workload::{CONNECT_TIMEOUT, ClientSpec, LIVENESS_SLACK, run_client};

/// The ttl every chaos client uses.
pub const TTL: Duration = Duration::from_secs(1);

/// Replays a seed: `QUORUMLOCK_CHAOS_SEED=<seed>`.
pub const SEED_ENV: &str = "QUORUMLOCK_CHAOS_SEED";

/// The seed to use: `QUORUMLOCK_CHAOS_SEED` when set, else the test's fixed seed.
pub fn seed(fixed: u64) -> u64 {
    std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(fixed)
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub nodes: usize,
    /// In-process clients (each behind its own proxies).
    pub clients: usize,
    pub ttl: Duration,
    pub guard: RestartGuard,
    pub aof: bool,
    pub faults: &'static [FaultKind],
    /// One more client in a child process (needed by `PauseClient`).
    pub child: bool,
    /// The lock must be acquired again this soon after every heal.
    pub reacquire_bound: Duration,
}

impl Scenario {
    /// Whether tokens can go backwards here: nodes are killed and restarted without persistence,
    /// and either the restart guard is off (nothing restores their fencing counters) or a
    /// majority restarts at once (the guard restores a wiped majority's counters from the
    /// minority that kept them, best effort: a token that lived only on the wiped nodes is
    /// gone, see `src/repair.rs`). The random cases tolerate token regressions then, and print
    /// them.
    pub fn loses_counters(&self) -> bool {
        let kills = |k: &FaultKind| {
            matches!(
                k,
                FaultKind::KillMinority | FaultKind::KillMinorityDelayed | FaultKind::KillMajority
            )
        };
        !self.aof
            && ((self.guard == RestartGuard::Off && self.faults.iter().any(kills))
                || self.faults.contains(&FaultKind::KillMajority))
    }

    /// Five nodes, three clients, the default restart guard, no persistence. The liveness bound
    /// is `3 x ttl + connect timeout + slack`: a stale key can live a ttl, a restarted node can
    /// be held out a ttl, and a reconnect can take a connect timeout.
    pub fn new(name: &'static str, faults: &'static [FaultKind]) -> Scenario {
        Scenario {
            name,
            nodes: 5,
            clients: 3,
            ttl: TTL,
            guard: RestartGuard::default(),
            aof: false,
            faults,
            child: faults.contains(&FaultKind::PauseClient),
            reacquire_bound: TTL * 3 + CONNECT_TIMEOUT + LIVENESS_SLACK,
        }
    }

    pub fn guard(mut self, guard: RestartGuard) -> Scenario {
        self.guard = guard;
        self
    }

    pub fn aof(mut self) -> Scenario {
        self.aof = true;
        self
    }
}

/// A finished run.
#[derive(Debug)]
pub struct Outcome {
    pub name: &'static str,
    pub seed: u64,
    pub schedule: Vec<String>,
    pub history: History,
    pub report: Report,
    pub reacquire_bound: Duration,
    /// Token regressions are expected here (see [`Scenario::loses_counters`]).
    pub loses_counters: bool,
    pub elapsed: Duration,
}

/// Runs `scn` with the schedule drawn from `seed` for about `duration` (plus a quiet period in
/// which the lock must be acquired again).
pub async fn run(scn: &Scenario, seed: u64, duration: Duration) -> Outcome {
    println!(
        "[chaos {}] seed {seed} (replay: {SEED_ENV}={seed})",
        scn.name
    );
    let began = Mono::now();
    let (cluster, resource_server) = start_servers(scn).await;
    let urls = cluster.urls();
    let net = ProxyNet::start(scn.clients, &urls).await.expect("proxies");
    let rec = Recorder::new();
    let stop = CancellationToken::new();
    let resource = match &resource_server {
        Some(server) => Resource::redis(&server.url()).await,
        None => Resource::gate(),
    };

    let mut clients = Vec::new();
    for c in 0..scn.clients {
        clients.push(tokio::spawn(run_client(
            client_spec(scn, seed, c, net.urls(c)),
            resource.clone(),
            rec.clone(),
            stop.clone(),
        )));
    }
    let child = resource_server
        .as_ref()
        .map(|server| spawn_child(scn, seed, server, &urls, &rec));
    let mut env = Env {
        cluster: Arc::new(Mutex::new(cluster)),
        urls: urls.clone(),
        net,
        child,
        aof: scn.aof,
        guard_holds_out: scn.guard != RestartGuard::Off,
        ttl: scn.ttl,
        held_out_until: Mono::default(),
    };

    let warm_up = scn.reacquire_bound * 2;
    if !wait_for_acquisition(&rec, began, warm_up).await {
        panic!(
            "[chaos {}] seed {seed}: the cluster never warmed up: no acquisition within {warm_up:?} \
             of the start, before any fault",
            scn.name
        );
    }
    let schedule = follow_the_schedule(scn, seed, duration, &mut env, &rec).await;

    // Stop: each client finishes its section and releases. One that does not within the bound
    // is aborted (its open section is closed at the abort) and the run fails.
    stop.cancel();
    stop_clients(clients, &rec).await;
    if let Some(child) = env.child.take() {
        child.stop(SHUTDOWN).await;
    }
    let history = rec.snapshot();
    let report = check(&history, scn.reacquire_bound);
    println!("{}", summary(scn.name, &history, &report));
    Outcome {
        name: scn.name,
        seed,
        schedule,
        history,
        report,
        reacquire_bound: scn.reacquire_bound,
        loses_counters: scn.loses_counters(),
        elapsed: Mono::now().since(began),
    }
}

/// The scenario's cluster (with AOF when it says so) and, when it runs a child client, the
/// resource's server.
async fn start_servers(scn: &Scenario) -> (LocalCluster, Option<RedisServer>) {
    let options = if scn.aof {
        ServerOptions::new().aof_always()
    } else {
        ServerOptions::new()
    };
    let (nodes, child) = (scn.nodes, scn.child);
    tokio::task::spawn_blocking(move || {
        crate::support::init_tracing();
        let cluster = LocalCluster::start_with(nodes, &options).unwrap_or_else(|e| panic!("{e}"));
        let resource =
            child.then(|| RedisServer::start(&ServerOptions::new()).expect("resource redis"));
        (cluster, resource)
    })
    .await
    .expect("start servers")
}

/// Client `c`'s spec: the scenario's ttl and guard, a seed of its own drawn from `seed`.
fn client_spec(scn: &Scenario, seed: u64, c: usize, urls: Vec<String>) -> ClientSpec {
    let mut s = ClientSpec::new(
        c,
        urls,
        scn.ttl,
        seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9),
    );
    s.guard = scn.guard;
    s
}

/// The child client (the number after the in-process ones), straight to the nodes, writing to
/// the resource `server`.
fn spawn_child(
    scn: &Scenario,
    seed: u64,
    server: &RedisServer,
    urls: &[String],
    rec: &Recorder,
) -> ChildClient {
    let mut client = client_spec(scn, seed, scn.clients, urls.to_vec());
    // Mostly "working" between its validity check and its write while it holds the lock,
    // so that a random SIGSTOP often lands there.
    client.work = Duration::from_millis(400);
    client.writes = 1..=3;
    ChildClient::spawn(
        &ChildSpec {
            client,
            resource_url: server.url(),
            first_session: 1_000_000_000,
        },
        rec.clone(),
    )
}

/// Draws the schedule from `seed` and injects its faults one after the other; returns it as
/// text for the report.
async fn follow_the_schedule(
    scn: &Scenario,
    seed: u64,
    duration: Duration,
    env: &mut Env,
    rec: &Recorder,
) -> Vec<String> {
    let plan = crate::draw::schedule(seed, scn.faults, duration, scn.nodes, scn.clients, scn.ttl);
    let schedule: Vec<String> = plan
        .iter()
        .map(|(gap, f)| format!("after {gap:?}: {f}"))
        .collect();
    if plan.is_empty() {
        tokio::time::sleep(duration).await;
    }
    for (gap, fault) in &plan {
        tokio::time::sleep(*gap).await;
        let healed = nemesis::inject(env, fault, rec).await;
        // Liveness after every heal: the next fault waits until the lock was acquired again, or
        // the bound passed (the checker then reports a slow recovery: the window is that long).
        if !wait_for_acquisition(rec, healed, scn.reacquire_bound).await {
            println!(
                "[chaos {}] no acquisition within {:?} of the heal of: {fault}",
                scn.name, scn.reacquire_bound
            );
        }
    }
    schedule
}

/// Waits for every client task until [`SHUTDOWN`] from now; one that fails or does not stop
/// (then aborted) is an incident.
async fn stop_clients(clients: Vec<tokio::task::JoinHandle<()>>, rec: &Recorder) {
    let stop_by = tokio::time::Instant::now() + SHUTDOWN;
    for (c, mut task) in clients.into_iter().enumerate() {
        match tokio::time::timeout_at(stop_by, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => rec.incident(format!("client {c} failed: {e}")),
            Err(_) => {
                task.abort();
                let _ = task.await;
                rec.incident(format!(
                    "client {c} did not stop within {SHUTDOWN:?} of the end: aborted"
                ));
            }
        }
    }
}

/// How long the clients (and the child) get to finish their section and stop.
const SHUTDOWN: Duration = Duration::from_secs(15);

/// One line: what happened in a run.
fn summary(name: &str, h: &History, r: &Report) -> String {
    let count = |o: &str| h.ops.iter().filter(|op| op.outcome == o).count();
    format!(
        "[chaos {name}] {} faults, {} ops ({} held, {} no quorum, {} expired, {} lost), {} sections, \
         {} writes ({} stale), {} violations, worst gap {:?}, worst heal-to-acquire {:?}, \
         {} of {} faults judged for availability during them ({} starved, {} only contended), \
         clock jumps {}/{} fired, {} harness problems",
        h.faults.len(),
        r.ops,
        count("held"),
        count("no_quorum"),
        count("expired"),
        count("lost"),
        r.sections,
        r.writes,
        r.stale_rejected,
        r.violations(),
        r.worst_gap,
        r.worst_reacquire(),
        r.judged.len(),
        h.faults.len(),
        r.starved.len(),
        r.contended.len(),
        r.jumps_fired,
        r.clock_jumps,
        r.harness_trouble(),
    )
}

/// Waits (bounded) until some client records an acquisition at or after `since`; whether one
/// came within `within`.
async fn wait_for_acquisition(rec: &Recorder, since: Mono, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        while rec.acquired_since(since) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

impl Outcome {
    /// Violations other than the token regressions expected where counters are lost.
    pub fn unexpected_violations(&self) -> usize {
        let known = if self.loses_counters {
            self.report.token_regressions.len()
        } else {
            0
        };
        self.report.violations() - known
    }

    /// Panics, with everything needed to replay, unless the run had no violation at all (token
    /// regressions excepted where counters can be lost, and reported).
    pub fn assert_safe(&self) {
        let r = &self.report;
        if self.loses_counters && !r.token_regressions.is_empty() {
            println!(
                "EXPECTED: {} token regressions after empty restarts with the restart guard off\n{}",
                r.token_regressions.len(),
                self.explain()
            );
        }
        assert!(
            self.unexpected_violations() == 0,
            "expected no violation\n{}",
            self.explain()
        );
    }

    /// Panics unless every violation was made harmless by fencing: overlaps and late writes are
    /// allowed, but tokens must grow, no write that fencing should have refused got through,
    /// nothing hung, the lock stayed available through minority faults and came back after
    /// every heal, and the harness had no trouble.
    pub fn assert_caught(&self) {
        let r = &self.report;
        assert!(
            r.uncaught.is_empty()
                && r.token_regressions.is_empty()
                && r.hung.is_empty()
                && r.slow_recoveries.is_empty()
                && r.starved.is_empty()
                && r.misreported_held.is_empty()
                && r.harness_trouble() == 0,
            "expected every violation to be caught by fencing\n{}",
            self.explain()
        );
    }

    /// Panics unless every fault of the schedule was injected and the lock was acquired again
    /// within the bound after each heal; prints the worst heal-to-acquire time.
    pub fn assert_recovered(&self) {
        let r = &self.report;
        assert_eq!(
            self.history.faults.len(),
            self.schedule.len(),
            "not every fault was injected\n{}",
            self.explain()
        );
        let late: Vec<usize> = (0..r.reacquired.len())
            .filter(|&i| r.reacquired[i].is_none_or(|d| d > self.reacquire_bound))
            .collect();
        assert!(
            late.is_empty(),
            "faults {late:?} were not followed by an acquisition within {:?}\n{}",
            self.reacquire_bound,
            self.explain()
        );
        println!(
            "[chaos {}] worst heal-to-acquire {:?} over {} faults (bound {:?})",
            self.name,
            r.worst_reacquire(),
            r.reacquired.len(),
            self.reacquire_bound
        );
    }

    /// Panics unless the clients really used the lock (so "no violation" means something).
    pub fn assert_busy(&self, sections: usize) {
        assert!(
            self.report.sections >= sections && self.report.writes >= sections,
            "too little traffic: {} sections, {} writes (wanted {sections})\n{}",
            self.report.sections,
            self.report.writes,
            self.explain()
        );
    }

    /// Every fault, section and operation that touches `from..to`, in ms from `from`: what
    /// led to a violation.
    fn timeline(&self, s: &mut String, from: Mono, to: Mono) {
        let at = |m: Mono| (i128::from(m.0) - i128::from(from.0)) / 1_000_000;
        let _ = writeln!(s, "      timeline (ms):");
        for f in self
            .history
            .faults
            .iter()
            .filter(|f| f.start <= to && f.healed >= from)
        {
            let _ = writeln!(
                s,
                "        {}..{} fault: {}",
                at(f.start),
                at(f.healed),
                f.what
            );
        }
        for x in self
            .history
            .sections
            .iter()
            .filter(|x| x.acquired <= to && x.end() >= from)
        {
            let _ = writeln!(
                s,
                "        {}..{} section {} client {} token {}",
                at(x.acquired),
                at(x.end()),
                x.session,
                x.client,
                x.token
            );
        }
        for op in self
            .history
            .ops
            .iter()
            .filter(|op| op.start <= to && op.end >= from)
        {
            let _ = writeln!(
                s,
                "        {}..{} client {} {:?}: {}",
                at(op.start),
                at(op.end),
                op.client,
                op.kind,
                op.outcome
            );
        }
    }

    /// The seed, the schedule and the report, for a failure message.
    pub fn explain(&self) -> String {
        let r = &self.report;
        let mut s = format!(
            "[chaos {}] seed {} (replay: {SEED_ENV}={})\nschedule:\n",
            self.name, self.seed, self.seed
        );
        for line in &self.schedule {
            let _ = writeln!(s, "  {line}");
        }
        let _ = writeln!(
            s,
            "sections {}, writes {}, ops {}, stale rejected {} ({} from violating sessions)",
            r.sections, r.writes, r.ops, r.stale_rejected, r.caught
        );
        self.explain_safety(&mut s);
        self.explain_liveness(&mut s);
        self.explain_harness(&mut s);
        self.explain_faults(&mut s);
        s
    }

    /// The critical section of session `id`, if it was recorded.
    fn section(&self, id: SessionId) -> Option<&Section> {
        self.history.sections.iter().find(|x| x.session == id)
    }

    /// Overlapping sections (with the timeline around them), tokens that did not grow, and
    /// writes past a section's validity.
    fn explain_safety(&self, s: &mut String) {
        let r = &self.report;
        for &(a, b) in &r.overlaps {
            let (first, second) = (self.section(a), self.section(b));
            let _ = writeln!(s, "  OVERLAP {first:?}\n      and {second:?}");
            if let (Some(first), Some(second)) = (first, second) {
                self.timeline(
                    s,
                    first.acquired.minus(Duration::from_secs(2)),
                    second.end(),
                );
            }
        }
        for &(a, b) in &r.token_regressions {
            let _ = writeln!(
                s,
                "  TOKEN DID NOT GROW {:?}\n      then {:?}",
                self.section(a),
                self.section(b)
            );
        }
        for &i in &r.past_validity {
            let w = &self.history.writes[i];
            let _ = writeln!(
                s,
                "  WRITE PAST VALIDITY {w:?} of {:?}",
                self.section(w.session)
            );
        }
    }

    /// Hung operations, stale writes fencing did not catch, slow recoveries, starvation (with
    /// the timeline of the fault) and `held` answers that should have been outages.
    fn explain_liveness(&self, s: &mut String) {
        let r = &self.report;
        for &i in &r.hung {
            let _ = writeln!(s, "  HUNG {:?}", self.history.ops[i]);
        }
        for u in &r.uncaught {
            let _ = writeln!(s, "  UNCAUGHT BY FENCING {u:?}");
        }
        for &i in &r.slow_recoveries {
            let f = &self.history.faults[i];
            let _ = writeln!(
                s,
                "  SLOW RECOVERY after {:?}: {:?} (bound {:?})",
                f.what, r.reacquired[i], self.reacquire_bound
            );
        }
        for &i in &r.starved {
            let f = &self.history.faults[i];
            let _ = writeln!(
                s,
                "  STARVED: no acquisition during {:?} ({:?} long, a majority stayed reachable)",
                f.what,
                f.healed.since(f.start)
            );
            // What the clients did meanwhile (times from the fault's start).
            self.timeline(s, f.start, f.healed);
        }
        for &i in &r.misreported_held {
            let op = &self.history.ops[i];
            let _ = writeln!(
                s,
                "  MISREPORTED HELD: client {} was told `held` by an acquisition of {:?} while \
                 the refusals alone could not rule out a quorum (an outage)",
                op.client,
                op.end.since(op.start)
            );
        }
    }

    /// What the harness itself saw go wrong: malformed child lines, unfinished writes,
    /// incidents.
    fn explain_harness(&self, s: &mut String) {
        for line in &self.history.malformed {
            let _ = writeln!(s, "  MALFORMED CHILD LINE {line:?}");
        }
        for w in &self.history.unfinished_writes {
            let _ = writeln!(s, "  UNFINISHED WRITE {w:?}");
        }
        for what in &self.history.incidents {
            let _ = writeln!(s, "  INCIDENT {what}");
        }
    }

    /// The clock jumps, then every fault with its length, acquisitions during it and its
    /// heal-to-acquire time.
    fn explain_faults(&self, s: &mut String) {
        let r = &self.report;
        let _ = writeln!(
            s,
            "clock jumps: {} made, {} expired a bare-majority holder's key",
            r.clock_jumps, r.jumps_fired
        );
        for (i, f) in self.history.faults.iter().enumerate() {
            let _ = writeln!(
                s,
                "  fault {i}: {} | {:?} long, {} acquisitions during{}, heal-to-acquire {:?}",
                f.what,
                f.healed.since(f.start),
                r.during[i],
                match f.available_after {
                    Some(d) => format!(" (must be available after {d:?})"),
                    None => String::new(),
                },
                r.reacquired[i]
            );
        }
    }
}

/// The summary table's header.
pub fn table_header() -> String {
    "| fault | expected | runs | faults injected | operations | acquisitions | overlaps | token regressions | writes past validity | hung ops | slow recoveries | starved faults | uncaught by fencing | stale writes rejected (from violators) | clock jumps fired / made | worst unavailability | worst heal-to-acquire |\n\
     | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        .to_owned()
}

/// One row of the summary table, for several runs of one fault.
pub fn table_row(name: &str, expected: &str, runs: &[Outcome]) -> String {
    let sum = |f: &dyn Fn(&Report) -> usize| runs.iter().map(|o| f(&o.report)).sum::<usize>();
    let faults: usize = runs.iter().map(|o| o.history.faults.len()).sum();
    let worst_gap = runs
        .iter()
        .map(|o| o.report.worst_gap)
        .max()
        .unwrap_or_default();
    let worst_reacquire = runs
        .iter()
        .filter_map(|o| o.report.worst_reacquire())
        .max()
        .map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
    let jumps = match sum(&|r| r.clock_jumps) {
        0 => "-".to_owned(),
        made => format!("{} / {made}", sum(&|r| r.jumps_fired)),
    };
    format!(
        "| {name} | {expected} | {} | {faults} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {jumps} | {:.2} s | {worst_reacquire} |",
        runs.len(),
        sum(&|r| r.ops),
        sum(&|r| r.sections),
        sum(&|r| r.overlaps.len()),
        sum(&|r| r.token_regressions.len()),
        sum(&|r| r.past_validity.len()),
        sum(&|r| r.hung.len()),
        sum(&|r| r.slow_recoveries.len()),
        sum(&|r| r.starved.len()),
        sum(&|r| r.uncaught.len()),
        sum(&|r| r.stale_rejected),
        sum(&|r| r.caught),
        worst_gap.as_secs_f64(),
    )
}

/// How long each random case of the short profile lets the nemesis work.
pub const SHORT: Duration = Duration::from_secs(5);

/// A short-profile case for a fault the lock must survive: runs `scn` for `duration` with the
/// test's fixed seed (or `QUORUMLOCK_CHAOS_SEED`), and asserts that the clients were busy, that
/// the checker found no violation (no starved minority fault, no slow recovery included), and
/// that the lock came back within the bound after every heal.
pub async fn expect_safe(scn: Scenario, fixed_seed: u64, duration: Duration) -> Outcome {
    let out = run(&scn, seed(fixed_seed), duration).await;
    out.assert_busy(10);
    out.assert_safe();
    out.assert_recovered();
    out
}
