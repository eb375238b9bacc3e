//! Claim, then act: a new holder raises the resource's highest token before it does anything,
//! so that a paused earlier holder's late write is refused even though the new holder has not
//! written yet (the double payment).

use crate::support::*;
use quorumlock::testkit::LocalCluster;
use quorumlock::{FenceClaim, FencedWrite, FencingToken, Lock, fenced_claim, fenced_set};
use std::time::Duration;

/// How the new holder treats the resource before it writes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Protocol {
    /// Only `fenced_set` at the end of its work.
    FencedSetAlone,
    /// `fenced_claim` right after acquiring, then the work, then `fenced_set`.
    ClaimThenAct,
}

async fn store(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&direct_config())
        .await
        .unwrap()
}

/// A payout batch is paid once per write the ledger accepts. Worker A (the paused one) took
/// the lock, claimed and started; its lease ran out while it was paused; worker B acquired and,
/// depending on `protocol`, claimed; then A woke and wrote; then B wrote. Returns the number of
/// payments and the two tokens.
async fn double_payment(
    cluster: &LocalCluster,
    batch: &str,
    protocol: Protocol,
) -> (usize, u64, u64) {
    let url = cluster.urls()[0].clone();
    let mut ledger = store(&url).await;
    let key = format!("{{{batch}}}:payout");
    let a = client(cluster);
    let b = client(cluster);
    let lock_a: Lock = a.acquire(batch, Duration::from_millis(400)).await.unwrap();
    if protocol == Protocol::ClaimThenAct {
        claim(&mut ledger, &key, lock_a.token()).await;
    }
    // A is paused: its lease runs out (no extension), and it does not see it.
    tokio::time::timeout(WAIT, lock_a.lost())
        .await
        .expect("A's lease ran out");
    let lock_b = b.acquire_timeout(batch, TTL, WAIT).await.unwrap();
    assert!(lock_b.token() > lock_a.token());
    if protocol == Protocol::ClaimThenAct {
        claim(&mut ledger, &key, lock_b.token()).await;
    }
    let mut payments = 0;
    // A wakes and writes, before B has written.
    if fenced_set(&mut ledger, &key, lock_a.token(), "paid-by-a")
        .await
        .unwrap()
        == FencedWrite::Written
    {
        payments += 1;
    }
    if fenced_set(&mut ledger, &key, lock_b.token(), "paid-by-b")
        .await
        .unwrap()
        == FencedWrite::Written
    {
        payments += 1;
    }
    let tokens = (lock_a.token().get(), lock_b.token().get());
    lock_b.release().await.unwrap();
    (payments, tokens.0, tokens.1)
}

async fn claim(ledger: &mut redis::aio::MultiplexedConnection, key: &str, token: FencingToken) {
    assert_eq!(
        fenced_claim(ledger, key, token).await.unwrap(),
        FenceClaim::Claimed,
        "token {token} claims the resource"
    );
}

/// The double payment: with `fenced_set` alone, the paused holder's write is accepted because
/// the new holder has not written yet, and the batch is paid twice; with claim-then-act it is
/// refused, and the batch is paid once.
#[tokio::test]
async fn t60_claim_then_act_pays_once_where_fenced_set_alone_pays_twice() {
    let cluster = cluster(3);
    let (payments, a, b) = double_payment(&cluster, "batch-7", Protocol::FencedSetAlone).await;
    assert_eq!(
        payments, 2,
        "fenced_set alone: batch paid {payments} times (tokens {a} then {b})"
    );
    let (payments, a, b) = double_payment(&cluster, "batch-8", Protocol::ClaimThenAct).await;
    assert_eq!(
        payments, 1,
        "claim, then act: batch paid {payments} times (tokens {a} then {b})"
    );
    // The paused holder's own claim, after the new holder's, is refused too; the new holder's
    // repeated claim stands.
    let mut ledger = store(&cluster.urls()[0]).await;
    let stale = fenced_claim(&mut ledger, "{batch-8}:payout", FencingToken::new(a))
        .await
        .unwrap();
    assert_eq!(stale.stale_by(), Some(FencingToken::new(b)));
    assert!(
        fenced_claim(&mut ledger, "{batch-8}:payout", FencingToken::new(b))
            .await
            .unwrap()
            .is_claimed()
    );
}
