//! Item 1: a holder that got `Ok` from `extend` held the lock without a gap. An extension whose
//! calls reach the nodes only after the lock's deadline (the keys expired there, another client
//! acquired and released meanwhile) is not `Ok`, does not re-create the key on any node, and a
//! lock seen lost (`is_lost()`) never looks valid again.

use std::time::Duration;

use quorumlock::{Error, LostReason, Redlock};

use crate::proxy::Proxy;
use crate::support::{WAIT, client, cluster, holders, value_on, wait_until, warm};

/// The lock's ttl: its keys expire on the nodes about this long after the acquisition.
const SHORT_TTL: Duration = Duration::from_millis(1000);
/// Added to every chunk each way between the holder and the nodes once it holds the lock: the
/// extension's calls land this long after they were sent, long after the keys expired.
const LATENCY: Duration = Duration::from_millis(1000);
/// The extension's ttl and the holder's node timeout: long enough that the late answers still
/// arrive inside the round's node timeout and budget (what let the old code accept them).
const LONG: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_landing_after_the_deadline_neither_succeeds_nor_revives_the_lock() {
    let c = cluster(3);
    let urls = c.urls();
    let mut proxies = Vec::new();
    for url in &urls {
        proxies.push(Proxy::for_url(url).await.expect("proxy"));
    }
    // The holder reaches the nodes through the proxies, the other client directly.
    let a = Redlock::builder(proxies.iter().map(Proxy::url))
        .node_timeout(LONG)
        .build()
        .expect("config");
    let b = client(&c);
    warm(&a).await;
    warm(&b).await;
    let lock = a.try_acquire("late", SHORT_TTL).await.expect("acquire");
    for p in &proxies {
        p.set_latency(LATENCY);
    }
    // The extension starts shortly before the deadline (a margin for a loaded machine's
    // timers); its calls reach the nodes ~LATENCY later, long after the keys expired.
    tokio::time::sleep(lock.validity().saturating_sub(Duration::from_millis(200))).await;
    assert!(!lock.is_lost(), "still valid when the extension starts");
    let other = async {
        // Meanwhile the keys expire on the nodes, and another client acquires and releases.
        wait_until(WAIT, "the holder's keys expired on every node", || async {
            holders(&urls, "late") == 0
        })
        .await;
        let other = b
            .try_acquire("late", LONG)
            .await
            .expect("free after expiry");
        let token = other.token();
        other.release().await.expect("release");
        token
    };
    let (extended, other_token) = tokio::join!(lock.extend(LONG), other);
    assert!(
        other_token > lock.token(),
        "the other acquisition came after ours"
    );
    assert!(
        matches!(
            &extended,
            Err(Error::Lost {
                reason: LostReason::Expired,
                ..
            })
        ),
        "an extension that reached no quorum before the deadline must be Lost(Expired): {extended:?}"
    );
    assert!(lock.is_lost(), "lost after the failed extension");
    // A status read travels behind the extension on each of the holder's connections: once
    // every node answered it, every late extension call has run.
    wait_until(
        WAIT * 2,
        "the holder's late calls have run on every node",
        || async {
            a.status("late")
                .await
                .is_ok_and(|s| s.answered() == urls.len())
        },
    )
    .await;
    for url in &urls {
        assert_eq!(
            value_on(url, "late"),
            None,
            "the late extension re-created the lock on {url}"
        );
    }
    assert!(lock.is_lost(), "a lost lock never looks valid again");
    assert!(lock.validity().is_zero());
}
