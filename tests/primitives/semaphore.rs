//! The counting semaphore: never more holders than permits (also with a node killed and a node
//! paused), one fencing token sequence per permit, waiters woken by releases taking turns, a
//! waiter making no sweep while the permits stand, and bad arguments refused before any round.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use crate::{PATIENCE, WORKLOAD_BOUND, WORKLOAD_TTL};
use quorumlock::{Error, Semaphore};

/// A semaphore workload's record: holders now, the most at once, each permit's holder and
/// last token.
#[derive(Default)]
struct Holders {
    now: AtomicUsize,
    most: AtomicUsize,
    taken: AtomicUsize,
    by_permit: Mutex<HashMap<u32, (bool, u64)>>,
}

impl Holders {
    fn enter(&self, permit: &quorumlock::Permit) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let mut by = self.by_permit.lock().unwrap();
        let (busy, last) = by.entry(permit.index()).or_default();
        assert!(!*busy, "permit {} held twice", permit.index());
        // One holder per permit at a time, so entries are in lock order: tokens only rise.
        assert!(
            permit.token().get() > *last,
            "permit {}: token {} after {last}",
            permit.index(),
            permit.token()
        );
        *busy = true;
        *last = permit.token().get();
    }

    fn leave(&self, permit: &quorumlock::Permit) {
        self.by_permit
            .lock()
            .unwrap()
            .get_mut(&permit.index())
            .expect("entered")
            .0 = false;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.taken.fetch_add(1, Ordering::SeqCst);
    }
}

/// `tasks` tasks, each taking a permit `rounds` times (one client per task).
async fn semaphore_workload(
    cluster: &quorumlock::testkit::LocalCluster,
    permits: u32,
    tasks: usize,
    rounds: usize,
    holders: &Arc<Holders>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let locks = client(cluster);
        warm(&locks).await;
        let sem = Semaphore::new(&locks, "pool", permits).unwrap();
        let holders = Arc::clone(holders);
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let permit = sem
                    .acquire_timeout(WORKLOAD_TTL, PATIENCE)
                    .await
                    .unwrap_or_else(|e| panic!("task {t}: {e}"));
                holders.enter(&permit);
                tokio::time::sleep(Duration::from_millis(20)).await; // the work
                assert!(
                    !permit.is_lost(),
                    "lost while working: {:?}",
                    permit.lost_reason()
                );
                holders.leave(&permit);
                // With a node killed and one stopped, a release may reach too few of the
                // nodes holding the permit (the rest expires with the ttl): never a loss.
                match permit.release().await {
                    Ok(()) => {}
                    Err(e) if e.is_no_quorum() => {}
                    Err(e) => panic!("task {t}: release: {e}"),
                }
            }
        }));
    }
    handles
}

async fn join(handles: Vec<tokio::task::JoinHandle<()>>, holders: &Holders) {
    tokio::time::timeout(WORKLOAD_BOUND, futures::future::try_join_all(handles))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "stalled after {} permits",
                holders.taken.load(Ordering::SeqCst)
            )
        })
        .expect("no task panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p20_many_tasks_never_hold_more_than_the_permits() {
    let cluster = cluster(5);
    let holders = Arc::new(Holders::default());
    let handles = semaphore_workload(&cluster, 3, 12, 6, &holders).await;
    join(handles, &holders).await;
    assert_eq!(holders.taken.load(Ordering::SeqCst), 12 * 6);
    let most = holders.most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders of 3 permits");
    // The bound was reached, so the check above was exercised.
    assert_eq!(most, 3, "12 tasks never filled 3 permits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p21_a_killed_node_and_a_paused_node_never_let_more_than_the_permits_in() {
    let mut cluster = cluster(5);
    let holders = Arc::new(Holders::default());
    let handles = semaphore_workload(&cluster, 2, 8, 6, &holders).await;
    // Faults once the workload is under way: one node killed, another stopped (SIGSTOP), so
    // exactly a quorum (3 of 5) answers.
    wait_until(WAIT, "first permits taken", || async {
        holders.taken.load(Ordering::SeqCst) >= 4
    })
    .await;
    cluster.kill(0).unwrap();
    cluster.pause(1).unwrap();
    let before = holders.taken.load(Ordering::SeqCst);
    wait_until(PATIENCE, "permits taken with 3 of 5 nodes", || async {
        holders.taken.load(Ordering::SeqCst) >= before + 8
    })
    .await;
    cluster.resume(1).unwrap();
    join(handles, &holders).await;
    assert_eq!(holders.taken.load(Ordering::SeqCst), 8 * 6);
    let most = holders.most.load(Ordering::SeqCst);
    assert!(most <= 2, "{most} holders of 2 permits");
}

#[tokio::test]
async fn p22_a_full_semaphore_is_held_and_a_released_permit_is_free_again() {
    let cluster = cluster(5);
    let (a, b) = (client(&cluster), client(&cluster));
    let sa = a.semaphore("gate", 2).unwrap();
    let sb = Semaphore::new(&b, "gate", 2).unwrap();
    let p1 = sa.try_acquire(WORKLOAD_TTL).await.unwrap();
    let p2 = sb.try_acquire(WORKLOAD_TTL).await.unwrap();
    assert_ne!(p1.index(), p2.index());
    assert_eq!(
        p1.key(),
        sa.permit_key(p1.index()).expect("in range"),
        "a permit is the lock of its key"
    );
    let err = sb.try_acquire(WORKLOAD_TTL).await.unwrap_err();
    assert!(
        matches!(&err, Error::Held { key, held, .. } if key == "gate" && *held >= 3),
        "{err}"
    );
    let freed = p1.index();
    p1.release().await.unwrap();
    let p3 = sb
        .try_acquire(WORKLOAD_TTL)
        .await
        .expect("a permit is free again");
    assert_eq!(p3.index(), freed);
    // The permit extends itself: still valid after more than a ttl.
    tokio::time::timeout(WORKLOAD_TTL + Duration::from_secs(2), p2.lost())
        .await
        .expect_err("the lease extends itself");
    assert!(!p2.is_lost());
    p2.release().await.unwrap();
    p3.release().await.unwrap();
}

/// Semaphore waiters are woken by releases, and take turns: six tasks of one client on two
/// permits, each taking a permit, holding it 20 ms and asking again, until 24 acquisitions.
/// Their retry pause is an hour: only release notices can move them on (before issue 27 they
/// slept it and the workload stalled). A task that has just released queues behind the others
/// instead of taking its permit back at once, so the acquisitions are shared evenly (the client's
/// FIFO: at most 2 apart).
///
/// Rounds: a woken head sweeps from the released permit (one round), a new head sweeps once
/// (at most `permits` rounds), each task's first call sweeps before and after registering (at
/// most 2 × `permits`), a timer sweep is 5 s away (the permits' ttl, longer than the workload);
/// a release may raise a counter (one `SET`). So a node receives at most (2 + permits) `SET`s per
/// acquisition and 3 × `permits` per task; no timing enters the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p24_semaphore_waiters_are_woken_by_releases_and_take_turns() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = builder(&cluster)
        .retry_delay(Duration::from_secs(3600), Duration::ZERO)
        .build()
        .unwrap();
    warm(&locks).await;
    let (permits, tasks, total) = (2u32, 6usize, 24usize);
    let sem = locks.semaphore("turns", permits).unwrap();
    let before = sets(&urls);
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (sem, done) = (sem.clone(), Arc::clone(&done));
            tokio::spawn(async move {
                let mut mine = 0;
                while done.load(Ordering::SeqCst) < total {
                    let permit = sem
                        .acquire_timeout(WORKLOAD_TTL, PATIENCE)
                        .await
                        .expect("a permit within the patience");
                    if done.fetch_add(1, Ordering::SeqCst) < total {
                        mine += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    permit.release().await.unwrap();
                }
                mine
            })
        })
        .collect();
    let mut counts = Vec::new();
    for h in handles {
        counts.push(
            tokio::time::timeout(WAIT * 3, h)
                .await
                .expect("the waiters were woken by the releases (their retry pause is an hour)")
                .unwrap(),
        );
    }
    locks.flush().await;
    let rounds: Vec<u64> = sets(&urls)
        .iter()
        .zip(&before)
        .map(|(n, b)| n - b)
        .collect();
    eprintln!("acquisitions per task {counts:?}; SET per node {rounds:?}");
    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(max - min <= 2, "the tasks did not take turns: {counts:?}");
    let bound = (2 + permits as u64) * total as u64 + 3 * permits as u64 * tasks as u64;
    assert!(
        rounds.iter().all(|&r| r <= bound),
        "SET per node {rounds:?} for {total} acquisitions (at most {bound})"
    );
}

/// A waiter on a full semaphore costs what a lock's waiter costs: while the holders' keys stand
/// (30 s here, never released: no notice comes) it reads their `PTTL` instead of sweeping, and
/// makes only the sweeps its patience owes (`1 + retry_count`, one round per permit each),
/// however long its wait. Rounds are counted as the `SET`s each node ran, less the waiters
/// markers' (each `SADD` of a marker comes with one `SET` of its count); no timing enters the
/// count. With a wait of 3.5 s, a waiter that sweeps again after registering and at every
/// timer makes six sweeps.
#[tokio::test]
async fn p25_a_waiter_on_a_full_semaphore_sweeps_only_the_rounds_it_owes() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let (holder, waiter) = (client(&cluster), client(&cluster));
    warm(&waiter).await;
    let permits = 2u32;
    let sem = waiter.semaphore("full", permits).unwrap();
    let mut held = Vec::new();
    for i in 0..permits {
        let key = sem.permit_key(i).expect("in range");
        held.push(
            holder
                .try_acquire(&key, Duration::from_secs(30))
                .await
                .unwrap(),
        );
    }
    let rounds = || -> Vec<u64> {
        urls.iter()
            .map(|u| calls(u, "set") - calls(u, "sadd"))
            .collect()
    };
    let before = rounds();
    let err = sem
        .acquire_timeout(WORKLOAD_TTL, Duration::from_millis(3500))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Held { key, .. } if key == "full"),
        "{err}"
    );
    let spent: Vec<u64> = rounds().iter().zip(&before).map(|(n, b)| n - b).collect();
    let sweeps = 1 + u64::from(quorumlock::RedlockBuilder::DEFAULT_RETRY_COUNT);
    let owed = u64::from(permits) * sweeps;
    assert!(
        spent.iter().all(|&n| n <= owed),
        "SET per node {spent:?}: at most {owed} ({sweeps} sweeps of {permits} permits)"
    );
    for lock in held {
        lock.release().await.unwrap();
    }
}

#[tokio::test]
async fn p23_bad_arguments_are_refused_before_any_round() {
    let cluster = cluster(1);
    let locks = client(&cluster);
    assert!(Semaphore::new(&locks, "s", 0).is_err());
    assert!(locks.semaphore("", 2).is_err());
    // A count whose sweeps and waiters could not be afforded is refused, naming the range.
    for permits in [Semaphore::MAX_PERMITS + 1, u32::MAX] {
        let err = Semaphore::new(&locks, "s", permits).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument(quorumlock::ArgumentError::Permits { max: 1000, .. })
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("invalid argument: a semaphore takes 1..=1000 permits, not {permits}")
        );
    }
    let err = locks
        .acquire_all(Vec::<String>::new(), WORKLOAD_TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = locks
        .acquire_all(["ok", ""], WORKLOAD_TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // Nothing of "ok" was taken: the empty key was refused before any round.
    assert_eq!(holders(&cluster.urls(), "ok"), 0);
}
