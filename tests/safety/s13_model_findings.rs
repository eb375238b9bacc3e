//! Counterexamples the model checker (issue 13, `docs/verification.md`) found in the library,
//! replayed against real `redis-server` processes.
//!
//! Pinned here: a lock's validity is counted from the end of its round (`ttl − elapsed − drift`
//! from then, i.e. a deadline of `start + ttl − drift`), not from its start. Counted from the
//! start, `elapsed` was subtracted twice: a round slower than `(ttl − drift) / 2` returned
//! `Ok(lock)` already past its deadline, and an extension cut its deadline short the same way.

use std::time::{Duration, Instant};

use crate::proxy::Proxy;
use crate::support::{cluster, warm};

/// Added each way on every link: a round trip of about 600 ms against a 1 s ttl.
const LATENCY: Duration = Duration::from_millis(300);
/// The ttl of the scenarios: the latency makes a round take more than half of it.
const SHORT_TTL: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_round_counts_its_validity_from_its_end() {
    let (_cluster, proxies, locks) = behind_proxies().await;
    for p in &proxies {
        p.set_latency(LATENCY);
    }

    let before = Instant::now();
    let lock = locks
        .try_acquire("slow", SHORT_TTL)
        .await
        .expect("acquired");
    let acquired = Instant::now();
    let round = acquired - before;
    assert!(
        round > SHORT_TTL / 2,
        "the round ({round:?}) must take more than half the ttl for this test to mean anything"
    );
    // Safety: never more than what the nodes still hold, counted from before the round.
    let left_on_nodes = (before + SHORT_TTL).saturating_duration_since(acquired);
    assert!(
        lock.validity() <= left_on_nodes,
        "validity {:?} outlives the keys ({left_on_nodes:?} left)",
        lock.validity()
    );
    // And not less than that minus the drift allowance (1% + 2 ms) and some scheduling slack.
    let floor = left_on_nodes.saturating_sub(Duration::from_millis(12 + 50));
    assert!(
        !lock.is_lost() && lock.validity() >= floor,
        "a lock acquired in a {round:?} round with a {SHORT_TTL:?} ttl is valid for only {:?} \
         (at least {floor:?} expected: elapsed was subtracted twice)",
        lock.validity()
    );

    for p in &proxies {
        p.set_latency(Duration::ZERO);
    }
    lock.release().await.expect("released");
}

/// An extension in a round slower than half its ttl: a 3 s lock extended to 1 s while every
/// link adds 300 ms each way. Counted from the round's start its deadline was already behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_extension_counts_its_validity_from_its_end() {
    let (_cluster, proxies, locks) = behind_proxies().await;
    let lock = locks
        .try_acquire("slow-extend", 3 * SHORT_TTL)
        .await
        .expect("acquired");
    for p in &proxies {
        p.set_latency(LATENCY);
    }
    let before = Instant::now();
    let extended = lock.extend(SHORT_TTL).await.expect("extended");
    let round = before.elapsed();
    assert!(
        round > SHORT_TTL / 2,
        "the round ({round:?}) must take more than half the ttl"
    );
    let left_on_nodes = (before + SHORT_TTL).saturating_duration_since(Instant::now());
    assert!(
        lock.validity() <= left_on_nodes && extended <= left_on_nodes + round,
        "extension validity {:?} outlives the keys ({left_on_nodes:?} left)",
        lock.validity()
    );
    let floor = left_on_nodes.saturating_sub(Duration::from_millis(12 + 50));
    assert!(
        !lock.is_lost() && lock.validity() >= floor,
        "an extension in a {round:?} round left only {:?} (at least {floor:?} expected)",
        lock.validity()
    );
    for p in &proxies {
        p.set_latency(Duration::ZERO);
    }
    lock.release().await.expect("released");
}

/// Three nodes behind proxies (no latency yet) and a warmed client whose node timeout outlasts
/// the latency the tests add.
async fn behind_proxies() -> (crate::support::Cluster, Vec<Proxy>, quorumlock::Redlock) {
    let c = cluster(3);
    let mut proxies = Vec::new();
    for url in c.urls() {
        proxies.push(Proxy::for_url(&url).await.expect("proxy"));
    }
    let locks = quorumlock::Redlock::builder(proxies.iter().map(Proxy::url))
        .node_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    warm(&locks).await;
    (c, proxies, locks)
}
