//! Compat mode (issue 15, item 6): the lock on a resource is the plain Redis key, as other
//! Redlock clients write it, so this client and `rslock` (standing in for redsync, node-redlock
//! and pottery, which use the same `SET NX PX` / compare-and-delete protocol) exclude each other.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use quorumlock::{ConfigError, Election, Error, Redlock, RunOnce};
use support::*;

const TTL: Duration = Duration::from_secs(10);

fn compat_client(cluster: &quorumlock::testkit::LocalCluster) -> Redlock {
    builder(cluster).compat(true).build().unwrap()
}

fn plain_get(url: &str, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut conn(url))
        .expect("GET")
}

/// The lock is the plain key with a random value and a ttl; the token is 0; extension and
/// release touch only our value; no other key is written; elections and run-once refuse it.
#[tokio::test]
async fn c1_compat_mode_locks_the_plain_resource_name() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = compat_client(&cluster);
    warm(&locks).await;
    let lock = locks.acquire("orders", TTL).await.unwrap();
    assert_eq!(lock.token().get(), 0);
    // The acquisition stands on a quorum (the last node's call may land later, or not at all).
    let holders: Vec<&String> = urls
        .iter()
        .filter(|u| plain_get(u, "orders").is_some())
        .collect();
    assert!(holders.len() >= 2, "{holders:?}");
    let value = plain_get(holders[0], "orders").expect("the plain key is set");
    assert_eq!(value.len(), 32, "{value}");
    assert!(
        holders
            .iter()
            .all(|u| plain_get(u, "orders").as_ref() == Some(&value))
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg("orders")
        .query(&mut conn(holders[0]))
        .unwrap();
    assert!(pttl > 0 && pttl <= TTL.as_millis() as i64, "{pttl}");
    // Someone else's value on one node (one we do not hold, else one of three we hold) is left
    // alone by our extension there, and the extension still has its quorum.
    let other = urls
        .iter()
        .find(|u| !holders.contains(u))
        .unwrap_or(&urls[2])
        .clone();
    set_plain(&other, "orders", "someone-else");
    lock.extend(TTL).await.unwrap();
    assert_eq!(plain_get(&other, "orders").as_deref(), Some("someone-else"));
    lock.release().await.unwrap();
    for url in &urls {
        let left = plain_get(url, "orders");
        let expected = (*url == other).then(|| "someone-else".to_owned());
        assert_eq!(left, expected, "{url}");
    }
    for url in &urls {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn(url)).unwrap();
        let ours: Vec<&String> = keys
            .iter()
            .filter(|k| k.as_str() != "quorumlock:durability-marker" && k.as_str() != "orders")
            .collect();
        assert!(ours.is_empty(), "{url}: {ours:?}");
    }
    let refused = Election::builder(locks.clone(), "leader").build();
    assert!(matches!(refused.err(), Some(ConfigError::FencingRequired)));
    let refused = RunOnce::builder(locks.clone(), "job").build();
    assert!(matches!(refused.err(), Some(ConfigError::FencingRequired)));
}

fn set_plain(url: &str, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(TTL.as_millis() as u64)
        .query(&mut conn(url))
        .unwrap();
}

/// A lock held by rslock is `Held` for us, and ours is unavailable to rslock.
#[tokio::test]
async fn c2_rslock_and_compat_mode_see_each_others_locks() {
    let cluster = cluster(3);
    let locks = compat_client(&cluster);
    let mut rs = rslock::LockManager::new(cluster.urls());
    rs.set_retry(1, Duration::from_millis(1));
    let theirs = rs.lock("shared", TTL).await.expect("rslock acquires");
    assert!(matches!(
        locks.try_acquire("shared", TTL).await,
        Err(Error::Held { .. })
    ));
    rs.unlock(&theirs).await;
    let ours = locks.try_acquire("shared", TTL).await.unwrap();
    assert!(matches!(
        rs.lock("shared", TTL).await,
        Err(rslock::LockError::Unavailable)
    ));
    ours.release().await.unwrap();
    let again = rs.lock("shared", TTL).await.expect("free again");
    rs.unlock(&again).await;
}

/// Both clients contend on one resource over the same nodes, several tasks each; the critical
/// sections (marked by a flag that an entrant finds clear) never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c3_rslock_and_compat_mode_never_overlap() {
    const ROUNDS: u32 = 40;
    let cluster = cluster(3);
    let locks = compat_client(&cluster);
    warm(&locks).await;
    let inside = Arc::new(AtomicBool::new(false));
    let entries = [Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0))];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let (inside, entered) = (Arc::clone(&inside), Arc::clone(&entries[worker % 2]));
        let (locks, urls) = (locks.clone(), cluster.urls());
        tasks.push(tokio::spawn(async move {
            let mut rs = rslock::LockManager::new(urls);
            rs.set_retry(1, Duration::from_millis(1));
            while entered.load(Ordering::SeqCst) < ROUNDS && tokio::time::Instant::now() < deadline
            {
                // Even workers use quorumlock, odd ones rslock.
                let held: Option<Box<dyn std::any::Any + Send>> = if worker % 2 == 0 {
                    locks
                        .try_acquire("contended", TTL)
                        .await
                        .ok()
                        .map(|l| Box::new(l) as _)
                } else {
                    rs.lock("contended", TTL)
                        .await
                        .ok()
                        .map(|l| Box::new(l) as _)
                };
                let Some(held) = held else {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                };
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "worker {worker} entered while another client held the lock"
                );
                entered.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                inside.store(false, Ordering::SeqCst);
                match held.downcast::<quorumlock::Lock>() {
                    Ok(lock) => lock.release().await.unwrap(),
                    Err(other) => {
                        let lock = other.downcast::<rslock::Lock>().expect("an rslock lock");
                        rs.unlock(&lock).await;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let [ours, theirs] = [0, 1].map(|i| entries[i].load(Ordering::SeqCst));
    assert!(
        ours >= ROUNDS && theirs >= ROUNDS,
        "both clients got the lock repeatedly: quorumlock {ours}, rslock {theirs}"
    );
}
