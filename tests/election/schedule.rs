//! Scheduled ticks against real servers: ticks that know when they began keep running on
//! long-lived instances after nodes restart empty, and never run twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::support::*;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Outcome, RunOnce, Tick};

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
