//! Operating locks on a Redis Cluster member (o1): the inventory scans each master of the
//! member and merges its keys with the standalone nodes'; a revoke and a token check run on it
//! as on a standalone node (one script, its keys in the lock's hash slot).

use quorumlock::testkit::RedisClusterMember;
use quorumlock::{Redlock, TokenCheck};

use crate::support::*;

#[tokio::test]
async fn o1_inventory_revoke_and_check_on_a_cluster_member() {
    init_tracing();
    let standalone = cluster(2);
    let mut member = RedisClusterMember::start().unwrap_or_else(|e| panic!("{e}"));
    let urls = [
        standalone.urls()[0].clone(),
        standalone.urls()[1].clone(),
        member.url(),
    ];
    let build = || {
        Redlock::builder(&urls)
            .node_timeout(NODE_TIMEOUT)
            .build()
            .unwrap()
    };
    let locks = build();
    let mut held = Vec::new();
    for i in 0..60 {
        held.push(
            locks
                .try_acquire(&format!("inv:{i:02}"), LONG_TTL)
                .await
                .unwrap(),
        );
    }
    // Spread over the member's three masters.
    let shards: std::collections::BTreeSet<usize> = (0..60)
        .map(|i| member.shard_of(&lock_key(&format!("inv:{i:02}"))).unwrap())
        .collect();
    assert_eq!(shards.len(), 3);
    let ops = build();
    wait_until(WAIT, "every lock on all three members", || async {
        ops.locks("inv:")
            .await
            .is_ok_and(|i| i.locks.len() == 60 && i.locks.iter().all(|l| l.held_on == 3))
    })
    .await;
    let inventory = ops.locks("inv:").await.unwrap();
    assert!(inventory.failures.is_empty(), "{:?}", inventory.failures);
    for (lock, mine) in inventory.locks.iter().zip(&held) {
        assert_eq!(
            (lock.key.as_str(), lock.value.as_str()),
            (mine.key(), mine.value())
        );
        assert!(lock.certain && lock.fence >= mine.token(), "{lock:?}");
    }

    let victim = &held[7];
    assert!(ops.is_current(victim.key(), victim.token()).await.unwrap());
    let revocation = ops.revoke(victim.key()).await.unwrap();
    assert_eq!(
        (revocation.deleted, revocation.raised),
        (3, 3),
        "{revocation:?}"
    );
    assert!(matches!(
        ops.check_token(victim.key(), victim.token()).await.unwrap(),
        TokenCheck::Superseded { .. }
    ));
    assert_eq!(ops.locks("inv:").await.unwrap().locks.len(), 59);
    assert_a_key_of_another_type_is_skipped(&urls, &mut member, &ops).await;
}

/// A key of another type inside the namespace (a set named like a lock key) on every node: the
/// inventory skips it on the standalone servers and on the Cluster member alike, rather than
/// failing the node's scan.
async fn assert_a_key_of_another_type_is_skipped(
    urls: &[String],
    member: &mut RedisClusterMember,
    ops: &Redlock,
) {
    let odd = lock_key("inv:set");
    let shard = member.shard_of(&odd).unwrap();
    let shard_url = member.shard(shard).unwrap().url();
    for url in [&urls[0], &urls[1], &shard_url] {
        let added: u64 = redis::cmd("SADD")
            .arg(&odd)
            .arg("x")
            .query(&mut conn(url))
            .unwrap();
        assert_eq!(added, 1, "{url}");
    }
    let inventory = ops.locks("inv:").await.unwrap();
    assert!(inventory.failures.is_empty(), "{:?}", inventory.failures);
    assert_eq!(inventory.locks.len(), 59);
    assert!(inventory.locks.iter().all(|l| l.key != "inv:set"));
}
