//! A client never stays wedged once its nodes answer again, however starved its runtime was
//! while they were paused: the guard any breaker (fewer calls to a node that stopped
//! answering) must pass, on both runtimes.

use std::time::Duration;

use futures::future::join_all;

use crate::support::*;

/// Short, so that the runtime's block below outlasts it several times.
const TIMEOUT: Duration = Duration::from_millis(100);

/// Every node paused while acquisitions wait on all of them; the runtime blocked past the node
/// timeout (its timers and the calls' answers all late at once); the nodes resumed. The client
/// must take locks again, and every node must answer it.
async fn resumes_after_a_starved_pause(blockers: usize) {
    let mut cluster = cluster(3);
    let locks = builder(&cluster).node_timeout(TIMEOUT).build().unwrap();
    warm(&locks).await;
    for i in 0..3 {
        cluster.pause(i).unwrap();
    }
    // Calls given up for the nodes' silence: the nodes are known down.
    for _ in 0..3 {
        let err = locks.try_acquire("opener", TTL).await.unwrap_err();
        assert!(err.is_no_quorum(), "{err}");
    }
    let keys: Vec<String> = (0..64).map(|i| format!("starved-{i}")).collect();
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move {
            join_all(keys.iter().map(|k| locks.try_acquire(k, TTL))).await;
        })
    };
    // Let the calls reach the paused nodes' connections, then starve the runtime: every worker
    // (and this thread) blocked for several node timeouts.
    tokio::time::sleep(TIMEOUT / 2).await;
    for _ in 0..blockers {
        tokio::spawn(async { std::thread::sleep(TIMEOUT * 4) });
    }
    std::thread::sleep(TIMEOUT * 4);
    for i in 0..3 {
        cluster.resume(i).unwrap();
    }
    tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the acquisitions of the pause end")
        .unwrap();
    let start = tokio::time::Instant::now();
    loop {
        let last = match locks.try_acquire("after", TTL).await {
            Ok(lock) => {
                let _ = lock.release().await;
                break;
            }
            Err(e) => e,
        };
        assert!(
            start.elapsed() < WAIT,
            "wedged: no acquisition succeeded {WAIT:?} after the nodes resumed; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    warm(&locks).await;
}

#[tokio::test]
async fn r1_no_wedge_after_a_starved_pause_current_thread() {
    resumes_after_a_starved_pause(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_no_wedge_after_a_starved_pause_multi_thread() {
    resumes_after_a_starved_pause(2).await;
}

/// One node paused: once it has been silent for a node timeout with calls outstanding,
/// acquisitions send it nothing (they win on the other two) instead of queueing calls behind
/// the unanswered ones; resumed, it takes them again. Counted by what the nodes received: the
/// healthy nodes got every acquisition, the paused one not those made while it was silent.
async fn a_silent_node_is_sent_nothing_until_it_answers() {
    const HELD_BACK: u64 = 200;
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster).node_timeout(TIMEOUT).build().unwrap();
    warm(&locks).await;
    let before = sets(&urls);
    cluster.pause(0).unwrap();
    // Calls queued to the paused node until it has been silent a while.
    let start = tokio::time::Instant::now();
    let mut early = 0;
    while start.elapsed() < TIMEOUT * 2 {
        early += 1;
        let lock = locks.try_acquire(&format!("early-{early}"), TTL).await;
        lock.expect("a quorum of healthy nodes")
            .release()
            .await
            .expect("released");
    }
    for i in 0..HELD_BACK {
        let lock = locks.try_acquire(&format!("held-back-{i}"), TTL).await;
        lock.expect("a quorum of healthy nodes")
            .release()
            .await
            .expect("released");
    }
    cluster.resume(0).unwrap();
    warm(&locks).await;
    // Acquisitions reach the node again: its own answer sets the value there.
    let start = tokio::time::Instant::now();
    for attempt in 0.. {
        let key = format!("after-{attempt}");
        let lock = locks.try_acquire(&key, TTL).await.expect("healthy nodes");
        let reached = value_on(&urls[0], &key).is_some();
        lock.release().await.expect("released");
        if reached {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "acquisitions still held back from the node {WAIT:?} after it resumed"
        );
    }
    let after = sets(&urls);
    let got: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        got[0] + HELD_BACK <= got[1].min(got[2]),
        "SET calls received since the pause {got:?} ({early} acquisitions before the {HELD_BACK} \
         held back): the paused node was sent acquisitions while silent"
    );
}

#[tokio::test]
async fn r3_a_silent_node_is_held_back_and_recovers_current_thread() {
    a_silent_node_is_sent_nothing_until_it_answers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_a_silent_node_is_held_back_and_recovers_multi_thread() {
    a_silent_node_is_sent_nothing_until_it_answers().await;
}
