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
