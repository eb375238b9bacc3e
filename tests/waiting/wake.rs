//! A release wakes the waiters: across clients, only when someone waits, when it reaches the
//! nodes unevenly, and a crashed holder's lock is taken at its expiry.

use crate::proxy;

use std::time::Duration;

use crate::support::*;
use crate::{NEVER, crashed_holder, patient, pttls_of, sets_since, until_waiting};
use quorumlock::Redlock;

/// A release by another client wakes the waiter at once: its own poll timer is an hour away,
/// and it acquires after the release within the test's bounded wait.
#[tokio::test]
async fn w10_a_release_wakes_a_waiter_of_another_client() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = client(&cluster);
    let waiter = patient(&cluster).await;
    let ttl = Duration::from_secs(60);
    let lock = holder.acquire("w10", ttl).await.unwrap();
    spread(&lock, &urls).await;
    let before = sets(&urls);
    let pttls = pttls_of(&urls);
    let task = tokio::spawn(async move { waiter.acquire_timeout("w10", ttl, NEVER).await });
    until_waiting(&urls, "w10", &before, &pttls).await;
    let first = lock.token();
    lock.release().await.unwrap();
    let won = tokio::time::timeout(WAIT, task)
        .await
        .expect("the waiter was woken (its timer is an hour away)")
        .unwrap()
        .unwrap();
    assert!(won.token() > first, "a later holder, a later token");
    won.release().await.unwrap();
}

/// A release with nobody waiting publishes nothing; with a waiter, each node that deletes the
/// lock publishes one notice.
#[tokio::test]
async fn w11_only_a_waited_for_release_publishes() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = client(&cluster);
    let ttl = Duration::from_secs(60);
    for _ in 0..5 {
        let lock = holder.acquire("w11", ttl).await.unwrap();
        lock.release().await.unwrap();
    }
    holder.flush().await;
    assert!(
        urls.iter().all(|u| calls(u, "publish") == 0),
        "an uncontended release published"
    );
    let waiter = patient(&cluster).await;
    let lock = holder.acquire("w11", ttl).await.unwrap();
    spread(&lock, &urls).await;
    let before = sets(&urls);
    let pttls = pttls_of(&urls);
    let task = tokio::spawn(async move { waiter.acquire_timeout("w11", ttl, NEVER).await });
    until_waiting(&urls, "w11", &before, &pttls).await;
    lock.release().await.unwrap();
    holder.flush().await;
    let won = tokio::time::timeout(WAIT, task)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    assert!(
        urls.iter().all(|u| calls(u, "publish") == 1),
        "one notice per node"
    );
    won.release().await.unwrap();
}

/// A holder that never releases (it crashed: its lock expires, which publishes nothing): the
/// waiter's poll timer acquires the lock once it has expired.
#[tokio::test]
async fn w12_without_a_notice_polling_acquires() {
    let cluster = cluster(5);
    let holder = client(&cluster);
    let waiter = builder(&cluster)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(50))
        .build()
        .unwrap();
    let lock = holder.acquire("w12", Duration::from_secs(2)).await.unwrap();
    let first = lock.token();
    lock.forget();
    let won = waiter
        .acquire_timeout("w12", Duration::from_secs(10), WAIT)
        .await
        .expect("polling acquires after the expiry");
    assert!(won.token() > first);
    won.release().await.unwrap();
}

/// A release reaches a waiter through its notices even when the first notice comes before the
/// release has reached a quorum: the holder reaches node 0 directly and the four others through
/// proxies that add 100 ms each way, so node 0 announces the release first and the waiter's
/// round, made at once, is refused by the four nodes the release has not reached yet. The
/// waiter then acts again once a quorum of nodes has announced the release, and wins. Before,
/// the later notices of the same release were dropped as copies, and the waiter slept until its
/// holder timer fired (the key's `PTTL`, capped at 1 s by default; this waiter's retry delay is
/// an hour, which lifts the cap): `the waiter took the released lock: Elapsed(())` after 10 s.
/// Counted, not timed: at most one `PTTL` read per node after the release (the one after the
/// refused round); a second would mean the waiter woke by its timer, not by the notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w22_a_release_that_reaches_the_nodes_unevenly_reaches_the_waiter() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let mut slow = Vec::new();
    for url in &urls[1..] {
        let p = proxy::Proxy::for_url(url).await.unwrap();
        p.set_latency(Duration::from_millis(100));
        slow.push(p);
    }
    let mut through = vec![urls[0].clone()];
    through.extend(slow.iter().map(|p| p.url()));
    let holder = Redlock::builder(through)
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(60);
    let lock = holder.acquire("w22", ttl).await.unwrap();
    spread(&lock, &urls).await;
    let waiter = patient(&cluster).await;
    let before = sets(&urls);
    let pttls = pttls_of(&urls);
    let waiting = tokio::spawn(async move { waiter.acquire_timeout("w22", ttl, WAIT).await });
    until_waiting(&urls, "w22", &before, &pttls).await;
    let pttl_before: Vec<u64> = urls.iter().map(|u| calls(u, "pttl")).collect();
    lock.release().await.unwrap();
    let won = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the waiter took the released lock")
        .unwrap()
        .expect("the waiter took the released lock");
    let reads: Vec<u64> = urls
        .iter()
        .zip(&pttl_before)
        .map(|(u, b)| calls(u, "pttl") - b)
        .collect();
    assert!(
        reads.iter().all(|&r| r <= 1),
        "PTTL reads per node after the release: {reads:?} (a second one means the waiter \
         waited for its timer, not for the release's notices)"
    );
    won.release().await.unwrap();
}

/// A crashed holder (its lock forgotten, left to expire, which publishes nothing) is taken over
/// by a waiter whose retry timer is an hour away: its timer follows the holder's key, waking it
/// when the key expires. Counted in rounds: two before it waits (refused, registered, refused),
/// then the one that wins after the expiry; one more is allowed for a wake a millisecond early
/// (`PTTL` is in whole milliseconds). No timing enters the bound.
#[tokio::test]
async fn w20_a_crashed_holders_lock_is_taken_at_its_expiry() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let waiter = patient(&cluster).await;
    let first = crashed_holder(&cluster, "w20", Duration::from_secs(3)).await;
    // When the key expires on the node where it expires last (for the printed takeover
    // latency only: nothing is asserted on time).
    let expiry = urls
        .iter()
        .map(|u| {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(lock_key("w20"))
                .query(&mut conn(u))
                .expect("PTTL");
            pttl.max(0) as u64
        })
        .max()
        .unwrap();
    let expires_at = tokio::time::Instant::now() + Duration::from_millis(expiry);
    let before = sets(&urls);
    let won = tokio::time::timeout(
        WAIT,
        waiter.acquire_timeout("w20", Duration::from_secs(10), NEVER),
    )
    .await
    .expect("the waiter took over after the expiry (its poll timer is an hour away)")
    .unwrap();
    let taken = tokio::time::Instant::now().saturating_duration_since(expires_at);
    assert!(won.token() > first);
    let rounds = sets_since(&urls, &before);
    eprintln!("taken over {taken:?} after the last node's expiry; rounds per node {rounds:?}");
    assert!(
        rounds.iter().all(|&r| r <= 4),
        "rounds per node to take over a crashed holder's lock: {rounds:?}"
    );
    won.release().await.unwrap();
}
