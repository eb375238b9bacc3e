//! Run-once scheduling against real servers: one run per tick across concurrent instances, the
//! tick marker against late instances (and its expiry), long jobs keeping their lease, and
//! skipping when too few nodes answer or the lock is lost; what a failed job means under each
//! run policy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, FencingToken, Outcome, RunOnce, RunPolicy, SkipReason, TickContext};
use tokio::sync::Barrier;

fn instance(cluster: &LocalCluster, job: &str, id: &str) -> RunOnce {
    RunOnce::builder(client(cluster), job)
        .ttl(Duration::from_secs(2))
        .marker_ttl(Duration::from_secs(60))
        .instance(id)
        .build()
        .expect("valid job")
}

/// The job runs with the run's token; the same tick is then skipped as already run (naming the
/// run that marked it), and the next tick runs again with a larger token.
#[tokio::test]
async fn t10_runs_the_job_with_its_token_and_marks_the_tick() {
    let cluster = cluster(5);
    let a = instance(&cluster, "s10", "a");
    let outcome = a
        .run(1, |ctx| async move {
            assert_eq!(ctx.job(), "s10");
            assert_eq!(ctx.tick(), "1");
            assert!(!ctx.lost_token().is_cancelled());
            ctx.token()
        })
        .await
        .unwrap();
    let Outcome::Ran {
        token,
        output,
        marked,
        ..
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(output, token, "the job saw the run's token");
    assert!(marked);

    let again = a.run(1, |_| async { unreachable!() }).await.unwrap();
    match again.skip_reason() {
        Some(SkipReason::AlreadyRan { by }) => assert_eq!(*by, format!("{token} a")),
        other => panic!("{other:?}"),
    }
    let next = a.run(2, |ctx| async move { ctx.token() }).await.unwrap();
    assert!(next.output().expect("tick 2 runs") > token);
}

/// Invariant: each tick runs exactly once. Four instances (each its own client) call the
/// helper for the same tick at the same moment, tick after tick; then a fifth, late instance
/// tries every tick again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_each_tick_runs_exactly_once_across_four_instances() {
    const TICKS: u64 = 8;
    let cluster = cluster(5);
    let runs: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(4));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let job = instance(&cluster, "s20", &format!("i{i}"));
        let (runs, barrier) = (Arc::clone(&runs), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            let mut ran = 0;
            for tick in 0..TICKS {
                barrier.wait().await;
                let runs = Arc::clone(&runs);
                let outcome = job
                    .run(tick, |_| async move {
                        *runs.lock().unwrap().entry(tick).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    })
                    .await
                    .unwrap();
                match outcome {
                    Outcome::Ran { .. } => ran += 1,
                    Outcome::Skipped {
                        reason: SkipReason::Running | SkipReason::AlreadyRan { .. },
                        ..
                    } => {}
                    other => panic!("i{i} tick {tick}: {other:?}"),
                }
            }
            ran
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("instances finish")
            .unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    for tick in 0..TICKS {
        assert_eq!(
            runs.get(&tick),
            Some(&1),
            "tick {tick} ran {:?} times",
            runs.get(&tick)
        );
    }
    assert_eq!(total, TICKS as usize);

    let late = instance(&cluster, "s20", "late");
    for tick in 0..TICKS {
        let outcome = late.run(tick, |_| async { unreachable!() }).await.unwrap();
        assert!(
            matches!(outcome.skip_reason(), Some(SkipReason::AlreadyRan { .. })),
            "tick {tick}: {outcome:?}"
        );
    }
}

/// The marker is what stops a late instance: without markers the same late call runs the tick
/// again, and with a short marker expiry it runs again once the marker has expired.
#[tokio::test]
async fn t30_marker_blocks_a_late_instance_until_it_expires() {
    let cluster = cluster(5);
    let short = |id: &str| {
        RunOnce::builder(client(&cluster), "s30")
            .ttl(Duration::from_secs(2))
            .marker_ttl(Duration::from_millis(1500))
            .instance(id)
            .build()
            .unwrap()
    };
    let (a, late) = (short("a"), short("late"));
    assert!(a.run("T", |_| async {}).await.unwrap().ran());
    let blocked = late.run("T", |_| async {}).await.unwrap();
    assert!(matches!(
        blocked.skip_reason(),
        Some(SkipReason::AlreadyRan { .. })
    ));

    let unmarked = RunOnce::builder(client(&cluster), "s30")
        .without_marker()
        .build()
        .unwrap();
    assert!(
        unmarked.run("T", |_| async {}).await.unwrap().ran(),
        "without markers, only the lock keeps instances apart"
    );

    let runs = AtomicUsize::new(0);
    wait_until(
        WAIT,
        "the marker expires and the late instance runs",
        || async {
            late.run("T", |_| async { runs.fetch_add(1, Ordering::SeqCst) })
                .await
                .unwrap()
                .ran()
        },
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A job longer than several ttls keeps its lock: another instance skips as "running" meanwhile
/// (even for another tick), and the job finishes without its lost signal firing.
#[tokio::test]
async fn t40_long_job_keeps_its_lease_and_others_skip_as_running() {
    let cluster = cluster(5);
    let ttl = Duration::from_secs(2);
    let make = |id: &str| {
        RunOnce::builder(client(&cluster), "s40")
            .ttl(ttl)
            .instance(id)
            .build()
            .unwrap()
    };
    let (a, b) = (make("a"), make("b"));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let long = tokio::spawn(async move {
        a.run(1, |ctx| async move {
            started_tx.send(()).unwrap();
            tokio::select! {
                _ = ctx.lost() => panic!("lost while kept alive"),
                _ = tokio::time::sleep(ttl * 3) => "done",
            }
        })
        .await
        .unwrap()
    });
    started(started_rx).await;
    // Not a synchronisation: the point is to be past the lock's original ttl.
    tokio::time::sleep(ttl + ttl / 2).await;
    for tick in [1, 2] {
        let outcome = b.run(tick, |_| async {}).await.unwrap();
        assert!(
            matches!(outcome.skip_reason(), Some(SkipReason::Running)),
            "tick {tick}: {outcome:?}"
        );
    }
    let outcome = tokio::time::timeout(ttl * 3 + WAIT, long)
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.ran(), "{outcome:?}");
    assert_eq!(outcome.output(), Some("done"));
}

/// A partial view is retried, not skipped: with node 4 down and two other owners' keys on nodes
/// 0, 1 and 2 (as instances that split the live nodes leave them), the attempt is refused as
/// held without proof of a split (node 4 could complete a quorum for the keys on 0 and 1) and
/// the status read cannot tell either; the instance retries after its pause instead of skipping
/// the tick as running, and runs it once those keys expire. (The election's narrower split-vote
/// check would skip here.)
#[tokio::test]
async fn t51_a_partial_view_is_retried_not_skipped() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    cluster.kill(4).unwrap();
    let locks = builder(&cluster)
        .retry_count(3)
        .retry_delay(Duration::from_millis(400), Duration::ZERO)
        .build()
        .unwrap();
    let job = RunOnce::builder(locks, "s51")
        .ttl(Duration::from_secs(2))
        .instance("a")
        .build()
        .unwrap();
    // Expire between the first retry (~400 ms) and the second (~800 ms).
    for (u, owner) in urls.iter().zip(["x", "x", "y"]) {
        set_foreign(u, "s51", owner, Duration::from_millis(600));
    }
    let outcome = job.run(1, |ctx| async move { ctx.token() }).await.unwrap();
    assert!(outcome.ran(), "{outcome:?}");
}

/// With three of five nodes down every instance skips, with the failed nodes named.
#[tokio::test]
async fn t50_too_few_nodes_skips_as_unavailable() {
    let mut cluster = cluster(5);
    let a = instance(&cluster, "s50", "a");
    for i in 0..3 {
        cluster.kill(i).unwrap();
    }
    let outcome = a.run(1, |_| async { unreachable!() }).await.unwrap();
    match outcome.skip_reason() {
        Some(SkipReason::Unavailable(Error::NoQuorum { failures, .. })) => {
            assert!(!failures.is_empty())
        }
        other => panic!("{other:?}"),
    }
}

/// Kills nodes 0..3 of five (a quorum) while `run` runs, and waits for its outcome: bounded by
/// the lease's ttl and the wait.
async fn after_a_quorum_dies<T>(
    cluster: &mut LocalCluster,
    run: tokio::task::JoinHandle<T>,
    ttl: Duration,
) -> T {
    for i in 0..3 {
        cluster.kill(i).unwrap();
    }
    tokio::time::timeout(ttl + WAIT, run)
        .await
        .unwrap()
        .unwrap()
}

/// A job whose lock is lost (a quorum of nodes dies mid-run) is stopped: its future is dropped,
/// the outcome says lost, and no marker is written for the tick.
#[tokio::test]
async fn t60_lost_lock_stops_the_job_and_leaves_no_marker() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let ttl = Duration::from_millis(600);
    let a = RunOnce::builder(client(&cluster), "s60")
        .ttl(ttl)
        .instance("a")
        .build()
        .unwrap();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let finished = Arc::new(AtomicUsize::new(0));
    let run = tokio::spawn({
        let finished = Arc::clone(&finished);
        async move {
            a.run(1, |_| async move {
                started_tx.send(()).unwrap();
                tokio::time::sleep(Duration::from_secs(30)).await;
                finished.fetch_add(1, Ordering::SeqCst);
            })
            .await
            .unwrap()
        }
    });
    started(started_rx).await;
    let outcome = after_a_quorum_dies(cluster.faults(), run, ttl).await;
    assert!(
        matches!(outcome, Outcome::Lost { output: None, .. }),
        "{outcome:?}"
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0, "the job was stopped");
    for url in &urls[3..] {
        assert_eq!(marker_on(url, "s60", "1").await, None);
    }
}

/// A job that completes at the moment its lock is lost (here: it returns as soon as the lost
/// signal fires) keeps its output, the outcome still says lost, and no marker is written.
#[tokio::test]
async fn t61_job_completing_as_the_lock_is_lost_keeps_its_output() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let ttl = Duration::from_millis(1500);
    let a = RunOnce::builder(client(&cluster), "s61")
        .ttl(ttl)
        .instance("a")
        .build()
        .unwrap();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(async move {
        a.run(1, |ctx| async move {
            started_tx.send(()).unwrap();
            ctx.lost().await;
            "finished on loss"
        })
        .await
        .unwrap()
    });
    started(started_rx).await;
    let outcome = after_a_quorum_dies(cluster.faults(), run, ttl).await;
    match &outcome {
        Outcome::Lost { output, .. } => assert_eq!(*output, Some("finished on loss")),
        other => panic!("{other:?}"),
    }
    assert!(!outcome.ran());
    assert_eq!(outcome.output(), Some("finished on loss"));
    for url in &urls[3..] {
        assert_eq!(marker_on(url, "s61", "1").await, None);
    }
}

/// A fallible job for a tick that must be skipped.
fn must_not_run(_: TickContext) -> std::future::Ready<Result<(), &'static str>> {
    unreachable!("the tick was to be skipped")
}

fn with_policy(cluster: &LocalCluster, job: &str, id: &str, policy: RunPolicy) -> RunOnce {
    RunOnce::builder(client(cluster), job)
        .ttl(Duration::from_secs(2))
        .marker_ttl(Duration::from_secs(60))
        .instance(id)
        .policy(policy)
        .build()
        .expect("valid job")
}

/// Retry on failure (issue 16): a job that fails on instance A leaves no tick marker, so
/// instance B, calling for the same tick afterwards, runs it; once B succeeded the tick is done
/// for A too. (Before the policy existed every failed job marked its tick: B skipped it as
/// already run.)
#[tokio::test]
async fn t70_retry_on_failure_lets_another_instance_run_a_failed_tick() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let a = with_policy(&cluster, "s70", "a", RunPolicy::RetryOnFailure);
    let b = with_policy(&cluster, "s70", "b", RunPolicy::RetryOnFailure);
    assert_eq!(a.policy(), RunPolicy::RetryOnFailure);

    let failed = a
        .try_run(1, |_| async { Err::<FencingToken, _>("boom") })
        .await
        .unwrap();
    let Outcome::Ran {
        output: Err("boom"),
        marked: false,
        token: a_token,
        ..
    } = failed
    else {
        panic!("{failed:?}")
    };
    for url in &urls {
        assert_eq!(marker_on(url, "s70", "1").await, None, "no marker on {url}");
    }

    let retried = b
        .try_run(1, |ctx| async move { Ok::<_, &str>(ctx.token()) })
        .await
        .unwrap();
    let Outcome::Ran {
        output: Ok(b_token),
        marked: true,
        ..
    } = retried
    else {
        panic!("B did not run the failed tick: {retried:?}")
    };
    assert!(b_token > a_token);

    let again = a.try_run(1, must_not_run).await.unwrap();
    match again.skip_reason() {
        Some(SkipReason::AlreadyRan { by }) => {
            assert_eq!(by.token, Some(b_token));
            assert_eq!(by.instance, "b");
        }
        other => panic!("{other:?}"),
    }
}

/// At most once (the default): a job that fails on instance A marks its tick all the same, so
/// instance B skips it as already run, naming A's run.
#[tokio::test]
async fn t71_at_most_once_marks_a_failed_tick_done() {
    let cluster = cluster(5);
    let a = instance(&cluster, "s71", "a");
    assert_eq!(a.policy(), RunPolicy::AtMostOnce);
    let b = with_policy(&cluster, "s71", "b", RunPolicy::AtMostOnce);

    let failed = a
        .try_run(1, |_| async { Err::<(), _>("boom") })
        .await
        .unwrap();
    let Outcome::Ran {
        output: Err("boom"),
        marked: true,
        token,
        ..
    } = failed
    else {
        panic!("{failed:?}")
    };
    let skipped = b.try_run(1, must_not_run).await.unwrap();
    match skipped.skip_reason() {
        Some(SkipReason::AlreadyRan { by }) => {
            assert_eq!(by.token, Some(token));
            assert_eq!(by.instance, "a");
        }
        other => panic!("B ran a tick that failed at most once: {other:?}"),
    }

    // `run` never looks at its job's output: an `Err` there is a completed run, even under
    // retry on failure.
    let c = with_policy(&cluster, "s71", "c", RunPolicy::RetryOnFailure);
    let plain = c.run(2, |_| async { Err::<(), _>("boom") }).await.unwrap();
    assert!(
        matches!(plain, Outcome::Ran { marked: true, .. }),
        "{plain:?}"
    );
}

/// Waits until a spawned job says it started.
async fn started(rx: tokio::sync::oneshot::Receiver<()>) {
    tokio::time::timeout(WAIT, rx)
        .await
        .expect("the job starts")
        .expect("the job sent its start");
}

/// The tick marker on one node (an async read: no blocking call inside the test's runtime).
async fn marker_on(url: &str, job: &str, tick: &str) -> Option<String> {
    let client = redis::Client::open(url).expect("url");
    let mut conn = tokio::time::timeout(
        WAIT,
        client.get_multiplexed_async_connection_with_config(&crate::support::direct_config()),
    )
    .await
    .expect("connected within the wait")
    .expect("connect");
    tokio::time::timeout(
        WAIT,
        redis::cmd("GET")
            .arg(format!("quorumlock:{{{job}}}:tick:{tick}"))
            .query_async(&mut conn),
    )
    .await
    .expect("answered within the wait")
    .expect("GET")
}

/// Issue 26, item 3: a tick marker lost in a restart does not let the tick run twice. Instance
/// 1 runs tick 7 with node 2 unreachable to it, so its marker is on nodes 0 and 1 only. Node 0
/// restarts empty; instance 2, which met it before, holds it out and repairs its counters, and
/// it counts again. Node 1 dies. Instance 2 then reads {node 0: absent, node 2: absent}, a
/// quorum of answers, but node 0's absence proves nothing: it lost its data (seen restarting
/// without proof its data survived) less than the marker's expiry ago. The tick is skipped as
/// unavailable, not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_a_marker_lost_in_a_restart_does_not_let_a_tick_run_twice() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let ttl = Duration::from_secs(1);
    let marker_ttl = Duration::from_secs(60);
    let job = |locks: quorumlock::Redlock, id: &str| {
        RunOnce::builder(locks, "s80")
            .ttl(ttl)
            .marker_ttl(marker_ttl)
            .instance(id)
            .build()
            .expect("valid job")
    };
    // Instance 1 cannot reach node 2 (nothing listens on port 1).
    let locks1 = quorumlock::Redlock::builder([
        urls[0].clone(),
        urls[1].clone(),
        "redis://127.0.0.1:1".to_owned(),
    ])
    .node_timeout(NODE_TIMEOUT)
    .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
    .build()
    .expect("valid config");
    let one = job(locks1, "one");
    let locks2 = builder(&cluster)
        .max_ttl(ttl)
        .build()
        .expect("valid config");
    warm(&locks2).await;
    let two = job(locks2.clone(), "two");

    let first = one.run(7, |ctx| async move { ctx.token() }).await.unwrap();
    assert!(first.ran(), "{first:?}");
    assert!(marker_on(&urls[0], "s80", "7").await.is_some());
    assert!(marker_on(&urls[1], "s80", "7").await.is_some());
    assert!(marker_on(&urls[2], "s80", "7").await.is_none());

    // Node 0 comes back empty: instance 2 sees the restart (held out, repaired), then counts it.
    cluster.restart_empty(0).unwrap();
    // A probe key held by someone else on node 2: a probe succeeds only with node 0 counting.
    let mut held_out = false;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node 0 never counted again for instance 2"
        );
        set_foreign(&urls[2], "probe", "someone-else", Duration::from_secs(5));
        match locks2.try_acquire("probe", ttl).await {
            Ok(probe) => {
                probe.release().await.expect("release");
                break;
            }
            Err(Error::NoQuorum { failures, .. }) => {
                held_out |= failures.iter().any(|f| {
                    matches!(
                        f.cause,
                        quorumlock::NodeError::HeldOut { .. } | quorumlock::NodeError::Repairing
                    )
                });
            }
            Err(e) => assert!(e.is_held(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(held_out, "instance 2 saw node 0 restart and held it out");
    cluster.kill(1).unwrap();

    let second = two.run(7, |ctx| async move { ctx.token() }).await.unwrap();
    assert!(
        !second.ran(),
        "tick 7 ran twice: instance 2 counted node 0's lost marker as absent: {second:?}"
    );
    match second.skip_reason() {
        Some(SkipReason::Unavailable(Error::NoQuorum { failures, .. })) => assert!(
            failures.iter().any(|f| f.node == urls[0]
                && matches!(f.cause, quorumlock::NodeError::LostDataRecently { .. })),
            "{failures:?}"
        ),
        other => panic!("{other:?}"),
    }
}

/// A tick with one node hung: the marker's read and write are decided once a quorum has
/// answered (a read: a quorum of proven "absent" answers, or any "present"), so the run neither
/// waits for the hung node nor loses its safety (a marker on a quorum meets every quorum of
/// readers). The instance is connected to every node when node 4 hangs, and its node timeout,
/// 30 s, is three times the test's bound. A late instance then skips the tick, still with node
/// 4 hung. Before the fix: `a tick with a node hung took the node timeout: Elapsed(())`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t90_a_hung_node_holds_up_no_tick() {
    let mut cluster = cluster(5);
    let patient = |id: &str| {
        let locks = builder(&cluster).node_timeout(WAIT * 3).build().unwrap();
        let job = RunOnce::builder(locks.clone(), "s90")
            .ttl(Duration::from_secs(10))
            .marker_ttl(Duration::from_secs(60))
            .instance(id)
            .build()
            .expect("valid job");
        (locks, job)
    };
    let (a_locks, a) = patient("a");
    let (b_locks, b) = patient("b");
    warm(&a_locks).await;
    warm(&b_locks).await;
    cluster.pause(4).unwrap();
    let ran = tokio::time::timeout(WAIT, a.run(1, |ctx| async move { ctx.token() }))
        .await
        .expect("a tick with a node hung took the node timeout")
        .unwrap();
    assert!(matches!(ran, Outcome::Ran { marked: true, .. }), "{ran:?}");
    let late = tokio::time::timeout(WAIT, b.run(1, |_| async { unreachable!() }))
        .await
        .expect("a late instance with a node hung took the node timeout")
        .unwrap();
    assert!(
        matches!(late.skip_reason(), Some(SkipReason::AlreadyRan { .. })),
        "{late:?}"
    );
    cluster.resume(4).unwrap();
}
