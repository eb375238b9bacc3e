//! Revoking a lock from outside (`Redlock::revoke`, what `redlock break` runs) and checking a
//! token (`Redlock::is_current`): the old holder's token is refused from the revoke on, its
//! lease ends with `LostReason::Revoked`, a waiter takes over, tokens only grow.

use std::time::Duration;

use crate::support::*;
use quorumlock::testkit::LocalCluster;
use quorumlock::{
    Error, FenceClaim, FencedWrite, FencingToken, Lock, LostReason, Redlock, Revocation,
    TokenCheck, fenced_claim, fenced_set,
};

async fn store(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&direct_config())
        .await
        .unwrap()
}

/// An operator's client: a fresh process, as `redlock break` is.
fn operator(cluster: &LocalCluster) -> Redlock {
    client(cluster)
}

/// A holder in `keep_alive` is revoked: its token is refused at once by a resource that checks
/// the counter and by one claimed with the revoke's token; its `lost()` fires with the reason;
/// the waiter takes over with a larger token, and the old token is refused by `fenced_set` and
/// by a claim.
#[tokio::test]
async fn t70_a_kept_alive_holder_is_revoked_and_a_waiter_takes_over() {
    let cluster = cluster(5);
    let mut resource = store(&cluster.urls()[0]).await;
    let holder = client(&cluster);
    let lock = holder
        .acquire("wedged", Duration::from_secs(3))
        .await
        .unwrap();
    lock.keep_alive();
    let old = lock.token();
    assert!(
        fenced_claim(&mut resource, "{wedged}", old)
            .await
            .unwrap()
            .is_claimed()
    );
    let ops = operator(&cluster);
    assert!(ops.is_current("wedged", old).await.unwrap());
    // A waiter queues behind the holder.
    let waiter = client(&cluster);
    let waiting = tokio::spawn(async move {
        waiter
            .acquire_timeout("wedged", TTL, WAIT)
            .await
            .map(|l| (l.token(), l))
    });
    wait_until(WAIT, "the waiter is waiting", || async {
        holders_marker(&cluster.urls(), "wedged")
    })
    .await;

    let revocation = ops.revoke("wedged").await.unwrap();
    assert_revoked(&revocation, lock.value(), old);
    // From that moment: the counter check refuses the old token.
    let check = ops.check_token("wedged", old).await.unwrap();
    assert!(!check.is_current(), "{check:?}");
    // The resource claimed with the revoke's token refuses the old holder.
    assert!(
        fenced_claim(&mut resource, "{wedged}", revocation.token)
            .await
            .unwrap()
            .is_claimed()
    );
    assert_eq!(
        fenced_set(&mut resource, "{wedged}", old, "late")
            .await
            .unwrap(),
        FencedWrite::Stale {
            highest: revocation.token
        }
    );
    // The holder's next extension fails, and its lost signal names the revoke.
    assert_lost_to_the_revoke(&lock).await;
    // The waiter takes over with a larger token; tokens only grow.
    let (next, next_lock) = waiting.await.unwrap().expect("the waiter took over");
    assert!(
        next > revocation.token,
        "{next} after the revoke's {}",
        revocation.token
    );
    assert!(ops.is_current("wedged", next).await.unwrap());
    assert!(
        fenced_claim(&mut resource, "{wedged}", next)
            .await
            .unwrap()
            .is_claimed()
    );
    assert_eq!(
        fenced_claim(&mut resource, "{wedged}", old).await.unwrap(),
        FenceClaim::Stale { highest: next }
    );
    assert_eq!(
        fenced_set(&mut resource, "{wedged}", old, "late")
            .await
            .unwrap(),
        FencedWrite::Stale { highest: next }
    );
    next_lock.release().await.unwrap();
}

/// The revoke found the holder's `value` on a quorum, raised the counters past its token `old`
/// and deleted the value, each on at least 3 of the 5 nodes.
fn assert_revoked(revocation: &Revocation, value: &str, old: FencingToken) {
    assert!(revocation.revoked(), "{revocation:?}");
    assert_eq!(revocation.value.as_deref(), Some(value));
    assert!(revocation.token > old, "{revocation:?} after {old}");
    assert!(
        revocation.raised >= 3 && revocation.deleted >= 3,
        "{revocation:?}"
    );
}

/// The revoked holder's `lost()` fires, with the revoke as its reason.
async fn assert_lost_to_the_revoke(lock: &Lock) {
    tokio::time::timeout(WAIT, lock.lost())
        .await
        .expect("the holder's lost() fired");
    assert!(
        matches!(lock.lost_reason(), Some(LostReason::Revoked)),
        "{:?}",
        lock.lost_reason()
    );
    assert!(lock.lost_reason().unwrap().to_string().contains("revoked"));
}

/// Whether some node has a waiters marker for `key`.
fn holders_marker(urls: &[String], key: &str) -> bool {
    let marker = format!("{}:waiters", lock_key(key));
    urls.iter().any(|u| {
        redis::cmd("EXISTS")
            .arg(&marker)
            .query::<i64>(&mut conn(u))
            .unwrap_or(0)
            == 1
    })
}

/// A paused holder (it extends nothing) is revoked; when it wakes, its extension fails as
/// revoked, and its token is no longer current.
#[tokio::test]
async fn t71_a_paused_holder_wakes_revoked() {
    let cluster = cluster(5);
    let holder = client(&cluster);
    let lock = holder.acquire("paused", TTL).await.unwrap();
    let old = lock.token();
    let revocation = operator(&cluster).revoke("paused").await.unwrap();
    assert!(
        revocation.revoked() && revocation.token > old,
        "{revocation:?}"
    );
    assert_eq!(holders(&cluster.urls(), "paused"), 0, "deleted everywhere");
    let err = lock.extend(TTL).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Lost {
                reason: LostReason::Revoked,
                ..
            }
        ),
        "{err}"
    );
    assert!(lock.is_lost());
    assert_eq!(
        operator(&cluster).check_token("paused", old).await.unwrap(),
        TokenCheck::Superseded {
            highest: revocation.token
        }
    );
    // The next holder's token is above the revoke's.
    let next = client(&cluster).try_acquire("paused", TTL).await.unwrap();
    assert!(next.token() > revocation.token);
    next.release().await.unwrap();
}

/// A break of a lock released meanwhile does nothing: no value deleted, no counter raised,
/// the next holder unaffected; a break aimed at the old value leaves the new holder alone.
#[tokio::test]
async fn t72_a_break_after_the_release_does_nothing_harmful() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let lock = locks.acquire("gone", TTL).await.unwrap();
    let (old_value, old) = (lock.value().to_owned(), lock.token());
    lock.release().await.unwrap();
    let fences: Vec<u64> = urls.iter().map(|u| fence_on(u, "gone")).collect();
    let revocation = operator(&cluster).revoke("gone").await.unwrap();
    assert!(
        !revocation.revoked() && revocation.value.is_none(),
        "{revocation:?}"
    );
    assert_eq!(
        urls.iter().map(|u| fence_on(u, "gone")).collect::<Vec<_>>(),
        fences
    );
    let next = locks.try_acquire("gone", TTL).await.unwrap();
    assert!(next.token() > old);
    // Aimed at the released value: the new holder keeps its lock.
    let aimed = operator(&cluster)
        .revoke_value("gone", &old_value)
        .await
        .unwrap();
    assert_eq!(aimed.deleted, 0, "{aimed:?}");
    assert_eq!(holders(&urls, "gone"), 3);
    next.extend(TTL).await.unwrap();
    assert_eq!(
        operator(&cluster)
            .check_token("gone", FencingToken::new(aimed.token.get() + 5))
            .await
            .unwrap(),
        TokenCheck::NeverIssued {
            highest: aimed.token
        }
    );
    next.release().await.unwrap();
}
