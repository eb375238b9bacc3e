//! Waiting for a held lock against real servers, one module per topic: a release wakes the
//! waiters (pub/sub across clients) and uncontended releases publish nothing (`wake`); polling
//! still acquires when notices are lost and a node down does not hold a round up (`faults`);
//! one client's waiters take turns and contenders with exactly a quorum reachable do not starve
//! (`turns`); what waiting costs the nodes, in rounds (`rounds`); and the ignored measurements
//! for `docs/benchmarks.md` (`measure`). What the modules share is below.
#![allow(unreachable_pub)]

#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/mod.rs"]
mod support;

mod faults;
mod measure;
mod rounds;
mod turns;
mod wake;

use std::time::Duration;

use quorumlock::Redlock;
use support::*;

/// A poll interval no test waits for: a waiter that acquires within the test's bounded wait
/// was woken by something other than its timer.
const NEVER: Duration = Duration::from_secs(3600);

/// Subscribers of `key`'s release channel on one node.
fn subscribers(url: &str, key: &str) -> u64 {
    let (_, n): (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(format!("{}:waiters", lock_key(key)))
        .query(&mut conn(url))
        .expect("PUBSUB NUMSUB");
    n
}

fn marker_on(url: &str, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(format!("{}:waiters", lock_key(key)))
        .query::<u64>(&mut conn(url))
        .expect("EXISTS")
        == 1
}

/// A client whose waiters never poll within a test, connected to every node (a first round
/// that timed out connecting would not be refused but fail, and its retry is an hour away).
async fn patient(cluster: &quorumlock::testkit::LocalCluster) -> Redlock {
    let locks = builder(cluster)
        .retry_delay(NEVER, Duration::ZERO)
        .build()
        .expect("valid config");
    warm(&locks).await;
    locks
}

/// Waits until a waiter of another client has made its round (refused), registered and read
/// the holder's key (`pttls`: each node's `PTTL` calls before it started), and is subscribed
/// with its marker set on every node: from then on it only waits. Each acquire round is one `SET` per node, refused or not, in either form (a round
/// refused by a holder on every node has no undo: w16); `before` counts those made so far
/// ([`sets`]).
async fn until_waiting(urls: &[String], key: &str, before: &[u64], pttls: &[u64]) {
    let state = || {
        urls.iter()
            .zip(before)
            .zip(pttls)
            .map(|((u, b), p)| {
                (
                    calls(u, "set").saturating_sub(*b),
                    subscribers(u, key),
                    marker_on(u, key) && calls(u, "pttl") > *p,
                )
            })
            .collect::<Vec<_>>()
    };
    let ready = |s: &[(u64, u64, bool)]| s.iter().all(|&(r, n, m)| r >= 1 && n >= 1 && m);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = state();
        if ready(&s) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter is not waiting, subscribed and marked: (rounds, subscribers, marker and holder read) per node {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Per node, how many `PTTL`s have run (those our scripts call included).
fn pttls_of(urls: &[String]) -> Vec<u64> {
    urls.iter().map(|u| calls(u, "pttl")).collect()
}

/// Per node, how many more `SET`s than in `before`.
fn sets_since(urls: &[String], before: &[u64]) -> Vec<u64> {
    sets(urls)
        .iter()
        .zip(before)
        .map(|(now, b)| now - b)
        .collect()
}

/// A holder that crashed: its lock on `key` (with `ttl`) stands on every node and is never
/// released or extended; returns its fencing token.
async fn crashed_holder(
    cluster: &quorumlock::testkit::LocalCluster,
    key: &str,
    ttl: Duration,
) -> quorumlock::FencingToken {
    let holder = client(cluster);
    warm(&holder).await;
    let lock = holder.acquire(key, ttl).await.unwrap();
    spread(&lock, &cluster.urls()).await;
    let token = lock.token();
    lock.forget();
    token
}
