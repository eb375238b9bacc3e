//! A standby's subscriptions come back after a node restarts, pauses or goes silent.

use std::time::Duration;

use crate::proxy::Proxy;
use crate::support::*;
use crate::{
    channel, election, probe_notice, set_counters, standby, standing_by, subscribed, subscribers,
    won,
};
use quorumlock::Redlock;

/// A standby whose subscription on node 0 is broken by `fault` gets it back: the resubscription
/// wakes it (it attempts and stands by again), and a notice published on node 0 alone reaches
/// it. Then a resign still hands over at once.
async fn subscription_recovers(fault: Fault) {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let name = "e70";
    // Terms' tokens above the probes' (a standby acts on a resign notice above the last one).
    set_counters(&urls, name, 1000).await;
    // The standby reaches node 0 through a proxy (to count its connections, or cut them).
    let proxy = Proxy::for_url(&urls[0]).await.unwrap();
    let mut b_urls = urls.clone();
    b_urls[0] = proxy.url();
    // Long timers: within the test only notices (or resubscriptions) wake the standby.
    let ttl = 3 * WAIT;
    let a = election(&cluster, name, "a", ttl);
    let b_locks = Redlock::builder(&b_urls)
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .unwrap();
    let b = standby(b_locks, name, ttl, ttl);
    let leader = a.campaign().await.unwrap();
    let standby = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    subscribed(&urls, name, 2).await;
    standing_by(&b, 1).await;
    let stood = b.standing_by_count();
    // The probe reaches the standby through node 0 now.
    probe_notice(&urls[0], name, 1).await;
    standing_by(&b, stood + 1).await;

    let stood = b.standing_by_count();
    let accepted = proxy.accepted();
    match fault {
        Fault::Restart => cluster.restart(0).unwrap(),
        Fault::Pause | Fault::Blackhole => {
            if fault == Fault::Pause {
                cluster.pause(0).unwrap();
            } else {
                proxy.set_blackhole(true);
            }
            // The dead subscription is noticed (no answer to its PING) and made again: a new
            // connection to node 0, while the old one never closed.
            wait_until(
                WAIT * 2,
                "the standby reconnects to the silent node",
                || async { proxy.accepted() > accepted },
            )
            .await;
            if fault == Fault::Pause {
                cluster.resume(0).unwrap();
            } else {
                proxy.heal();
            }
        }
    }
    // Resubscribed: the standby wakes, attempts (refused) and stands by again.
    tokio::time::timeout(WAIT * 2, b.wait_standing_by(stood + 1))
        .await
        .expect("the resubscription wakes the standby");
    assert!(!standby.is_finished(), "a still leads");
    wait_until(
        WAIT,
        "both candidates subscribed on node 0 again",
        || async { subscribers(&urls[0], &channel(name)).await >= 2 },
    )
    .await;
    let stood = b.standing_by_count();
    probe_notice(&urls[0], name, 2).await;
    standing_by(&b, stood + 1).await;

    leader.resign().await.unwrap();
    // Woken by the resubscribed notice: the poll is 30 s away, three times the wait.
    let next = won(standby, WAIT).await;
    next.resign().await.unwrap();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The node restarts: the subscription's connection is closed.
    Restart,
    /// The node is paused (SIGSTOP) for a while: the connection stays open, nothing answers.
    Pause,
    /// The link to the node carries nothing for a while: no FIN, no RST.
    Blackhole,
}

#[tokio::test]
async fn t70_subscription_recovers_after_a_node_restart() {
    subscription_recovers(Fault::Restart).await;
}

#[tokio::test]
async fn t71_subscription_recovers_after_a_node_pause() {
    subscription_recovers(Fault::Pause).await;
}

#[tokio::test]
async fn t72_subscription_recovers_from_a_silent_link() {
    subscription_recovers(Fault::Blackhole).await;
}
