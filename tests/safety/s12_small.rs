//! Item 12, the smaller findings: the validity is computed from the ttl the nodes were actually
//! sent (whole milliseconds); user-supplied durations never overflow an `Instant` (a typed error
//! or a saturated deadline, never a panic); a call of a closed round that a node answered with
//! `NOSCRIPT` is not re-sent as `EVAL` after the round's verdict.

use std::time::Duration;

use quorumlock::{ConfigError, Election, Error, Redlock};

use crate::proxy::Proxy;
use crate::support::{WAIT, builder, client, cluster, conn, value_on, wait_until, warm};

/// A ttl with a sub-millisecond part: `PX` carries 1000 of it.
const FRACTIONAL_TTL: Duration = Duration::from_micros(1_000_999);
const SENT: Duration = Duration::from_millis(1000);

#[tokio::test]
async fn validity_counts_only_the_whole_milliseconds_sent_as_px() {
    let c = cluster(1);
    // No proportional drift: the allowance is the fixed 2 ms, the same for both ttls.
    let locks = builder(&c).drift_factor(0.0).build().expect("config");
    warm(&locks).await;
    let drift = Duration::from_millis(2);
    let most = SENT - drift;
    for _ in 0..20 {
        let lock = locks
            .try_acquire("px", FRACTIONAL_TTL)
            .await
            .expect("acquire");
        let v = lock.validity();
        assert!(
            v <= most,
            "acquired validity {v:?} is more than the {SENT:?} sent as PX minus {drift:?}"
        );
        let v = lock.extend(FRACTIONAL_TTL).await.expect("extend");
        assert!(
            v <= most,
            "extended validity {v:?} is more than the {SENT:?} sent as PX minus {drift:?}"
        );
        assert!(lock.validity() <= most, "{:?}", lock.validity());
        lock.release().await.expect("release");
    }
}

#[tokio::test]
async fn an_endless_campaign_timeout_waits_instead_of_panicking() {
    let c = cluster(3);
    let locks = client(&c);
    let election = Election::builder(locks.clone(), "e12b")
        .build()
        .expect("config");
    let term = election
        .campaign_timeout(Duration::MAX)
        .await
        .expect("a free seat is won");
    term.resign().await.expect("resign");
    // `acquire_timeout` with an endless wait gives up only on a non-retryable error.
    let lock = locks
        .acquire_timeout("plain", Duration::from_secs(5), Duration::MAX)
        .await
        .expect("free");
    lock.release().await.expect("release");
}

#[tokio::test]
async fn huge_election_intervals_are_config_errors() {
    let c = cluster(3);
    let locks = client(&c);
    for (what, b) in [
        (
            "poll interval",
            Election::builder(locks.clone(), "e").poll_interval(Duration::MAX),
        ),
        (
            "ttl",
            Election::builder(locks.clone(), "e").ttl(Duration::MAX),
        ),
    ] {
        let err: Error = b.build().map(|_| ()).unwrap_err().into();
        assert!(
            matches!(err, Error::Config(ConfigError::TooLong { .. })),
            "{what}: {err}"
        );
    }
}

/// How many `NOSCRIPT` errors a node has answered.
fn noscript_errors(url: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut conn(url))
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_NOSCRIPT:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_acquire_answered_noscript_is_not_re_sent_after_the_release() {
    let c = cluster(3);
    let urls = c.urls();
    let slow = Proxy::for_url(&urls[2]).await.expect("proxy");
    // Node 2 takes the acquire as the script (a Redis 7 standalone node would take the
    // pipelined `SET NX PX GET` + `INCR`, which has no script to forget): as a Redis 6 node, a
    // Cluster member, or a key this client has waited for.
    let a = Redlock::builder([urls[0].clone(), urls[1].clone(), slow.url()])
        .node_timeout(Duration::from_secs(5))
        .testkit_script_acquire(2)
        .build()
        .expect("config");
    warm(&a).await;
    // A connection's first call of a script goes as `EVAL` (which caches it): after one
    // acquisition and release, node 2's connection sends both scripts as `EVALSHA`.
    let first = a.try_acquire("noscript", Duration::from_secs(30)).await;
    first.expect("acquired").release().await.expect("released");
    a.flush().await;
    // Node 2 forgets the scripts, and answers the holder slowly.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut conn(&urls[2]))
        .expect("SCRIPT FLUSH");
    slow.set_latency(Duration::from_millis(300));
    let lock = a
        .try_acquire("noscript", Duration::from_secs(30))
        .await
        .expect("won on nodes 0 and 1");
    // The acquire reached node 2 (and was refused there with NOSCRIPT); its answer is still on
    // the way back to the holder, whose round is decided.
    wait_until(WAIT, "node 2 answered NOSCRIPT", || async {
        noscript_errors(&urls[2]) >= 1
    })
    .await;
    slow.set_latency(Duration::ZERO);
    lock.release().await.expect("release");
    // Drives the parked calls: the acquire's NOSCRIPT answer arrives now.
    a.flush().await;
    // And anything re-sent behind it has run once a status read on the same connection returns.
    wait_until(WAIT, "node 2 answers the holder", || async {
        a.status("noscript")
            .await
            .is_ok_and(|s| s.answered() == urls.len())
    })
    .await;
    for url in &urls {
        assert_eq!(
            value_on(url, "noscript"),
            None,
            "the acquire was re-sent as EVAL after the release, on {url}"
        );
    }
}
