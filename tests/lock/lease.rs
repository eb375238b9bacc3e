//! Leases against real servers: auto-extension, the lost signal (quorum gone, nodes hung,
//! deadline passed), the scoped form, and cleanup when the guard goes away.

use std::time::Duration;

use crate::support::*;
use quorumlock::{Error, LostReason};
use tokio::time::Instant;

/// A kept-alive lock outlives its ttl many times over, and the nodes keep holding it.
#[tokio::test]
async fn t10_keep_alive_outlives_the_ttl() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let ttl = Duration::from_secs(1);
    let lock = locks.acquire("lease", ttl).await.unwrap();
    let first_deadline = lock.deadline();
    lock.keep_alive();
    // Three ttls pass without the lost signal.
    let lost = tokio::time::timeout(ttl * 3, lock.lost()).await;
    assert!(lost.is_err(), "lost fired: {:?}", lock.lost_reason());
    assert!(!lock.is_lost());
    assert!(
        lock.deadline() > first_deadline + ttl,
        "the deadline moved forward"
    );
    assert!(holders(&urls, "lease") >= 3);
    lock.release().await.unwrap();
}

/// Killing a quorum of nodes while holding fires the lost signal, at the latest at the deadline.
/// The test waits on the token, which only the lease task cancels (`lost()` has a timer of its
/// own and would fire regardless).
#[tokio::test]
async fn t11_lost_fires_when_a_quorum_of_nodes_dies() {
    let mut cluster = cluster(5);
    let locks = client(&cluster);
    let ttl = Duration::from_secs(1);
    let lock = locks.acquire("lease", ttl).await.unwrap();
    lock.keep_alive();
    let token = lock.lost_token();
    for i in [0, 1, 2] {
        cluster.kill(i).unwrap();
    }
    let deadline = Instant::from_std(lock.deadline());
    tokio::time::timeout(ttl + WAIT, token.cancelled())
        .await
        .expect("lost fires");
    let late = Instant::now().saturating_duration_since(deadline);
    // A timer at the deadline; the slack covers a loaded box (timers and the lease task can
    // run hundreds of ms late there), far short of what a missed deadline would take.
    assert!(
        late < Duration::from_secs(3),
        "fired {late:?} after the deadline"
    );
    assert!(
        matches!(
            lock.lost_reason(),
            Some(LostReason::Unreachable { .. } | LostReason::Expired)
        ),
        "{:?}",
        lock.lost_reason()
    );
}

/// With every node hung (SIGSTOP), no extension ever answers: the deadline alone fires the
/// signal, on time.
#[tokio::test]
async fn t12_lost_fires_at_the_deadline_even_if_no_node_answers() {
    let mut cluster = cluster(5);
    let locks = builder(&cluster)
        .node_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let ttl = Duration::from_millis(800);
    let lock = locks.acquire("lease", ttl).await.unwrap();
    lock.keep_alive();
    for i in 0..5 {
        cluster.pause(i).unwrap();
    }
    let token = lock.lost_token();
    let deadline = Instant::from_std(lock.deadline());
    // The token, not `lost()`: only the lease task cancels it, and its extension is stuck on
    // nodes that never answer within the 30 s node timeout. Its own deadline must fire it.
    tokio::time::timeout(ttl + WAIT, token.cancelled())
        .await
        .expect("lost fires");
    let late = Instant::now().saturating_duration_since(deadline);
    // A timer at the deadline; the slack covers a loaded box (timers and the lease task can
    // run hundreds of ms late there), far short of what a missed deadline would take.
    assert!(
        late < Duration::from_secs(3),
        "fired {late:?} after the deadline"
    );
    assert!(matches!(lock.lost_reason(), Some(LostReason::Expired)));
    for i in 0..5 {
        cluster.resume(i).unwrap();
    }
}

/// A plain lock (no keep-alive) reports its loss at its deadline through the token too.
#[tokio::test]
async fn t13_lost_token_fires_at_the_deadline_without_keep_alive() {
    let cluster = cluster(3);
    let locks = client(&cluster);
    let lock = locks
        .acquire("plain", Duration::from_millis(300))
        .await
        .unwrap();
    let token = lock.lost_token();
    tokio::time::timeout(WAIT, token.cancelled())
        .await
        .expect("token fires");
    assert!(lock.is_lost());
    assert!(matches!(lock.lost_reason(), Some(LostReason::Expired)));
}

/// A plain lock with nothing watching it (no keep-alive, no `lost()`, no token): once its
/// deadline passed, `is_lost()` and `lost_reason()` agree that it expired, without a call to
/// the nodes.
#[tokio::test]
async fn t13b_lost_reason_agrees_with_is_lost_after_the_deadline() {
    let cluster = cluster(3);
    let locks = client(&cluster);
    let ttl = Duration::from_millis(300);
    let lock = locks.acquire("unwatched", ttl).await.unwrap();
    assert_eq!(lock.lost_reason().map(|r| r.to_string()), None);
    let deadline = Instant::from_std(lock.deadline());
    tokio::time::sleep_until(deadline + Duration::from_millis(10)).await;
    assert!(lock.is_lost());
    assert!(
        matches!(lock.lost_reason(), Some(LostReason::Expired)),
        "{:?}",
        lock.lost_reason()
    );
}

/// Releasing stops the extension: the key does not come back after release, even with the
/// lease extending every millisecond on another worker thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t14_release_stops_the_extension() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let lock = locks
        .acquire("lease", Duration::from_secs(120))
        .await
        .unwrap();
    lock.keep_alive_every(Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    lock.release().await.unwrap();
    wait_until(WAIT, "released everywhere", || async {
        holders(&urls, "lease") == 0
    })
    .await;
    // Several extension periods later, nothing re-set it.
    let never = std::future::pending::<()>();
    let _ = tokio::time::timeout(Duration::from_millis(400), never).await;
    assert_eq!(holders(&urls, "lease"), 0);
}

/// Dropping a kept-alive guard stops the extension and releases in the background.
#[tokio::test]
async fn t15_dropping_a_kept_alive_guard_releases_it() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let lock = locks
        .acquire("lease", Duration::from_secs(30))
        .await
        .unwrap();
    lock.keep_alive_every(Duration::from_millis(50));
    drop(lock);
    wait_until(WAIT, "released long before the ttl", || async {
        holders(&urls, "lease") == 0
    })
    .await;
    let again = locks
        .try_acquire("lease", Duration::from_secs(30))
        .await
        .unwrap();
    again.release().await.unwrap();
}

/// An outage of a quorum that lasts longer than a few extension rounds, but ends while validity
/// remains, does not lose the lock: keep-alive retries until the deadline.
#[tokio::test]
async fn t16_keep_alive_rides_out_an_outage_shorter_than_the_validity() {
    let mut cluster = cluster(5);
    let locks = client(&cluster);
    let ttl = Duration::from_secs(5);
    let lock = locks.acquire("lease", ttl).await.unwrap();
    let first_deadline = lock.deadline();
    lock.keep_alive();
    let token = lock.lost_token();
    for i in [0, 1, 2] {
        cluster.pause(i).unwrap();
    }
    // The first extension (at ttl/3) fails for about 1.4 s: many rounds, each one node timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in [0, 1, 2] {
        cluster.resume(i).unwrap();
    }
    assert!(!token.is_cancelled(), "lost: {:?}", lock.lost_reason());
    wait_until(WAIT, "an extension succeeds after the outage", || async {
        lock.deadline() > first_deadline + Duration::from_secs(1)
    })
    .await;
    assert!(!lock.is_lost());
    lock.release().await.unwrap();
}

/// The scoped form runs the work with the lock held and releases it after.
#[tokio::test]
async fn t20_with_lock_runs_the_work_and_releases() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let out = locks
        .with_lock("scoped", Duration::from_secs(5), |ctx| {
            let urls = urls.clone();
            async move {
                assert_eq!(ctx.key(), "scoped");
                assert!(!ctx.lost_token().is_cancelled());
                (holders(&urls, "scoped") >= 3, ctx.token().get())
            }
        })
        .await
        .unwrap();
    assert!(out.0, "held during the work");
    assert!(out.1 >= 1);
    wait_until(WAIT, "released after the work", || async {
        holders(&urls, "scoped") == 0
    })
    .await;
}

/// When the lock is lost while the work runs, the work is dropped and the call says why.
#[tokio::test]
async fn t21_with_lock_stops_the_work_when_the_lock_is_lost() {
    let cluster = std::sync::Arc::new(std::sync::Mutex::new(cluster(5)));
    let locks = client(&cluster.lock().unwrap());
    let ttl = Duration::from_secs(1);
    let start = Instant::now();
    let result = tokio::time::timeout(
        ttl + WAIT,
        locks.with_lock("scoped", ttl, |_ctx| {
            let cluster = cluster.clone();
            async move {
                {
                    let mut c = cluster.lock().unwrap();
                    for i in [0, 1, 2] {
                        c.kill(i).unwrap();
                    }
                }
                std::future::pending::<()>().await
            }
        }),
    )
    .await
    .expect("with_lock returns instead of hanging");
    assert!(matches!(result, Err(Error::Lost { .. })), "{result:?}");
    assert!(
        start.elapsed() < ttl + Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

/// Work that finishes only after the lock was lost (it never yielded, so nothing could stop it)
/// is not reported as done under the lock.
#[tokio::test]
async fn t22_with_lock_reports_work_that_outlived_the_lock() {
    let cluster = cluster(5);
    let locks = client(&cluster);
    let ttl = Duration::from_millis(800);
    let result = locks
        .with_lock("scoped", ttl, |_ctx| async move {
            // A stop-the-world pause: the thread does nothing else for longer than the ttl.
            std::thread::sleep(ttl + Duration::from_millis(400));
            "done"
        })
        .await;
    assert!(
        matches!(
            result,
            Err(Error::Lost {
                reason: LostReason::Expired,
                ..
            })
        ),
        "{result:?}"
    );
}
