//! Fairness: one client's waiters take turns, contenders with exactly a quorum reachable do not
//! starve, and the next waiter of a client does not poll its predecessor's lock.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::*;
use crate::{patient, pttls_of, sets_since, until_waiting};
use quorumlock::Redlock;

/// The waiters of one client take turns: four tasks that each take the lock, hold it briefly
/// and wait for it again share the acquisitions evenly (a FIFO per client).
#[tokio::test]
async fn w14_one_clients_waiters_take_turns() {
    let cluster = cluster(5);
    let locks = patient(&cluster).await;
    let counts = contend(vec![locks; 4], "w14", 40).await;
    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(max - min <= 2, "turns were not taken: {counts:?}");
}

/// Exactly a quorum reachable (two of five nodes killed), six contenders in three clients:
/// every contender acquires (docs/chaos.md finding 7 was a livelock in this setting). The
/// contenders keep contending until each has won once; how evenly they share the lock is a
/// benchmark (`benches/fairness.rs`), not a test: the design does not bound it tightly enough.
///
/// False-failure bound: a handover (release, then some waiter's grant) takes a few round trips
/// on three local nodes: under 100 ms even on a loaded 2-core box, so the 60 s deadline leaves
/// at least 600 handovers. The old form of this test counted 60 acquisitions; in its most
/// lopsided runs on record (`[5, 23, 7, 10, 8, 7]`, `[7, 13, 6, 21, 6, 7]`,
/// `[7, 22, 5, 5, 14, 7]`) no contender's share fell below 5/60 (0.083); take p = 0.03 as the
/// floor of a contender's share. The chance that a given contender wins none of 600 handovers
/// is then at most (1 - 0.03)^600 = 1.2e-8, and for any of the six at most 7.4e-8: far below
/// 1 in 10,000. A livelock, or a contender that is never woken, fails it.
#[tokio::test]
async fn w15_no_starvation_with_exactly_a_quorum() {
    let mut cluster = cluster(5);
    cluster.kill(3).unwrap();
    cluster.kill(4).unwrap();
    let clients: Vec<Redlock> = (0..3).map(|_| client(&cluster)).collect();
    let contenders: Vec<Redlock> = clients
        .iter()
        .flat_map(|c| [c.clone(), c.clone()])
        .collect();
    let counts = until_each_won(contenders, "w15", WAIT * 6).await;
    eprintln!("acquisitions per contender until each had one: {counts:?}");
    assert!(
        counts.iter().all(|&n| n >= 1),
        "a contender starved within {:?}: {counts:?}",
        WAIT * 6
    );
}

/// Runs one task per client handle: acquire (waiting), hold a moment, release; until every
/// task has acquired at least once, or `deadline` passed. Returns each task's count.
async fn until_each_won(
    clients: Vec<Redlock>,
    key: &'static str,
    deadline: Duration,
) -> Vec<usize> {
    let n = clients.len();
    let counts: Arc<Vec<std::sync::atomic::AtomicUsize>> =
        Arc::new((0..n).map(|_| Default::default()).collect());
    let everyone_won = {
        let counts = Arc::clone(&counts);
        move || counts.iter().all(|c| c.load(Ordering::SeqCst) >= 1)
    };
    let end = tokio::time::Instant::now() + deadline;
    // Short: with exactly a quorum, a release that failed on one node leaves the lock there
    // until it expires.
    let ttl = Duration::from_secs(5);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, locks)| {
            let (counts, everyone_won) = (Arc::clone(&counts), everyone_won.clone());
            tokio::spawn(async move {
                while !everyone_won() && tokio::time::Instant::now() < end {
                    let Ok(lock) = locks.acquire_timeout(key, ttl, WAIT).await else {
                        continue;
                    };
                    counts[i].fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    // With exactly a quorum, a slow node can fail a release: its key expires.
                    let _ = lock.release().await;
                }
            })
        })
        .collect();
    for t in tasks {
        // Each task stops at the deadline, after at most one more wait for the lock.
        tokio::time::timeout(deadline + WAIT * 2, t)
            .await
            .expect("contenders stop")
            .unwrap();
    }
    counts.iter().map(|c| c.load(Ordering::SeqCst)).collect()
}

/// Runs one task per client handle: acquire (waiting), hold a moment, release; until `total`
/// acquisitions were made. Returns each task's count.
async fn contend(clients: Vec<Redlock>, key: &'static str, total: usize) -> Vec<usize> {
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ttl = Duration::from_secs(30);
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|locks| {
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut mine = 0;
                while done.load(Ordering::SeqCst) < total {
                    let Ok(lock) = locks.acquire_timeout(key, ttl, WAIT).await else {
                        continue;
                    };
                    if done.fetch_add(1, Ordering::SeqCst) < total {
                        mine += 1;
                    }
                    tokio::task::yield_now().await;
                    // With exactly a quorum, a slow node can fail a release: its key expires.
                    let _ = lock.release().await;
                }
                mine
            })
        })
        .collect();
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(
            tokio::time::timeout(WAIT * 6, t)
                .await
                .expect("contenders finish")
                .unwrap(),
        );
    }
    counts
}

/// The next of one client's waiters, while another of its waiters holds the lock, waits for
/// that release without polling: two tasks of one client wait for a lock another client holds;
/// the first wins at the release, and while it holds the lock for 500 ms the second (the new
/// head) makes no round: it reads the key's `PTTL` (10 s left) and sleeps (at most 1 s) or
/// until the notice. Before issue 27 it polled after the retry backoff (5 ms doubling here): 3
/// rounds per node in the hold at 5e64ecd. Bound: two rounds per node during the hold (a second waiter that
/// registered late makes its first two there). Counted, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w21_the_next_waiter_of_a_client_does_not_poll_its_predecessors_lock() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = client(&cluster);
    warm(&holder).await;
    let locks = client(&cluster);
    warm(&locks).await;
    let ttl = Duration::from_secs(10);
    let lock = holder.acquire("w21", ttl).await.unwrap();
    spread(&lock, &urls).await;
    let before = sets(&urls);
    let pttls = pttls_of(&urls);
    let (won_tx, won_rx) = tokio::sync::oneshot::channel::<Vec<u64>>();
    let first = {
        let locks = locks.clone();
        let urls = urls.clone();
        tokio::spawn(async move {
            let lock = locks.acquire_timeout("w21", ttl, WAIT).await.unwrap();
            let _ = won_tx.send(sets(&urls));
            tokio::time::sleep(Duration::from_millis(500)).await;
            let during = sets(&urls);
            lock.release().await.unwrap();
            during
        })
    };
    // The second queues behind the first (same client, same key).
    until_waiting(&urls, "w21", &before, &pttls).await;
    let second = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire_timeout("w21", ttl, WAIT).await })
    };
    // The second's registration behind the first is local (no command marks it): a moment
    // for it. Should it come after the first's win instead, it makes its two first rounds
    // (refused) during the hold, within the bound, and then sleeps as the fix has it: the test
    // cannot fail for that, it only covers less.
    tokio::time::sleep(Duration::from_millis(50)).await;
    lock.release().await.unwrap();
    let at_win = tokio::time::timeout(WAIT, won_rx).await.unwrap().unwrap();
    let at_release = tokio::time::timeout(WAIT, first).await.unwrap().unwrap();
    let during: Vec<u64> = at_release.iter().zip(&at_win).map(|(r, w)| r - w).collect();
    let won = tokio::time::timeout(WAIT, second)
        .await
        .expect("the second waiter acquires after the first releases")
        .unwrap()
        .unwrap();
    won.release().await.unwrap();
    assert!(
        during.iter().all(|&r| r <= 2),
        "rounds per node while the first waiter held the lock: {during:?}"
    );
}

/// A client's next waiter hears another client's release even when the lock its previous
/// waiter won ended without a release notice (here forgotten; an expiry or a loss is the same):
/// C's first waiter wins X's released lock and forgets it; once it has expired X takes the lock
/// again, and C's next waiter, refused by X, must wake at X's release. Its poll timer is an hour
/// away: a waiter that acquires within the test's bounded wait was woken by the notice. Before,
/// the queue still waited for the forgotten lock's release notice, which never comes, and the
/// waiter slept until its timer.
#[tokio::test]
async fn w40_a_lock_that_ended_silently_does_not_hide_the_next_release() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let x = client(&cluster);
    let c = patient(&cluster).await;
    let long = Duration::from_secs(60);
    let held = x.acquire("w40", long).await.unwrap();
    spread(&held, &urls).await;
    let before = sets(&urls);
    let pttls = pttls_of(&urls);
    let c1 = c.clone();
    let first = tokio::spawn(async move {
        c1.acquire_timeout("w40", Duration::from_millis(300), crate::NEVER)
            .await
    });
    until_waiting(&urls, "w40", &before, &pttls).await;
    held.release().await.unwrap();
    let forgotten = tokio::time::timeout(WAIT, first)
        .await
        .expect("C's first waiter was woken")
        .unwrap()
        .unwrap();
    let forgotten_token = forgotten.token();
    forgotten.forget();
    let held = x
        .acquire_timeout("w40", long, WAIT)
        .await
        .expect("X takes the forgotten lock once it has expired");
    spread(&held, &urls).await;
    let before = sets(&urls);
    let c2 = c.clone();
    let next = tokio::spawn(async move { c2.acquire_timeout("w40", long, crate::NEVER).await });
    // Its first round has been refused by X on every node: it waits from then on.
    wait_until(WAIT, "C's next waiter made its first round", || {
        let n = sets_since(&urls, &before);
        async move { n.iter().all(|&n| n >= 1) }
    })
    .await;
    let x_token = held.token();
    held.release().await.unwrap();
    let won = tokio::time::timeout(WAIT, next)
        .await
        .expect("C's next waiter was woken by X's release (its timer is an hour away)")
        .unwrap()
        .unwrap();
    assert!(won.token() > x_token && x_token > forgotten_token);
    won.release().await.unwrap();
}
