//! Pins issue 12 item 5: a reader that does not reach every node never reports "nobody" while the
//! nodes it missed could complete a quorum for some value. With the leader's key on nodes
//! {0,1,2} and an observer that reaches {1,2,3,4}, `leader()` is `Err(NoQuorum)`, `health()`
//! and `observe()` say unknown, and `status()` says the holder is unknown; once the seat is
//! really empty, the same partial view reports it vacant.

use std::time::Duration;

use futures::StreamExt;
use quorumlock::{Election, Health, Observation, Redlock};

use crate::proxy::ProxyNet;
use crate::support::{NODE_TIMEOUT, TTL, WAIT, cluster, wait_until};

fn election(urls: Vec<String>, id: &str) -> (Redlock, Election) {
    let locks = Redlock::builder(urls)
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .unwrap();
    let e = Election::builder(locks.clone(), "seat")
        .ttl(TTL)
        .candidate(id)
        .build()
        .unwrap();
    (locks, e)
}

#[tokio::test]
async fn an_observer_missing_a_holding_node_reports_unknown_not_vacant() {
    let cluster = cluster(5);
    let net = ProxyNet::start(2, &cluster.urls()).await.unwrap();
    // The leader reaches {0,1,2} only; its term stands on exactly those nodes.
    net.partition(0, &[0, 1, 2]);
    let (_, leader) = election(net.urls(0), "leader");
    let term = leader.campaign().await.unwrap();
    // The observer reaches {1,2,3,4}: it sees the term on two nodes, and node 0 could be the
    // third.
    net.partition(1, &[1, 2, 3, 4]);
    let (observer_locks, observer) = election(net.urls(1), "observer");

    let status = observer_locks.status("seat").await.unwrap();
    assert_eq!(status.answered(), 4);
    assert_eq!(status.holder(), None);
    assert_eq!(status.holder_view(), quorumlock::HolderView::Unknown);

    let leader_read = observer.leader().await;
    assert!(
        leader_read.as_ref().is_err_and(|e| e.is_no_quorum()),
        "the seat is not vacant from a view that misses a holding node: {leader_read:?}"
    );
    let health = observer.health().await;
    assert!(matches!(health, Health::Unknown { .. }), "health: {health}");
    let mut stream = Box::pin(observer.observe());
    let first = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("observe yields")
        .expect("stream item");
    assert!(
        matches!(first, Observation::Unknown(_)),
        "observe: {first:?}"
    );

    // Once the term is over, the same partial view is enough to say nobody leads: no value
    // stands on more than one reachable node... none at all, here.
    term.resign().await.unwrap();
    wait_until(WAIT, "the observer sees the seat vacant", || async {
        matches!(observer.leader().await, Ok(None))
    })
    .await;
    let status = observer_locks.status("seat").await.unwrap();
    assert_eq!(status.holder_view(), quorumlock::HolderView::Vacant);
}
