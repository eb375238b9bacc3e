//! Extending and releasing against real redis-server processes: an extension prolongs the lock,
//! re-sets a lost key only where nobody acquired since, moves a deadline back; a release after
//! the deadline reports the loss and reaches every node.

use std::time::Duration;

use crate::LONG;
use crate::support::*;

#[tokio::test]
async fn t18_extend_prolongs_the_lock_and_fails_once_it_is_gone() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let lock = locks
        .try_acquire("job", Duration::from_secs(2))
        .await
        .unwrap();
    let validity = lock.extend(Duration::from_secs(20)).await.expect("extend");
    assert!(validity > Duration::from_secs(19), "{validity:?}");
    assert!(lock.validity() > Duration::from_secs(19));

    // Too few nodes: the extension cannot reach a quorum, the lock keeps its deadline.
    for i in [0, 1, 2] {
        cluster.kill(i).unwrap();
    }
    let err = lock.extend(Duration::from_secs(20)).await.unwrap_err();
    assert!(err.is_no_quorum(), "{err}");
    assert!(!lock.is_lost());
    for i in [0, 1, 2] {
        cluster.restart(i).unwrap();
    }

    // Another owner took the key where it vanished: a quorum no longer holds our value.
    for url in &urls[..3] {
        set_foreign(url, "job", "thief", Duration::from_secs(20));
    }
    let locks2 = builder(&cluster)
        .restart_guard(quorumlock::RestartGuard::Off)
        .build()
        .unwrap();
    let lock2 = locks2
        .try_acquire("job-b", Duration::from_secs(2))
        .await
        .unwrap();
    for url in &urls[..3] {
        set_foreign(url, "job-b", "thief", Duration::from_secs(20));
    }
    let err = lock2.extend(Duration::from_secs(20)).await.unwrap_err();
    assert!(is_not_owner(&err), "{err}");
    assert!(lock2.is_lost());
    tokio::time::timeout(WAIT, lock2.lost())
        .await
        .expect("lost signal already fired");
    drop(lock);
}

#[tokio::test]
async fn t19_extend_re_sets_the_key_on_a_node_that_lost_it() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    // Connected everywhere first: a round that wins while a node is still connecting
    // does not send to that node (a lock needs only a quorum).
    warm(&locks).await;
    let lock = locks.try_acquire("job", TTL).await.unwrap();
    spread(&lock, &urls).await;
    let _: () = redis::cmd("DEL")
        .arg(lock_key("job"))
        .query(
            &mut redis::Client::open(urls[0].as_str())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    lock.extend(TTL).await.unwrap();
    // The extension returns at a quorum; node 0's answer may come after it (awaited, bounded).
    wait_until(WAIT, "node 0 holds the key again", || async {
        holders(&urls, "job") == 5
    })
    .await;
    lock.release().await.unwrap();
}

/// An extension to a shorter ttl shortens the key on the nodes, so the local deadline must move
/// back with it: the holder may never believe it holds a lock the nodes already expired.
#[tokio::test]
async fn t21_a_shorter_extension_moves_the_deadline_back() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let lock = locks.try_acquire("job", LONG).await.unwrap();
    let short = Duration::from_millis(1500);
    let validity = lock.extend(short).await.expect("extend");
    assert!(validity <= short, "{validity:?}");
    assert!(lock.validity() <= short, "{:?}", lock.validity());
    assert_eq!(
        lock.ttl(),
        short,
        "keep_alive would now extend to the new ttl"
    );
    // The lost signal fires at the new deadline, and the nodes expire the key by then too.
    tokio::time::timeout(WAIT, lock.lost())
        .await
        .expect("lost at the new deadline, long before the original ttl");
    wait_until(WAIT, "the nodes expired the key", || async {
        holders(&urls, "job") == 0
    })
    .await;
    assert!(lock.release().await.unwrap_err().is_lost());
}

/// Where our key is gone, an extension re-sets it only if the node's counter is not above our
/// token (nobody can have acquired there since): a counter ahead (a contender came and went, or
/// a later owner) is left alone, and the lock, still on a quorum, is extended all the same.
/// Only another owner's value refuses it; with a quorum of those the lock is lost.
#[tokio::test]
async fn t22_extend_re_sets_only_where_nobody_acquired_since_and_never_over_an_owner() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    warm(&locks).await;
    let lock = locks.try_acquire("job", LONG).await.unwrap();
    spread(&lock, &urls).await;
    let token = lock.token().get();
    // Our key is gone on nodes 0 and 1; on node 0 a contender came and went (counter ahead).
    for url in &urls[..2] {
        del_lock(url, "job");
    }
    set_fence(&urls[0], "job", token + 1);
    lock.extend(LONG)
        .await
        .expect("still held by a quorum: extended");
    assert!(!lock.is_lost());
    wait_until(WAIT, "re-set on node 1 and extended on 2-4", || async {
        holders(&urls[1..], "job") == 4
    })
    .await;
    assert_eq!(
        value_on(&urls[0], "job"),
        None,
        "not re-set where the counter is above our token"
    );

    // On nodes 0, 1 and 2 another owner's value stands: a quorum no longer holds ours.
    for url in &urls[..3] {
        set_foreign(url, "job", "another-owner", LONG);
    }
    let err = lock.extend(LONG).await.unwrap_err();
    assert!(is_not_owner(&err), "{err}");
    assert!(lock.is_lost());
    for url in &urls[..3] {
        assert_eq!(
            value_on(url, "job").as_deref(),
            Some("another-owner"),
            "left alone"
        );
    }
}

/// A holder that outlived its validity is told so by release, even when nobody took the key.
#[tokio::test]
async fn t23_release_after_the_deadline_reports_the_loss() {
    let cluster = cluster(5);
    let locks = client(&cluster);
    warm(&locks).await;
    let lock = locks
        .try_acquire("job", Duration::from_millis(600))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, lock.lost())
        .await
        .expect("deadline passes");
    let err = lock.release().await.unwrap_err();
    assert!(is_expired(&err), "{err}");
}

/// Releasing (or dropping) a lock leaves its key on no node, even on nodes slower than the
/// quorum (their release is driven to its answer: redis-rs skips a queued command whose caller
/// went away) and while a lease extends it every millisecond (extensions are serialised with the
/// release). Under CPU load this failed about one run in three before both fixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t24_a_release_reaches_every_node_and_no_extension_follows_it() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    warm(&locks).await;
    let keys: Vec<String> = (0..100).map(|i| format!("job-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let lock = locks.try_acquire(key, LONG).await.unwrap();
        lock.keep_alive_every(Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(3)).await;
        if i % 2 == 0 {
            lock.release().await.unwrap();
        } else {
            drop(lock);
        }
    }
    locks.flush().await;
    // Give any stray extension time to land before looking (a negative check).
    tokio::time::sleep(Duration::from_millis(300)).await;
    for key in &keys {
        let seen: Vec<_> = urls
            .iter()
            .map(|u| (value_on(u, key), fence_on(u, key)))
            .collect();
        assert_eq!(
            holders(&urls, key),
            0,
            "{key} was re-set after its release: {seen:?}"
        );
    }
}

/// A release that finds our value gone from a quorum of nodes (deleted behind the client's back,
/// as a data loss does) reports the loss: the lock did not stand, whatever the release deleted.
#[tokio::test]
async fn t29_a_release_that_finds_our_value_gone_from_a_quorum_reports_the_loss() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = client(&cluster);
    warm(&locks).await;
    let lock = locks.try_acquire("gone", LONG).await.unwrap();
    spread(&lock, &urls).await;
    for url in &urls[..2] {
        let () = redis::cmd("DEL")
            .arg(lock_key("gone"))
            .query(&mut conn(url))
            .map(|_: u64| ())
            .unwrap();
    }
    let err = lock
        .release()
        .await
        .expect_err("our value was gone from two nodes of three");
    assert!(is_not_owner(&err), "{err}");
}
