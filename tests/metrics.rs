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
