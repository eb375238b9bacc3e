//! Who holds a lock: a client names itself (`RedlockBuilder::owner`), the name travels inside
//! the lock's value, and `status`, the guard and an election's leader show it. Against real
//! redis-server processes.

use std::time::Duration;

use crate::support::*;
use futures::StreamExt;
use quorumlock::{ConfigError, Election, Error, Observation, Redlock};

const OWNER: &str = "host-a/pid 4711";

/// The name is stored with the value on every node that holds the lock and read back by
/// `status` (per node and for the holder) and by the guard; a client without a name shows none.
#[tokio::test]
async fn o1_status_shows_the_name_the_holder_gave_itself() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let named = builder(&cluster).owner(OWNER).build().unwrap();
    assert_eq!(named.owner(), Some(OWNER));
    let lock = named.try_acquire("report", LONG_TTL).await.unwrap();
    assert_eq!(lock.owner().as_deref(), Some(OWNER));
    let (random, suffix) = lock.value().split_at(32);
    assert!(random.bytes().all(|b| b.is_ascii_hexdigit()), "{random}");
    assert_eq!(suffix, "@host-a/pid%204711");
    spread(&lock, &urls).await;
    for url in &urls {
        assert_eq!(value_on(url, "report").as_deref(), Some(lock.value()));
    }

    let reader = client(&cluster);
    let status = reader.status("report").await.unwrap();
    assert_eq!(status.holder(), Some(lock.value()));
    assert_eq!(status.owner().as_deref(), Some(OWNER));
    for node in &status.nodes {
        let state = node.state.as_ref().expect("every node answers");
        assert_eq!(state.owner.as_deref(), Some(OWNER), "{}", node.node);
    }
    lock.release().await.unwrap();

    // No name: none shown, and the value is the 32 hex digits alone.
    let unnamed = reader.try_acquire("report", LONG_TTL).await.unwrap();
    assert_eq!(unnamed.value().len(), 32);
    assert_eq!(unnamed.owner(), None);
    let status = reader.status("report").await.unwrap();
    assert_eq!(status.holder(), Some(unnamed.value()));
    assert_eq!(status.owner(), None);
    unnamed.release().await.unwrap();
}

/// The name adds nothing to ownership: a second client with the very same name is another
/// owner (each acquisition's random part differs), it can neither take nor release the lock,
/// and the holder's release notice (`"<value> <waiting clients>"`) still wakes a waiter whose
/// only other wake-up is an hour away.
#[tokio::test]
async fn o2_a_shared_name_is_no_shared_ownership_and_releases_still_wake_waiters() {
    let cluster = cluster(5);
    let a = builder(&cluster).owner(OWNER).build().unwrap();
    let b = builder(&cluster)
        .owner(OWNER)
        .retry_delay(Duration::from_secs(3600), Duration::ZERO)
        .build()
        .unwrap();
    warm(&a).await;
    warm(&b).await;
    let lock = a
        .try_acquire("job", Duration::from_secs(120))
        .await
        .unwrap();
    let err = b.try_acquire("job", LONG_TTL).await.unwrap_err();
    assert!(err.is_held(), "{err}");

    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.acquire_timeout("job", LONG_TTL, Duration::from_secs(3600))
                .await
        }
    });
    // The waiter has registered (its marker stands) before the release.
    let urls = cluster.urls();
    wait_until(WAIT, "the waiter's marker stands on a quorum", || async {
        urls.iter()
            .filter(|u| {
                let n: u64 = redis::cmd("SCARD")
                    .arg(format!("{}:waiters", lock_key("job")))
                    .query(&mut conn(u))
                    .unwrap_or(0);
                n > 0
            })
            .count()
            >= 3
    })
    .await;
    assert!(!lock.is_lost());
    lock.release().await.unwrap();
    let taken = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("woken by the release notice, not by its hour-long timer")
        .unwrap()
        .expect("acquired");
    assert_eq!(taken.owner().as_deref(), Some(OWNER));
    taken.release().await.unwrap();
}

/// A bad name is a typed configuration error, never a panic.
#[test]
fn o3_a_bad_name_is_a_config_error() {
    let nodes = [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ];
    for bad in ["", "line\nbreak", "nul\0", &"x".repeat(129)] {
        match Redlock::builder(nodes).owner(bad).build() {
            Err(ConfigError::InvalidOwner { owner, .. }) => assert_eq!(owner, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    for good in [
        "a",
        "worker@host-b",
        "100% sure",
        "pod/ü 7",
        &"x".repeat(128),
    ] {
        let locks = Redlock::builder(nodes).owner(good).build().unwrap();
        assert_eq!(locks.owner(), Some(good));
    }
}

/// An election's leader, read by `leader()` and streamed by an observer, carries the owner
/// name of the leader's client beside its candidate id.
#[tokio::test]
async fn o4_the_leader_shows_its_owner_name() {
    let cluster = cluster(5);
    let locks = builder(&cluster)
        .owner("scheduler-host/pid 1")
        .build()
        .unwrap();
    let election = Election::builder(locks, "cron")
        .ttl(Duration::from_secs(10))
        .candidate("alpha")
        .build()
        .unwrap();
    let observer = Election::builder(client(&cluster), "cron")
        .observer()
        .unwrap();
    let leadership = lead(&election).await;
    let mut changes = Box::pin(observer.observe());
    let leader = tokio::time::timeout(WAIT, async {
        loop {
            match changes.next().await {
                Some(Observation::Leader(l)) if l.candidate.is_some() => return l,
                Some(_) => {}
                None => panic!("the stream ended"),
            }
        }
    })
    .await
    .expect("the observer sees the leader");
    assert_eq!(leader.candidate.as_deref(), Some("alpha"));
    assert_eq!(leader.owner.as_deref(), Some("scheduler-host/pid 1"));
    assert_eq!(leader.token, leadership.token());
    let read = observer.leader().await.unwrap().expect("a leader");
    assert_eq!(read.owner.as_deref(), Some("scheduler-host/pid 1"));
    leadership.resign().await.unwrap();
}

/// Compat mode: the name rides in the plain key's value, which other Redlock clients only
/// compare with their own; rslock is still excluded while we hold the key and gets it after
/// our release (`tests/deployments/compat.rs` c8 runs it with a user limited to the key).
#[tokio::test]
async fn o5_compat_mode_carries_the_name_and_still_excludes_rslock() {
    let cluster = cluster(3);
    let locks = builder(&cluster).compat(true).owner(OWNER).build().unwrap();
    let mut rs = rslock::LockManager::new(cluster.urls());
    rs.set_retry(1, Duration::from_millis(1));
    let ours = locks.try_acquire("shared", LONG_TTL).await.unwrap();
    let status = locks.status("shared").await.unwrap();
    assert_eq!(status.owner().as_deref(), Some(OWNER));
    assert!(matches!(
        rs.lock("shared", LONG_TTL).await,
        Err(rslock::LockError::Unavailable)
    ));
    ours.extend(LONG_TTL).await.unwrap();
    ours.release().await.unwrap();
    let theirs = rs
        .lock("shared", LONG_TTL)
        .await
        .expect("free after our release");
    // rslock's value carries no name of ours.
    assert_eq!(locks.status("shared").await.unwrap().owner(), None);
    assert!(matches!(
        locks.try_acquire("shared", LONG_TTL).await,
        Err(Error::Held { .. })
    ));
    rs.unlock(&theirs).await;
}
