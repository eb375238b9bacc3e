//! Scheduled ticks against real servers: ticks that know when they began keep running on
//! long-lived instances after nodes restart empty, and never run twice; a crashed instance's
//! tick is caught up by another, and a catch-up never makes the current tick skip.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::support::*;
use quorumlock::testkit::LocalCluster;
use quorumlock::{CancellationToken, Outcome, RunOnce, Schedule, Tick};

/// Who ran each tick, across instances.
type Runs = Arc<Mutex<HashMap<String, Vec<String>>>>;

/// A long-lived instance of job `job`: warm (it has met every node), lock ttl and restart
/// hold-out of `ttl`, the default marker expiry (1 h).
async fn long_lived(cluster: &LocalCluster, job: &str, id: &str, ttl: Duration) -> RunOnce {
    let locks = builder(cluster).max_ttl(ttl).build().expect("valid config");
    warm(&locks).await;
    RunOnce::builder(locks, job)
        .ttl(ttl)
        .clock_skew(Duration::from_millis(50))
        .instance(id)
        .build()
        .expect("valid job")
}

/// Every instance calls for `tick` at once; returns their outcomes.
async fn round(instances: &[RunOnce], tick: &Tick, runs: &Runs) -> Vec<Outcome<()>> {
    let calls = instances.iter().map(|job| {
        let runs = Arc::clone(runs);
        let tick = tick.clone();
        async move {
            let name = tick.name().to_owned();
            job.run(tick, |ctx| async move {
                let by = ctx.token().to_string();
                runs.lock().unwrap().entry(name).or_default().push(by);
            })
            .await
            .expect("run")
        }
    });
    futures::future::join_all(calls).await
}

/// New ticks, each starting when it is called for, until one runs (bounded by [`WAIT`]);
/// returns the last tick's outcomes.
async fn until_a_tick_runs(
    instances: &[RunOnce],
    next: &mut u64,
    runs: &Runs,
    what: &str,
) -> Vec<Outcome<()>> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let tick = Tick::starting(*next, SystemTime::now());
        *next += 1;
        let outcomes = round(instances, &tick, runs).await;
        if outcomes.iter().any(Outcome::ran) {
            return outcomes;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tick ran within {WAIT:?} after {what}: {outcomes:?}"
        );
        // The next tick of a fast schedule.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three long-lived instances; nodes 0 and 1 restart empty, then nodes 2, 3 and 4. Ticks that
/// began after the losses were seen run again at once (not after the marker's 1 h expiry),
/// each once; the tick that ran before the restarts, whose marker the restarts erased, does
/// not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t100_ticks_keep_running_on_long_lived_instances_after_restarts() {
    let mut cluster = cluster(5);
    let ttl = Duration::from_secs(1);
    let mut instances = Vec::new();
    for id in ["a", "b", "c"] {
        instances.push(long_lived(&cluster, "s100", id, ttl).await);
    }
    let runs = Runs::default();
    let first = Tick::starting(0, SystemTime::now());
    let outcomes = round(&instances, &first, &runs).await;
    assert_eq!(
        outcomes.iter().filter(|o| o.ran()).count(),
        1,
        "{outcomes:?}"
    );

    let mut next = 1;
    for i in [0, 1] {
        cluster.restart_empty(i).unwrap();
    }
    until_a_tick_runs(
        &instances,
        &mut next,
        &runs,
        "nodes 0 and 1 restarted empty",
    )
    .await;
    for i in [2, 3, 4] {
        cluster.restart_empty(i).unwrap();
    }
    until_a_tick_runs(&instances, &mut next, &runs, "every node restarted empty").await;
    // From then on every tick runs, once.
    for _ in 0..3 {
        let tick = Tick::starting(next, SystemTime::now());
        next += 1;
        let outcomes = round(&instances, &tick, &runs).await;
        assert_eq!(
            outcomes.iter().filter(|o| o.ran()).count(),
            1,
            "tick {tick} after the restarts: {outcomes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The first tick's marker is gone from every node, but it began before the losses.
    let again = round(&instances, &first, &runs).await;
    assert!(
        !again.iter().any(Outcome::ran),
        "tick 0 ran twice: {again:?}"
    );
    let runs = runs.lock().unwrap();
    for (tick, by) in runs.iter() {
        assert_eq!(by.len(), 1, "tick {tick} ran more than once: {by:?}");
    }
}

const CHILD_ENV: &str = "QUORUMLOCK_TEST_SCHEDULER_CHILD";
/// The period of the crash tests: the default lock ttl on it is 1 s (a third).
const PERIOD: Duration = Duration::from_secs(3);

/// Not a test by itself: the scheduler instance of `t101`, which starts this test binary with
/// the job in the environment and kills it while its job runs. Without the variable it returns
/// at once.
#[tokio::test]
async fn zz_child_scheduler_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, ';');
    let (job, mode, urls) = (
        parts.next().expect("job"),
        parts.next().expect("mode"),
        parts.next().expect("urls"),
    );
    let locks = quorumlock::Redlock::builder(urls.split(','))
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let once = RunOnce::builder(locks, job)
        .instance("child")
        .build()
        .unwrap();
    let schedule = Schedule::every(PERIOD).unwrap();
    let stop = CancellationToken::new();
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let on_term = stop.clone();
    tokio::spawn(async move {
        term.recv().await;
        on_term.cancel();
    });
    let hang = mode == "hang";
    once.run_every(schedule, stop, |ctx| async move {
        println!("RUNNING {}", ctx.tick());
        if hang {
            // Killed long before this ends.
            tokio::time::sleep(Duration::from_secs(60)).await;
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!("DONE {}", ctx.tick());
        }
    })
    .await
    .unwrap();
    println!("LEFT");
}

/// Kills its child process on drop, so a failed test leaves nothing behind.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a scheduler for `job` in a child process; returns it once its job runs, with the
/// tick it runs.
async fn child_running(
    cluster: &LocalCluster,
    job: &str,
    mode: &str,
) -> (ChildGuard, String, std::process::ChildStdout) {
    use std::io::{BufRead, BufReader};
    let spec = format!("{job};{mode};{}", cluster.urls().join(","));
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "schedule::zz_child_scheduler_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the scheduler process");
    let stdout = child.stdout.take().unwrap();
    let child = ChildGuard(child);
    let (tick, stdout) = tokio::time::timeout(
        WAIT + PERIOD,
        tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some((_, t)) = line.split_once("RUNNING ") {
                    return Some((t.trim().to_owned(), reader.into_inner()));
                }
                line.clear();
            }
            None
        }),
    )
    .await
    .expect("the child runs a tick")
    .unwrap()
    .expect("the child printed its tick");
    (child, tick, stdout)
}

/// Who ran each tick, and when.
type Ledger = Arc<Mutex<Vec<(String, String, SystemTime)>>>;

/// A scheduler instance in this process with the default policies, until `stop`.
fn scheduler(
    cluster: &LocalCluster,
    job: &str,
    id: &'static str,
    ledger: &Ledger,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let once = RunOnce::builder(client(cluster), job)
        .instance(id)
        .build()
        .unwrap();
    let (ledger, stop) = (Arc::clone(ledger), stop.clone());
    tokio::spawn(async move {
        let schedule = Schedule::every(PERIOD).unwrap();
        once.run_every(schedule, stop, |ctx| {
            let ledger = Arc::clone(&ledger);
            async move {
                let entry = (ctx.tick().to_owned(), id.to_owned(), SystemTime::now());
                ledger.lock().unwrap().push(entry);
            }
        })
        .await
        .unwrap();
    })
}

/// A scheduler instance (a child process) is killed with SIGKILL while its job runs. The two
/// others, with the default policies (a lock ttl of a third of the period, catch up the
/// latest missed tick), run the next tick and then the crashed one, before the tick after
/// that begins; every tick runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t101_a_crashed_tick_is_caught_up_by_another_instance_once() {
    let cluster = cluster(5);
    let (mut child, crashed, _out) = child_running(&cluster, "s101", "hang").await;
    child.0.kill().unwrap();
    let crashed_n: u64 = crashed.parse().unwrap();
    let ledger = Ledger::default();
    let stop = CancellationToken::new();
    let tasks = [
        scheduler(&cluster, "s101", "b", &ledger, &stop),
        scheduler(&cluster, "s101", "c", &ledger, &stop),
    ];
    let last = (crashed_n + 3).to_string();
    wait_until(PERIOD * 5 + WAIT, "three more ticks ran", || async {
        ledger.lock().unwrap().iter().any(|(t, _, _)| *t == last)
    })
    .await;
    stop.cancel();
    for task in tasks {
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    }
    let ledger = ledger.lock().unwrap();
    let runs = |n: u64| {
        ledger
            .iter()
            .filter(|(t, _, _)| *t == n.to_string())
            .collect::<Vec<_>>()
    };
    let caught = runs(crashed_n);
    assert_eq!(caught.len(), 1, "crashed tick {crashed}: {ledger:?}");
    // Within the policy's bound: run right after the next tick, before the one after begins.
    let next_but_one = SystemTime::UNIX_EPOCH + PERIOD * u32::try_from(crashed_n + 2).unwrap();
    assert!(
        caught[0].2 < next_but_one,
        "the crashed tick {crashed} was caught up late: {ledger:?}"
    );
    for n in crashed_n + 1..=crashed_n + 3 {
        assert_eq!(runs(n).len(), 1, "tick {n}: {ledger:?}");
    }
}

/// A catch-up does not make the current tick skip: the instance that runs the current tick
/// catches the missed one up after it, under the same lock, so another instance that arrives
/// while the catch-up runs finds the current tick done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t102_a_catch_up_does_not_make_the_current_tick_skip() {
    let cluster = cluster(5);
    let schedule = Schedule::every(Duration::from_secs(600)).unwrap();
    let job = |id: &str| {
        RunOnce::builder(client(&cluster), "s102")
            .instance(id)
            .build()
            .unwrap()
    };
    let (b, c) = (job("b"), job("c"));
    // The current tick; the one before it (within the markers' hour) never ran.
    let current = schedule.tick_at(SystemTime::now()).unwrap();
    let missed = schedule.before(&current).unwrap();
    let catching_up = Arc::new(tokio::sync::Notify::new());
    let go_on = Arc::new(tokio::sync::Notify::new());
    let ran = Arc::new(Mutex::new(Vec::new()));
    let b_run = {
        let (catching_up, go_on, ran) = (catching_up.clone(), go_on.clone(), ran.clone());
        let (schedule, current, missed) = (schedule.clone(), current.clone(), missed.clone());
        tokio::spawn(async move {
            let mut work = |ctx: quorumlock::TickContext| {
                let (catching_up, go_on, ran) = (catching_up.clone(), go_on.clone(), ran.clone());
                let missed = missed.name().to_owned();
                async move {
                    ran.lock().unwrap().push(ctx.tick().to_owned());
                    if ctx.tick() == missed {
                        catching_up.notify_one();
                        go_on.notified().await;
                    }
                }
            };
            b.run_scheduled(&schedule, current, &mut work)
                .await
                .unwrap()
        })
    };
    tokio::time::timeout(WAIT, catching_up.notified())
        .await
        .expect("b catches the missed tick up");
    // While b catches up, c comes for the current tick: it is done.
    let mut must_not_run = |_ctx: quorumlock::TickContext| async { unreachable!() };
    let late = c
        .run_scheduled(&schedule, current.clone(), &mut must_not_run)
        .await
        .unwrap();
    assert!(!late.outcome.ran(), "{late:?}");
    assert_eq!(
        *ran.lock().unwrap(),
        [current.name().to_owned(), missed.name().to_owned()],
        "the current tick ran before the catch-up"
    );
    go_on.notify_one();
    let b_done = tokio::time::timeout(WAIT, b_run).await.unwrap().unwrap();
    assert!(b_done.outcome.ran(), "{b_done:?}");
    assert_eq!(b_done.caught_up.len(), 1, "{b_done:?}");
    assert_eq!(b_done.caught_up[0].tick(), missed.name());
    // Both ticks are marked: neither runs again.
    let again = c
        .run_scheduled(&schedule, current.clone(), &mut must_not_run)
        .await
        .unwrap();
    assert!(
        !again.outcome.ran() && again.caught_up.is_empty(),
        "{again:?}"
    );
}

/// The minimum hold keeps a fast job's lock until it ends (a later tick skips as running, even
/// without markers); under `Overlap::RunAfter` a tick waits for the run that holds the lock
/// and then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t103_minimum_hold_and_run_after() {
    let cluster = cluster(3);
    let locks = client(&cluster);
    let hold = RunOnce::builder(locks.clone(), "s103")
        .ttl(Duration::from_secs(5))
        .hold_at_least(Duration::from_secs(2))
        .without_marker()
        .build()
        .unwrap();
    assert!(hold.run(1, |_| async {}).await.unwrap().ran());
    let status = locks.status("s103").await.unwrap();
    assert!(
        status.holder().is_some(),
        "held after a fast job: {status:?}"
    );
    let skipped = hold.run(2, |_| async {}).await.unwrap();
    assert!(
        matches!(skipped.skip_reason(), Some(quorumlock::SkipReason::Running)),
        "{skipped:?}"
    );

    let after = RunOnce::builder(locks.clone(), "s103")
        .ttl(Duration::from_secs(5))
        .overlap(quorumlock::Overlap::RunAfter)
        .build()
        .unwrap();
    // Still within the hold: the tick waits for it to end (at most one ttl), then runs.
    let ran = tokio::time::timeout(WAIT, after.run(3, |_| async {}))
        .await
        .expect("ran within the wait")
        .unwrap();
    assert!(ran.ran(), "{ran:?}");
}

/// SIGTERM to a scheduler (a child process running `run_every` with the signal wired to its
/// stop token) while its job runs: the job finishes, the tick is marked, the process leaves
/// with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t104_sigterm_finishes_the_running_job_and_leaves_cleanly() {
    use std::io::Read;
    let cluster = cluster(3);
    let (mut child, tick, mut out) = child_running(&cluster, "s104", "term").await;
    let pid = child.0.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let (exit, rest) = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        (child.0.wait().unwrap(), rest)
    })
    .await
    .unwrap();
    assert!(exit.success(), "{exit:?}: {rest}");
    assert!(
        rest.contains(&format!("DONE {tick}")) && rest.contains("LEFT"),
        "the job finished, then the loop returned: {rest}"
    );
    let late = RunOnce::builder(client(&cluster), "s104").build().unwrap();
    let again = late.run(tick.as_str(), |_| async {}).await.unwrap();
    assert!(
        matches!(
            again.skip_reason(),
            Some(quorumlock::SkipReason::AlreadyRan { .. })
        ),
        "the tick was marked: {again:?}"
    );
}
