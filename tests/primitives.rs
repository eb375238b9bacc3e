//! The primitives on top of locks, against real redis-server processes: several keys at once
//! (`acquire_all`: all or nothing, no deadlock between opposite orders, never two holders of a
//! key) and the counting semaphore (never more holders than permits, with a node killed and a
//! node paused, one fencing token sequence per permit), and `redlock run -n N`.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::{Error, Semaphore};
use support::*;

const TTL: Duration = Duration::from_secs(5);
/// How long one acquisition may wait for a busy key or permit: far above any fair share.
const PATIENCE: Duration = Duration::from_secs(30);
/// The bound on a whole workload: a deadlock or a stall fails the test instead of hanging it.
const WORKLOAD_BOUND: Duration = Duration::from_secs(120);

// ---- acquire_all ----

/// Who holds each key now, in this process: a second holder of a key is an overlap.
#[derive(Default)]
struct Occupancy {
    busy: Mutex<HashMap<String, usize>>,
}

impl Occupancy {
    fn enter(&self, who: usize, keys: &[&str]) {
        let mut busy = self.busy.lock().unwrap();
        for k in keys {
            if let Some(other) = busy.insert((*k).to_owned(), who) {
                panic!("{k} held by {other} and {who} at once");
            }
        }
    }

    fn leave(&self, keys: &[&str]) {
        let mut busy = self.busy.lock().unwrap();
        for k in keys {
            busy.remove(*k);
        }
    }
}

/// Three clients, each taking its set `ROUNDS` times (sets overlap, in opposite orders); every
/// acquisition must succeed within the patience, and the whole within the bound.
async fn opposite_orders(cluster: &quorumlock::testkit::LocalCluster) {
    let sets: [&[&str]; 3] = [&["a", "b", "c"], &["c", "b", "a"], &["b", "d", "a"]];
    let occupancy = Arc::new(Occupancy::default());
    let done = Arc::new(AtomicUsize::new(0));
    const ROUNDS: usize = 15;
    let mut tasks = Vec::new();
    for (who, set) in sets.into_iter().enumerate() {
        // One client each: nothing shared but the nodes.
        let locks = client(cluster);
        let (occupancy, done) = (Arc::clone(&occupancy), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let all = locks
                    .acquire_all_timeout(set.iter().copied(), TTL, PATIENCE)
                    .await
                    .unwrap_or_else(|e| panic!("client {who} ({set:?}): {e}"));
                assert_eq!(all.locks().len(), set.len());
                occupancy.enter(who, set);
                tokio::time::sleep(Duration::from_millis(5)).await; // the work
                assert!(
                    !all.is_lost(),
                    "lost while working: {:?}",
                    all.lost_reason()
                );
                occupancy.leave(set);
                // Under node faults a release may miss a quorum (the rest expires): not a loss.
                match all.release().await {
                    Ok(()) => {}
                    Err(e) if e.is_no_quorum() => {}
                    Err(e) => panic!("client {who}: release: {e}"),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let all = futures::future::try_join_all(tasks);
    tokio::time::timeout(WORKLOAD_BOUND, all)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "stalled: {} of {} acquisitions done",
                done.load(Ordering::SeqCst),
                3 * ROUNDS
            )
        })
        .expect("no task panicked");
    assert_eq!(done.load(Ordering::SeqCst), 3 * ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p10_overlapping_sets_in_opposite_orders_complete_without_deadlock_or_overlap() {
    let cluster = cluster(5);
    opposite_orders(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p13_opposite_orders_with_a_node_killed_and_a_node_stopped() {
    let mut cluster = cluster(5);
    cluster.kill(3).unwrap();
    cluster.pause(4).unwrap();
    opposite_orders(&cluster).await;
    cluster.resume(4).unwrap();
}

#[tokio::test]
async fn p11_one_held_resource_fails_the_whole_set_and_leaves_nothing_taken() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let (a, b) = (client(&cluster), client(&cluster));
    let held = b.try_acquire("k2", TTL).await.unwrap();

    let err = a.acquire_all(["k3", "k2", "k1"], TTL).await.unwrap_err();
    assert!(err.is_held(), "{err}");
    assert!(
        matches!(&err, Error::Held { key, .. } if key == "k2"),
        "{err}"
    );
    // k1 (sorted first) was taken and is released before the error returns, on a quorum at
    // least; k3 (after the refused k2) was never asked for.
    assert!(holders(&urls, "k1") <= 2, "k1 still held on a quorum");
    assert_eq!(holders(&urls, "k3"), 0, "k3 was taken");
    let k1 = b.try_acquire("k1", TTL).await.expect("k1 free at once");
    k1.release().await.unwrap();
    // The holder of k2 was never disturbed.
    assert!(!held.is_lost());
    held.release().await.unwrap();

    let all = a
        .acquire_all(["k3", "k2", "k1"], TTL)
        .await
        .expect("all free");
    assert_eq!(all.keys().collect::<Vec<_>>(), ["k1", "k2", "k3"]);
    all.release().await.unwrap();
}

#[tokio::test]
async fn p12_one_token_per_resource_and_lost_when_any_lock_is() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);

    let first = locks.acquire_all(["x", "y"], TTL).await.unwrap();
    let (x1, y1) = (first.token("x").unwrap(), first.token("y").unwrap());
    assert!(first.token("z").is_none());
    assert!(first.validity() > Duration::ZERO);
    first.release().await.unwrap();
    // y alone moves on; x's counter is its own.
    locks
        .try_acquire("y", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let second = locks.acquire_all(["y", "x"], TTL).await.unwrap();
    assert!(second.token("x").unwrap() > x1);
    assert!(second.token("y").unwrap().get() >= y1.get() + 2);

    // Someone else's value on every node for y: the next extension of y finds it gone, and the
    // whole guard is lost.
    for url in &urls {
        set_foreign(url, "y", "intruder", TTL);
    }
    tokio::time::timeout(WAIT, second.extend(TTL))
        .await
        .expect("bounded")
        .expect_err("y is no longer ours");
    tokio::time::timeout(WAIT, second.lost())
        .await
        .expect("the guard is lost when any lock is");
    assert!(second.is_lost());
    assert!(second.lost_reason().is_some());
    let _ = second.release().await;
}

// ---- Semaphore ----

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
                    .acquire_timeout(TTL, PATIENCE)
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
    let p1 = sa.try_acquire(TTL).await.unwrap();
    let p2 = sb.try_acquire(TTL).await.unwrap();
    assert_ne!(p1.index(), p2.index());
    assert_eq!(
        p1.key(),
        sa.permit_key(p1.index()).expect("in range"),
        "a permit is the lock of its key"
    );
    let err = sb.try_acquire(TTL).await.unwrap_err();
    assert!(
        matches!(&err, Error::Held { key, held, .. } if key == "gate" && *held >= 3),
        "{err}"
    );
    let freed = p1.index();
    p1.release().await.unwrap();
    let p3 = sb.try_acquire(TTL).await.expect("a permit is free again");
    assert_eq!(p3.index(), freed);
    // The permit extends itself: still valid after more than a ttl.
    tokio::time::timeout(TTL + Duration::from_secs(2), p2.lost())
        .await
        .expect_err("the lease extends itself");
    assert!(!p2.is_lost());
    p2.release().await.unwrap();
    p3.release().await.unwrap();
}

/// `SET` calls per node: every acquire round sends one to each node it reaches, refused or not.
fn sets(urls: &[String]) -> Vec<u64> {
    urls.iter()
        .map(|u| {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut conn(u))
                .expect("INFO");
            info.lines()
                .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        })
        .collect()
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
                        .acquire_timeout(TTL, PATIENCE)
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

#[tokio::test]
async fn p23_bad_arguments_are_refused_before_any_round() {
    let cluster = cluster(1);
    let locks = client(&cluster);
    assert!(Semaphore::new(&locks, "s", 0).is_err());
    assert!(locks.semaphore("", 2).is_err());
    let err = locks
        .acquire_all(Vec::<String>::new(), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = locks.acquire_all(["ok", ""], TTL).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // Nothing of "ok" was taken: the empty key was refused before any round.
    assert_eq!(holders(&cluster.urls(), "ok"), 0);
}

// ---- redlock run -n N ----

/// Three `redlock run -n 2` at once, each holding its permit until told to go: two run, the
/// third is refused (exit 75, held) while both permits are held, and one that waits runs once
/// a permit is released.
#[cfg(feature = "cli")]
#[tokio::test]
async fn p30_redlock_run_n_runs_cmd_only_while_a_permit_is_free() {
    use tokio::process::Command;
    let cluster = cluster(5);
    let nodes = cluster.urls().join(",");
    let dir = std::env::temp_dir().join(format!("quorumlock-p30-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gate = dir.join("go");
    let run = |name: &str, wait: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redlock"));
        cmd.env("REDLOCK_NODES", &nodes)
            .env("REDLOCK_RESTART_GUARD", "off")
            .args([
                "run", "-n", "2", "--ttl", "5s", "--wait", wait, "jobs", "--",
            ])
            .args([
                "sh",
                "-c",
                &format!(
                    "echo \"$REDLOCK_KEY\" > {d}/{name}; while [ ! -e {g} ]; do sleep 0.05; done",
                    d = dir.display(),
                    g = gate.display()
                ),
            ])
            .kill_on_drop(true);
        cmd
    };
    let mut first = run("one", "0s").spawn().unwrap();
    let mut second = run("two", "0s").spawn().unwrap();
    wait_until(WAIT, "both permits taken", || async {
        dir.join("one").exists() && dir.join("two").exists()
    })
    .await;
    let third = run("three", "0s").output().await.unwrap();
    assert_eq!(third.status.code(), Some(75), "a third ran with 2 permits");
    assert!(!dir.join("three").exists());
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(stderr.contains("jobs"), "{stderr}");
    // Once a permit is free, a waiting third runs.
    let mut waiting = run("three", "30s").spawn().unwrap();
    std::fs::write(&gate, b"").unwrap();
    for child in [&mut first, &mut second, &mut waiting] {
        let status = tokio::time::timeout(WAIT, child.wait())
            .await
            .expect("exits")
            .unwrap();
        assert!(status.success());
    }
    assert!(dir.join("three").exists());
    let keys: Vec<String> = ["one", "two", "three"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(dir.join(f))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    assert!(
        keys.iter().all(|k| k.starts_with("jobs:permit:")),
        "{keys:?}"
    );
    assert_ne!(keys[0], keys[1], "two CMDs on one permit");
    let _ = std::fs::remove_dir_all(&dir);
}
