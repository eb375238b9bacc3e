//! Waiting through faults: pub/sub connections killed while a waiter waits, a node known down;
//! and a node hung while a waiter reads the holder's key (w23).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::support::*;
use crate::{NEVER, crashed_holder, patient, pttls_of, sets_since, until_waiting};

/// An acquisition to hand to a task.
type Acquisition = BoxFuture<'static, Result<quorumlock::Lock, quorumlock::Error>>;

/// The waiter's pub/sub connections are killed on every node while it waits (its poll timer an
/// hour away): the subscriptions come back and the waiter still acquires after the release,
/// whether its notice was lost (the resubscription wakes it) or not.
#[tokio::test]
async fn w13_killed_subscriptions_still_acquire() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = client(&cluster);
    let waiter = patient(&cluster).await;
    let ttl = Duration::from_secs(60);
    let lock = holder.acquire("w13", ttl).await.unwrap();
    spread(&lock, &urls).await;
    let before = sets(&urls);
    let pttls = pttls_of(&urls);
    let task = tokio::spawn(async move { waiter.acquire_timeout("w13", ttl, NEVER).await });
    until_waiting(&urls, "w13", &before, &pttls).await;
    for u in &urls {
        let killed: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut conn(u))
            .expect("CLIENT KILL");
        assert_eq!(killed, 1, "one subscription per node");
    }
    let first = lock.token();
    lock.release().await.unwrap();
    let won = tokio::time::timeout(WAIT, task)
        .await
        .expect("the waiter acquires without its timer")
        .unwrap()
        .unwrap();
    assert!(won.token() > first);
    won.release().await.unwrap();
}

/// One node hung (SIGSTOP) and already known down (a background release to it timed out):
/// an acquisition round split two yes / two held does not wait for it until the node timeout
/// (10 s here), it gives up at once (safe: the round is undone), and the undo still goes to
/// the hung node (it may hold our value once it resumes).
#[tokio::test]
async fn w17_a_round_does_not_wait_for_a_node_known_down() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let node_timeout = Duration::from_secs(10);
    let locks = builder(&cluster)
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    warm(&locks).await;
    let ttl = Duration::from_secs(60);
    cluster.pause(0).unwrap();
    // Node 0 fails a call: the background release of a dropped lock times out there.
    drop(locks.acquire("w17-warm", ttl).await.unwrap());
    tokio::time::timeout(node_timeout * 2, locks.flush())
        .await
        .expect("flush is bounded by the node timeout");
    set_foreign(&urls[1], "w17", "someone-else", ttl);
    set_foreign(&urls[2], "w17", "someone-else", ttl);
    let before = (calls(&urls[3], "incr"), script_calls(&urls[3]));
    let refused = tokio::time::timeout(node_timeout / 2, locks.try_acquire("w17", ttl))
        .await
        .expect("the round did not wait for the node known down")
        .unwrap_err();
    assert!(
        matches!(refused, quorumlock::Error::NoQuorum { .. }),
        "{refused}"
    );
    cluster.resume(0).unwrap();
    locks.flush().await;
    assert_eq!(
        (calls(&urls[3], "incr"), script_calls(&urls[3])),
        (before.0 + 1, before.1 + 1),
        "the round and its undo where it said yes"
    );
    assert_eq!(value_on(&urls[3], "w17"), None);
    assert_eq!(
        value_on(&urls[0], "w17"),
        None,
        "undone on the resumed node too"
    );
}

/// A waiter refused by a held lock reads the holder's key (`PTTL`) on every node to learn when
/// it expires; with one node hung that read, and the waiter's registration (its marker and
/// subscriptions), are decided once a quorum has answered and do not wait out the hung node's
/// timeout. The waiter is connected to every node when node 4 hangs (so a call there is
/// bounded by the node timeout alone, not by the 1 s connect timeout a fresh client's first
/// call meets), and its node timeout, 30 s, is three times the test's whole bound: a waiter
/// that waited for the paused node would first try again at 30 s, long after the crashed
/// holder's 2 s key expired. Its poll timer is an hour away, so nothing but the read's figure
/// wakes it. Before the fix: `the waiter took over after the expiry: Elapsed(())`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w23_a_hung_node_does_not_hold_up_a_waiters_read_of_the_holder() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let first = crashed_holder(&cluster, "w23", Duration::from_secs(2)).await;
    let waiter = builder(&cluster)
        .node_timeout(WAIT * 3)
        .retry_delay(NEVER, Duration::ZERO)
        .build()
        .expect("valid config");
    warm(&waiter).await;
    cluster.pause(4).unwrap();
    let before = sets(&urls[..4]);
    let won = tokio::time::timeout(
        WAIT,
        waiter.acquire_timeout("w23", Duration::from_secs(10), NEVER),
    )
    .await
    .expect("the waiter took over after the expiry")
    .unwrap();
    assert!(won.token() > first);
    // As w20: refused, registered and refused again, then the round at the expiry (one more
    // if the expiry was read a round trip early).
    let rounds = sets_since(&urls[..4], &before);
    assert!(
        rounds.iter().all(|&r| r <= 4),
        "rounds per healthy node to take over with a node hung: {rounds:?}"
    );
    cluster.resume(4).unwrap();
    won.release().await.unwrap();
}

/// One client's eight tasks take a lock in turn, each waiting for it (its timer an hour away),
/// with node 4 hung, on the multi-thread runtime: every handover is made at a release's notice,
/// never at a timer, in at most two rounds (the first notice's, and the quorum's). Two faults
/// broke it. The next head's turn came at the quorum's wake of the release *before* the last
/// win (late, on another worker thread), so its round met the winner's own release half-way:
/// two yes, two held, the hung node failed, no quorum. And a round woken by the first notice
/// can meet the release half-way too (a releasing task's calls reach their connections one by
/// one); the round after it, woken by the quorum's notice, then found the first round's own
/// value still standing where it had been set (its undo, in the background, not yet sent),
/// failed again, and the waiter slept until its timer (1 s, or the holder's key expiry, in
/// `tools/compare`; an hour here). Before the fixes: `a handover waited for a timer:
/// Elapsed(())` (6 runs of 6); with the first alone, 8 of 12 runs, three at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w24_with_a_node_hung_every_handover_is_a_notice() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let live = &urls[..4];
    let locks = patient(&cluster).await;
    let ttl = Duration::from_secs(60);
    cluster.pause(4).unwrap();
    // Node 4 known down (a background release there timed out): no round waits for it.
    drop(locks.acquire("w24-down", ttl).await.unwrap());
    tokio::time::timeout(WAIT, locks.flush())
        .await
        .expect("flush is bounded by the node timeout");
    // Held until every task has queued: no task makes a round outside the queue on a free
    // lock (one failed for want of nodes would wait for its timer, an hour away).
    let first = locks.acquire("w24", ttl).await.unwrap();
    spread(&first, live).await;
    let before = sets(live);
    let pttls = pttls_of(live);
    let total = 1500;
    let done = Arc::new(AtomicU64::new(0));
    let acquisition = {
        let locks = locks.clone();
        move || -> Acquisition {
            let locks = locks.clone();
            Box::pin(async move { locks.acquire_timeout("w24", ttl, NEVER).await })
        }
    };
    let take_turns = |mut next: Acquisition| {
        let (acquisition, done) = (acquisition.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            loop {
                let lock = tokio::time::timeout(WAIT, next)
                    .await
                    .expect("a handover waited for a timer")
                    .expect("acquired");
                done.fetch_add(1, Ordering::SeqCst);
                lock.release().await.expect("released");
                if done.load(Ordering::SeqCst) >= total {
                    return;
                }
                next = acquisition();
            }
        })
    };
    // The first task queues once refused; the others queue behind it in their first poll.
    let mut tasks = vec![take_turns(acquisition())];
    until_waiting(live, "w24", &before, &pttls).await;
    for _ in 1..8 {
        let mut next = acquisition();
        assert!(futures::poll!(&mut next).is_pending(), "queued");
        tasks.push(take_turns(next));
    }
    first.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(WAIT * 6, task)
            .await
            .expect("the tasks end")
            .unwrap();
    }
    let n = done.load(Ordering::SeqCst);
    // The first task's two rounds before it queued, then at most two per handover.
    let rounds = sets_since(live, &before);
    assert!(
        rounds.iter().all(|&r| r <= 2 + 2 * n),
        "rounds per healthy node for {n} handovers: {rounds:?}"
    );
    cluster.resume(4).unwrap();
}
