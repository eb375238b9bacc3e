//! The `metrics` feature: contention and node health reach a metrics recorder.

mod support;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::*;

type Entries = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// Sums the counters (or counts the histogram samples) named `name`, with `label` if given.
fn counter(entries: &Entries, name: &str, label: Option<(&str, &str)>) -> u64 {
    entries
        .iter()
        .filter(|(key, _, _, _)| {
            key.key().name() == name
                && label
                    .is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(c) => *c,
            DebugValue::Histogram(h) => h.len() as u64,
            DebugValue::Gauge(_) => 0,
        })
        .sum()
}

#[tokio::test]
async fn t10_attempts_outcomes_node_errors_and_losses_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("only test in this binary sets it");

    let mut cluster = cluster(5);
    let locks = client(&cluster);
    let lock = locks
        .try_acquire("m", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        locks
            .try_acquire("m", Duration::from_secs(10))
            .await
            .unwrap_err()
            .is_held()
    );
    lock.release().await.unwrap();
    cluster.kill(0).unwrap();
    let short = locks
        .try_acquire("m", Duration::from_millis(700))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, short.lost()).await.unwrap();
    // The snapshot drains histograms: take it once.
    let snapshot: Entries = snapshotter.snapshot().into_vec();
    let entries = &snapshot;

    assert!(counter(entries, "quorumlock_attempts_total", None) >= 3);
    assert_eq!(
        counter(
            entries,
            "quorumlock_acquire_total",
            Some(("outcome", "acquired"))
        ),
        2
    );
    assert_eq!(
        counter(
            entries,
            "quorumlock_acquire_total",
            Some(("outcome", "held"))
        ),
        1
    );
    assert_eq!(counter(entries, "quorumlock_acquire_wait_seconds", None), 3);
    assert!(
        counter(
            entries,
            "quorumlock_node_latency_seconds",
            Some(("op", "acquire"))
        ) >= 9
    );
    assert!(
        counter(
            entries,
            "quorumlock_node_errors_total",
            Some(("node", cluster.urls()[0].as_str()))
        ) >= 1
    );
    assert_eq!(counter(entries, "quorumlock_locks_lost_total", None), 1);

    // A hung node: rounds are decided without it, and its pending calls are counted. (Healthy
    // rounds abandon the slowest nodes too; the recorder's snapshots are deltas, so the next
    // snapshot holds only what the rounds with the node hung did.)
    let node1 = cluster.urls()[1].clone();
    cluster.pause(1).unwrap();
    for i in 0..3 {
        let lock = locks
            .try_acquire(&format!("m{i}"), Duration::from_secs(10))
            .await
            .unwrap();
        lock.forget();
    }
    cluster.resume(1).unwrap();
    let abandoned = counter(
        &snapshotter.snapshot().into_vec(),
        "quorumlock_node_abandoned_total",
        Some(("node", node1.as_str())),
    );
    assert_eq!(
        abandoned, 3,
        "one abandoned call per round with node 1 hung"
    );
}

/// With `metrics_lock_label(true)` the per-lock metrics carry the lock's name as `lock`
/// (attempts, outcomes, waits, losses); a client without it labels nothing. On a recorder of
/// this thread's own (`with_local_recorder`, a current-thread runtime), so that t10's global
/// counts stay exact.
#[test]
fn t11_the_lock_name_label_is_opt_in() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let cluster = cluster(3);
            let labelled = builder(&cluster).metrics_lock_label(true).build().unwrap();
            let plain = client(&cluster);
            let lock = labelled
                .try_acquire("hot", Duration::from_secs(10))
                .await
                .unwrap();
            assert!(
                labelled
                    .try_acquire("hot", Duration::from_secs(10))
                    .await
                    .unwrap_err()
                    .is_held()
            );
            lock.release().await.unwrap();
            let short = labelled
                .try_acquire("short", Duration::from_millis(300))
                .await
                .unwrap();
            tokio::time::timeout(WAIT, short.lost()).await.unwrap();
            drop(short);
            let unlabelled = plain
                .try_acquire("plain", Duration::from_secs(10))
                .await
                .unwrap();
            unlabelled.release().await.unwrap();
        });
        drop(runtime);
    });
    let snapshot: Entries = snapshotter.snapshot().into_vec();
    let entries = &snapshot;
    let with = |name: &str, outcome: Option<&str>, lock: &str| -> u64 {
        entries
            .iter()
            .filter(|(key, _, _, _)| {
                let labels: Vec<(&str, &str)> =
                    key.key().labels().map(|l| (l.key(), l.value())).collect();
                key.key().name() == name
                    && labels.contains(&("lock", lock))
                    && outcome.is_none_or(|o| labels.contains(&("outcome", o)))
            })
            .map(|(_, _, _, value)| match value {
                DebugValue::Counter(c) => *c,
                DebugValue::Histogram(h) => h.len() as u64,
                DebugValue::Gauge(_) => 0,
            })
            .sum()
    };
    assert_eq!(with("quorumlock_acquire_total", Some("acquired"), "hot"), 1);
    assert_eq!(with("quorumlock_acquire_total", Some("held"), "hot"), 1);
    assert_eq!(with("quorumlock_acquire_wait_seconds", None, "hot"), 2);
    assert!(with("quorumlock_attempts_total", None, "hot") >= 2);
    assert_eq!(with("quorumlock_locks_lost_total", None, "short"), 1);
    // The client without the option: counted, unlabelled.
    assert_eq!(with("quorumlock_acquire_total", None, "plain"), 0);
    let unlabelled: u64 = entries
        .iter()
        .filter(|(key, _, _, _)| {
            key.key().name() == "quorumlock_acquire_total"
                && !key.key().labels().any(|l| l.key() == "lock")
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum();
    assert_eq!(unlabelled, 1, "{entries:?}");
}

/// A `MakeWriter` keeping what a subscriber writes.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every run-once tick's outcome is counted with the job's name (ran, failed, caught up,
/// skipped as held, as already run, as unavailable with its reason); an outage is logged at
/// warn once per job, not once per tick. On a recorder and a subscriber of this thread's own.
#[test]
fn t12_run_once_outcomes_are_counted_per_job_and_an_outage_warns_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let dispatch = tracing::Dispatch::new(subscriber);
    tracing::dispatcher::with_default(&dispatch, || {
        metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(run_once_ticks_of_every_outcome());
            drop(runtime);
        });
    });
    let snapshot: Entries = snapshotter.snapshot().into_vec();
    let ticks = |outcome: &str| run_once_ticks(&snapshot, "r12", outcome);
    assert_eq!(ticks("ran"), 2, "tick 1 and the scheduled tick");
    assert_eq!(ticks("skipped_already_ran"), 1);
    assert_eq!(ticks("failed"), 1);
    assert_eq!(ticks("caught_up"), 1);
    assert_eq!(ticks("skipped_held"), 1);
    assert_eq!(ticks("skipped_unavailable"), 3);
    assert_eq!(
        counter(
            &snapshot,
            "quorumlock_run_once_ticks_total",
            Some(("reason", "no_quorum"))
        ),
        3
    );
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("quorumlock::run_once"))
        .count();
    assert_eq!(
        warned, 1,
        "one warning for the outage, not one per tick:\n{log}"
    );
}

/// Job `r12` ticks once per outcome: ran, already ran, failed, caught up, held by another
/// holder, then three ticks with a majority of the five nodes killed.
async fn run_once_ticks_of_every_outcome() {
    use quorumlock::{RunOnce, Schedule};
    let mut cluster = cluster(5);
    let locks = client(&cluster);
    let job = RunOnce::builder(locks.clone(), "r12").build().unwrap();
    assert!(job.run(1, |_| async {}).await.unwrap().ran());
    assert!(!job.run(1, |_| async {}).await.unwrap().ran());
    let failed = job.try_run(2, |_| async { Err::<(), _>("boom") });
    assert!(failed.await.unwrap().ran());
    let schedule = Schedule::every(Duration::from_secs(600)).unwrap();
    let current = schedule.tick_at(std::time::SystemTime::now()).unwrap();
    let mut work = |_ctx| async {};
    let done = job.run_scheduled(&schedule, current, &mut work).await;
    assert_eq!(done.unwrap().caught_up.len(), 1);
    let other = locks
        .try_acquire("r12", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(!job.run(3, |_| async {}).await.unwrap().ran());
    other.release().await.unwrap();
    for i in [0, 1, 2] {
        cluster.kill(i).unwrap();
    }
    for tick in 4..7 {
        assert!(!job.run(tick, |_| async {}).await.unwrap().ran());
    }
}

/// The run-once tick counter of `job` for one `outcome`, summed over its other labels.
fn run_once_ticks(snapshot: &Entries, job: &str, outcome: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(key, _, _, _)| {
            let labels: Vec<(&str, &str)> =
                key.key().labels().map(|l| (l.key(), l.value())).collect();
            key.key().name() == "quorumlock_run_once_ticks_total"
                && labels.contains(&("run_once", job))
                && labels.contains(&("outcome", outcome))
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}
