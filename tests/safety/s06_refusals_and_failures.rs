//! Pins issue 12 item 6: `Held` (acquire) and `Lost(NotOwner)` (extend) are reported only when the
//! refusals alone make a quorum impossible (`refusals > n - quorum`). A round that fails because
//! nodes failed, with a refusal or two among the answers, is `NoQuorum`, naming the failed nodes
//! and the refusals, and a lock that is still valid stays held.

use quorumlock::{Error, NodeError};

use crate::support::{TTL, builder, client, cluster, set_foreign, spread, warm};

#[tokio::test]
async fn one_refusal_and_two_dead_nodes_is_no_quorum_not_held() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    warm(&locks).await;
    // A stale foreign key on node 2 (a crashed holder's, say), nodes 3 and 4 down.
    set_foreign(&urls[2], "job", "someone-else", TTL);
    cluster.kill(3).unwrap();
    cluster.kill(4).unwrap();

    let err = locks.try_acquire("job", TTL).await.unwrap_err();
    assert!(
        err.is_no_quorum(),
        "two dead nodes and one refusal must read as an outage, not as a holder: {err}"
    );
    let Error::NoQuorum { failures, .. } = &err else {
        unreachable!()
    };
    for i in [3, 4] {
        assert!(
            failures
                .iter()
                .any(|f| f.node == urls[i] && !matches!(f.cause, NodeError::HeldByAnother)),
            "the dead node {} is named: {err}",
            urls[i]
        );
    }
    assert!(
        failures
            .iter()
            .any(|f| f.node == urls[2] && matches!(f.cause, NodeError::HeldByAnother)),
        "the refusal of node 2 is named: {err}"
    );
    // With retries too.
    assert!(locks.acquire("job", TTL).await.unwrap_err().is_no_quorum());
}

#[tokio::test]
async fn extension_with_one_refusal_and_two_failures_keeps_a_valid_lock() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = builder(&cluster).retry_count(0).build().unwrap();
    warm(&locks).await;
    let lock = locks.try_acquire("job", TTL).await.unwrap();
    spread(&lock, &urls).await;
    // Nodes 0-2 hold our value; node 3 now holds a foreign one, node 4 is down and node 0
    // does not answer in time.
    set_foreign(&urls[3], "job", "someone-else", TTL);
    cluster.kill(4).unwrap();
    cluster.pause(0).unwrap();

    let err = lock.extend(TTL).await.unwrap_err();
    assert!(
        err.is_no_quorum(),
        "an extension that failed for lack of answers is not a loss: {err}"
    );
    assert!(
        !lock.is_lost(),
        "the lock is still valid and a quorum (0-2) holds it"
    );

    cluster.resume(0).unwrap();
    lock.extend(TTL)
        .await
        .expect("extends again once node 0 answers");
    assert!(!lock.is_lost());
    lock.release().await.unwrap();
}
