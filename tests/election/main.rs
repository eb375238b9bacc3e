//! Leader election against real servers, one module per topic: campaigns, one leader at a time
//! among many candidates, split votes and stepping down when a quorum of nodes dies
//! (`campaign`); handover after resign (notified) and after a crash (a killed child process:
//! about one ttl), and the poll fallback when no notification comes (`handover`); the quorum
//! read of who leads, the observe stream and the health check, reads bounded by the node
//! timeout (`observe`); subscriptions that come back after a node restarts, pauses or goes
//! silent (`subscription`); and run-once scheduling on top of the lock (`run_once`). What the
//! election modules share is below.
#![allow(unreachable_pub)]

#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/mod.rs"]
mod support;

mod campaign;
mod handover;
mod observe;
mod run_once;
mod schedule;
mod standby;
mod subscription;

use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use quorumlock::{Election, Error, Leadership, Redlock};
use redis::aio::MultiplexedConnection;
use support::*;

fn election(cluster: &LocalCluster, name: &str, id: &str, ttl: Duration) -> Election {
    Election::builder(client(cluster), name)
        .ttl(ttl)
        .candidate(id)
        .build()
        .expect("valid election")
}

/// Candidate "b" of election `name`, polling every `poll` when no notice comes.
fn standby(locks: Redlock, name: &str, ttl: Duration, poll: Duration) -> Election {
    Election::builder(locks, name)
        .ttl(ttl)
        .candidate("b")
        .poll_interval(poll)
        .build()
        .unwrap()
}

/// An async connection to one node (never a blocking call inside a test's runtime).
async fn conn(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).expect("url");
    tokio::time::timeout(
        WAIT,
        client.get_multiplexed_async_connection_with_config(&support::direct_config()),
    )
    .await
    .expect("connected within the wait")
    .expect("connect")
}

/// One command on one node, bounded by the wait.
async fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let mut c = conn(url).await;
    tokio::time::timeout(WAIT, cmd.query_async(&mut c))
        .await
        .expect("answered within the wait")
        .expect("query")
}

/// How many connections subscribe to `channel` on one node.
async fn subscribers(url: &str, channel: &str) -> i64 {
    let (_, n): (String, i64) = query(url, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel)).await;
    n
}

/// The value of `key` on one node.
async fn value_of(url: &str, key: &str) -> Option<String> {
    query(url, redis::cmd("GET").arg(key)).await
}

fn channel(name: &str) -> String {
    format!("quorumlock:{{{name}}}:events")
}

/// Waits until at least `n` connections subscribe to the election's channel on every node.
async fn subscribed(urls: &[String], name: &str, n: i64) {
    wait_until(WAIT, "every candidate subscribed on every node", || async {
        for u in urls {
            if subscribers(u, &channel(name)).await < n {
                return false;
            }
        }
        true
    })
    .await;
}

/// Waits until campaigns on `e` have stood by `n` times in all: an attempt was refused, the
/// lock's state read, and the standby waits for a notice or its timer.
async fn standing_by(e: &Election, n: u64) {
    tokio::time::timeout(WAIT, e.wait_standing_by(n))
        .await
        .unwrap_or_else(|_| panic!("{} did not stand by {n} times", e.candidate()));
}

/// Waits for a spawned campaign to win, for at most `within`.
async fn won(
    campaign: tokio::task::JoinHandle<Result<Leadership, Error>>,
    within: Duration,
) -> Leadership {
    tokio::time::timeout(within, campaign)
        .await
        .expect("the standby leads within the wait")
        .expect("campaign task")
        .expect("campaign")
}

/// Sets the election's fencing counter on every node, so that its next token is `n + 1`.
async fn set_counters(urls: &[String], name: &str, n: u64) {
    for u in urls {
        let () = query(u, redis::cmd("SET").arg(fence_key(name)).arg(n)).await;
    }
}

/// Publishes a resign notice on one node only: a standby subscribed there wakes, attempts and
/// stands by again. `token` must be above what the standby saw and below the real terms'.
async fn probe_notice(url: &str, name: &str, token: u64) {
    let _: i64 = query(
        url,
        redis::cmd("PUBLISH")
            .arg(channel(name))
            .arg(format!("resigned {token} probe")),
    )
    .await;
}

/// Waits until the election's leader record is gone from every node (a resign deletes it where
/// it is ours; a node it reaches after the resign returned is waited for).
async fn record_gone_everywhere(urls: &[String], name: &str) {
    let record = format!("quorumlock:{{{name}}}:leader");
    wait_until(WAIT, "leader record deleted everywhere", || async {
        for u in urls {
            if value_of(u, &record).await.is_some() {
                return false;
            }
        }
        true
    })
    .await;
}
