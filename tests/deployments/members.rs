//! Deployment shapes as quorum members (issue 15, items 2 and 3), against real processes the
//! testkit starts: a Redis Cluster (three `redis-server --cluster-enabled yes` joined with
//! `redis-cli --cluster create`) and a Sentinel-managed primary (a primary, a replica, three
//! sentinels), beside standalone masters.

use crate::proxy;

use std::time::Duration;

use crate::support::*;
use quorumlock::testkit::{RedisClusterMember, SentinelGroup};
use quorumlock::{Error, NodeError, Redlock};
use tokio::time::Instant;

/// The max ttl the restart guard holds a restarted or failed-over member out for: short, so the
/// tests see the member come back.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(3);
/// A lock held across a failover: the sentinels demote a live old primary only on their next
/// check of it (several seconds), so it must outlast that without a keep-alive.
const LONG: Duration = Duration::from_secs(60);

pub(crate) fn cluster_member() -> RedisClusterMember {
    init_tracing();
    RedisClusterMember::start().unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) fn sentinel_group() -> SentinelGroup {
    init_tracing();
    SentinelGroup::start().unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) fn client_for(urls: Vec<String>) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .max_ttl(MAX_TTL)
        .build()
        .expect("valid config")
}

/// The URL of the shard of `member` that holds `key`'s lock (and counter).
pub(crate) fn shard_url(member: &mut RedisClusterMember, key: &str) -> String {
    let i = member.shard_of(&lock_key(key)).expect("shard of the key");
    format!(
        "redis://127.0.0.1:{}",
        member.shard(i).expect("shard").port()
    )
}

/// Keys among `probe-0..` whose lock lands on shard `shard` of `member`, `n` of them.
fn keys_on_shard(member: &RedisClusterMember, shard: usize, n: usize) -> Vec<String> {
    (0..10_000)
        .map(|i| format!("probe-{i}"))
        .filter(|k| member.shard_of(&lock_key(k)).expect("slot") == shard)
        .take(n)
        .collect()
}

/// Probes until the member (the last URL) counts toward a quorum again, and returns how long
/// after `since` that was, and whether a probe was refused because the member was held out or
/// being repaired. Each probe key is held by a foreign owner on the first standalone master, so
/// a probe succeeds only with the second one *and* the member: a write the member received but
/// did not count (a shard met with an unknown run id) is no success. Bounded.
pub(crate) async fn first_counted(
    locks: &Redlock,
    foreign_on: &str,
    keys: &[String],
    since: Instant,
) -> (Duration, bool) {
    let mut held_out = false;
    let deadline = Instant::now() + WAIT + MAX_TTL;
    for key in keys.iter().cycle() {
        assert!(Instant::now() < deadline, "the member never counted again");
        set_foreign(foreign_on, key, "someone-else", TTL);
        match locks.try_acquire(key, TTL).await {
            Ok(probe) => {
                let at = since.elapsed();
                probe.release().await.expect("release");
                return (at, held_out);
            }
            Err(Error::NoQuorum { failures, .. }) => {
                held_out |= failures
                    .iter()
                    .any(|f| matches!(f.cause, NodeError::HeldOut { .. } | NodeError::Repairing));
            }
            Err(e) => panic!("a probe failed otherwise: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!("keys is not empty")
}

/// The member (`what`, at `url`) is held out from `since` ([`first_counted`]): a probe was
/// refused for it, and it counted again no earlier than the max ttl after `since`; then its
/// lost fencing counter is restored (at least `token`). Bounded.
async fn held_out_then_repaired(
    locks: &Redlock,
    foreign_on: &str,
    probes: &[String],
    since: Instant,
    url: &str,
    token: u64,
    what: &str,
) {
    let (landed, held_out) = first_counted(locks, foreign_on, probes, since).await;
    assert!(
        held_out,
        "a probe was refused with the member held out or repairing"
    );
    assert!(
        landed >= MAX_TTL,
        "{what} counted {landed:?} after it came back, before the max ttl {MAX_TTL:?}"
    );
    wait_until(WAIT, &format!("{what}'s counter restored"), || async {
        fence_on(url, "job") >= token
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_lock_extend_release_and_fencing_with_a_cluster_member() {
    let standalone = cluster(2);
    let mut member = cluster_member();
    let mut urls = standalone.urls();
    urls.push(member.url());
    let locks = client_for(urls.clone());
    warm(&locks).await;

    let mut last = 0;
    for round in 0..5 {
        let lock = locks.try_acquire("job", TTL).await.expect("acquire");
        assert!(lock.token().get() > last, "round {round}: tokens increase");
        last = lock.token().get();
        // The key and its counter live on one shard of the cluster member.
        let url = shard_url(&mut member, "job");
        spread(&lock, &[urls[0].clone(), urls[1].clone(), url.clone()]).await;
        // The member's acquire may have come after the round's verdict: from a counter that
        // missed an earlier round's `INCR` (below the token: an extension raises it), or with
        // a larger counter than the answers the verdict counted (above it). Awaited, bounded.
        assert!(lock.extend(TTL).await.expect("extend") > Duration::ZERO);
        wait_until(
            WAIT,
            "the counter sits with the key, at or above the token",
            || async {
                fence_on(&url, "job") >= last || {
                    let _ = lock.extend(TTL).await;
                    false
                }
            },
        )
        .await;
        let other = client_for(urls.clone());
        assert!(
            other.try_acquire("job", TTL).await.unwrap_err().is_held(),
            "held while locked"
        );
        lock.release().await.expect("release");
        wait_until(WAIT, "released on the shard", || async {
            value_on(&url, "job").is_none()
        })
        .await;
    }
    // Names spread over every shard.
    for i in 0..30 {
        let key = format!("spread-{i}");
        let lock = locks.try_acquire(&key, TTL).await.expect("acquire");
        lock.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d2_every_member_a_cluster() {
    let members: Vec<RedisClusterMember> = (0..3).map(|_| cluster_member()).collect();
    let urls: Vec<String> = members.iter().map(RedisClusterMember::url).collect();
    let a = client_for(urls.clone());
    let b = client_for(urls.clone());
    warm(&a).await;
    let mut tokens = std::collections::HashMap::new();
    for round in 0..3 {
        for i in 0..10 {
            let key = format!("entity-{i}");
            let lock = a.try_acquire(&key, TTL).await.expect("acquire");
            let before = tokens.insert(key.clone(), lock.token().get()).unwrap_or(0);
            assert!(lock.token().get() > before, "round {round}, {key}");
            assert!(b.try_acquire(&key, TTL).await.unwrap_err().is_held());
            lock.extend(TTL).await.expect("extend");
            lock.release().await.expect("release");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d3_a_shard_killed_then_restarted_empty_never_lets_two_hold_the_lock() {
    let standalone = cluster(2);
    let mut member = cluster_member();
    let mut urls = standalone.urls();
    urls.push(member.url());
    let a = client_for(urls.clone());
    let b = client_for(urls.clone());
    warm(&a).await;
    warm(&b).await;

    let lock = a.try_acquire("job", TTL).await.expect("acquire");
    let token = lock.token().get();
    let shard_url = shard_url(&mut member, "job");
    spread(
        &lock,
        &[urls[0].clone(), urls[1].clone(), shard_url.clone()],
    )
    .await;
    let shard = member.shard_of(&lock_key("job")).expect("shard");

    // The shard holding the key dies: the member fails for that key; the two standalone
    // masters still refuse every other client.
    member.kill_shard(shard).expect("kill");
    match b.try_acquire("job", TTL).await {
        Err(e) => assert!(e.is_held() || e.is_no_quorum(), "{e}"),
        Ok(_) => panic!("two holders while a shard is down"),
    }
    // A lock on the two standalone masters still works.
    let other = a
        .try_acquire("elsewhere", TTL)
        .await
        .expect("2 of 3 members");
    other.release().await.expect("release");

    // Back empty: the shard lost the key and the counter. The member is held out for the max
    // ttl (its youngest master is new) and repaired before it counts again.
    let back = Instant::now();
    member.restart_shard(shard).expect("restart");
    assert!(value_on(&shard_url, "job").is_none(), "restarted empty");
    match b.try_acquire("job", TTL).await {
        Err(e) => assert!(e.is_held() || e.is_no_quorum(), "{e}"),
        Ok(_) => panic!("two holders after the shard came back empty"),
    }
    // The member counts again only once the hold-out is over.
    let probes = keys_on_shard(&member, shard, 20);
    // The shard started after `back`: the hold-out ends no earlier than the max ttl after it.
    // Repaired: the counter the shard lost is back (at least the held lock's token).
    held_out_then_repaired(
        &a,
        &urls[0],
        &probes,
        back,
        &shard_url,
        token,
        "the restarted shard",
    )
    .await;
    lock.release().await.expect("release");
    // Free, once B's own repair of the member (started by its first call after the restart,
    // finished on a later one) is done and A's release has reached the last node (it returns
    // at a quorum): waited for, bounded (a soak run under stress-ng met both at once).
    let again = b.acquire_timeout("job", TTL, WAIT).await.expect("free");
    assert!(again.token().get() > token, "tokens never go backwards");
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d4_a_sentinel_failover_during_a_held_lock_is_held_out_then_repaired() {
    let standalone = cluster(2);
    let group = sentinel_group();
    let mut urls = standalone.urls();
    urls.push(group.url());
    let a = client_for(urls.clone());
    warm(&a).await;

    let old = group.primary_port().expect("primary");
    let old_url = format!("redis://127.0.0.1:{old}");
    let lock = a.try_acquire("job", LONG).await.expect("acquire");
    spread(&lock, &[urls[0].clone(), urls[1].clone(), old_url.clone()]).await;
    let token = lock.token().get();

    // A real failover; then the writes the replica may not have received are lost: here the
    // counter is deleted on the new primary, as asynchronous replication can leave it.
    group.failover().expect("failover");
    let new = group.wait_for_new_primary(old).expect("new primary");
    let promoted = Instant::now();
    let new_url = format!("redis://127.0.0.1:{new}");
    let _: () = redis::cmd("DEL")
        .arg(fence_key("job"))
        .query(&mut conn(&new_url))
        .expect("DEL");

    // Nobody else gets the lock meanwhile.
    let b = client_for(urls.clone());
    match b.try_acquire("job", TTL).await {
        Err(e) => assert!(e.is_held() || e.is_no_quorum(), "{e}"),
        Ok(_) => panic!("two holders across a failover"),
    }

    // The client meets the new primary (a new run id) and holds the member out until the max
    // ttl has passed since it met it (after `promoted`).
    let probes: Vec<String> = (0..20).map(|i| format!("probe-{i}")).collect();
    // Repaired: the lost counter is back on the new primary, so tokens never go backwards.
    held_out_then_repaired(
        &a,
        &urls[0],
        &probes,
        promoted,
        &new_url,
        token,
        "the new primary",
    )
    .await;
    assert!(
        lock.extend(LONG).await.is_ok(),
        "the held lock survives the failover"
    );
    lock.release().await.expect("release");
    let next = a.try_acquire("job", TTL).await.expect("free");
    assert!(next.token().get() > token, "tokens never go backwards");
    next.release().await.expect("release");
}

#[test]
fn d5_member_urls_are_checked_at_build() {
    for url in [
        "redis+cluster://",
        "redis+cluster://127.0.0.1",
        "redis+sentinel://127.0.0.1:26379",
    ] {
        let err = Redlock::builder([url]).build().unwrap_err();
        assert!(err.to_string().contains("invalid node URL"), "{url}: {err}");
    }
    let same = Redlock::builder([
        "redis+sentinel://127.0.0.1:1,127.0.0.1:2/m",
        "redis+sentinel://127.0.0.1:2,127.0.0.1:1/m",
    ])
    .build()
    .unwrap_err();
    assert!(same.to_string().contains("redis+sentinel://"), "{same}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d6_a_cluster_member_restored_from_other_cluster_members() {
    let mut members: Vec<RedisClusterMember> = (0..3).map(|_| cluster_member()).collect();
    let urls: Vec<String> = members.iter().map(RedisClusterMember::url).collect();
    let a = client_for(urls.clone());
    warm(&a).await;
    let lock = a.try_acquire("job", TTL).await.expect("acquire");
    let token = lock.token().get();
    lock.release().await.expect("release");
    let shard_url = shard_url(&mut members[0], "job");
    let shard = members[0].shard_of(&lock_key("job")).expect("shard");
    // The acquire and the release return at a quorum; member 0's calls may land after them
    // (awaited, bounded).
    wait_until(WAIT, "member 0's counter at the token", || async {
        fence_on(&shard_url, "job") == token
    })
    .await;

    // Member 0 loses the shard's counters; its repair reads members 1 and 2 master by master.
    members[0].restart_shard(shard).expect("restart");
    assert_eq!(fence_on(&shard_url, "job"), 0, "restarted empty");
    let deadline = Instant::now() + WAIT + MAX_TTL;
    let mut i = 0;
    while fence_on(&shard_url, "job") < token {
        assert!(Instant::now() < deadline, "member 0 never repaired");
        i += 1;
        if let Ok(probe) = a.try_acquire(&format!("probe-{i}"), TTL).await {
            probe.release().await.expect("release");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = a.try_acquire("job", TTL).await.expect("acquire");
    assert!(next.token().get() > token, "tokens never go backwards");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d7_two_urls_of_one_cluster_count_as_one_vote() {
    let standalone = cluster(1);
    let member = cluster_member();
    let seeds = member.addresses();
    let urls = vec![
        standalone.urls()[0].clone(),
        format!("redis+cluster://{}", seeds[0]),
        format!("redis+cluster://{}", seeds[1]),
    ];
    let locks = client_for(urls);
    counts_once(
        &locks,
        "both cluster URLs report the same server",
        "one cluster counted as two members",
    )
    .await;
}

/// Waits (bounded) until every URL but the first reports `SameServer`, then checks that the
/// one server they reach is one vote: with the first URL alone, no quorum (`twice` otherwise).
async fn counts_once(locks: &Redlock, what: &str, twice: &str) {
    wait_until(WAIT, what, || async {
        locks.status("job").await.is_ok_and(|s| {
            s.nodes[1..]
                .iter()
                .all(|n| matches!(n.state, Err(NodeError::SameServer { .. })))
        })
    })
    .await;
    match locks.try_acquire("job", TTL).await {
        Err(e) => assert!(e.is_no_quorum(), "{e}"),
        Ok(_) => panic!("{twice}"),
    }
}

/// Issue 26, item 7: the one-server check compares the run ids a Cluster member's record holds
/// one by one, not as a whole set: a standalone URL that reaches one of the member's masters is
/// the same server as the member (overlapping views), and neither counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d10_a_standalone_url_of_a_cluster_master_and_the_cluster_count_as_one_vote() {
    let standalone = cluster(1);
    let member = cluster_member();
    let urls = vec![
        standalone.urls()[0].clone(),
        format!("redis://{}", member.addresses()[0]),
        member.url(),
    ];
    let locks = client_for(urls);
    counts_once(
        &locks,
        "the shard URL and the cluster report one server",
        "a Cluster master counted twice: as a standalone URL and in its cluster",
    )
    .await;
}

/// Issue 26, item 7: the Cluster client's own retry may resend an acquire after it ran (the
/// connection broke between the shard's execution and its reply). The resent call finds our
/// own value: that is a failure of the member, not another owner's refusal. Here the shard of
/// the key is reached through a proxy (its announced port is the proxy's), the reply is held
/// back by latency, and the proxy's connections are reset once the key stands on the shard.
/// Node A holds a foreign key, B grants: with the member's answer read as a refusal, two
/// refusals of three ruled out a quorum (`Held`) and the undo skipped the member, leaving our
/// key there for its ttl; read as a failure, the round is `NoQuorum` and the undo clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d11_a_resent_acquire_that_finds_our_value_is_a_member_failure() {
    let standalone = cluster(2);
    let mut member = cluster_member();
    let key = "resend";
    let shard = member.shard_of(&lock_key(key)).expect("shard");
    let shard_url = shard_url(&mut member, key);
    let shard_port = member.shard(shard).expect("shard").port();
    let proxy = proxy::Proxy::start(([127, 0, 0, 1], shard_port).into())
        .await
        .expect("proxy");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("cluster-announce-port")
        .arg(proxy.addr().port())
        .query(&mut conn(&shard_url))
        .expect("CONFIG SET cluster-announce-port");
    // Every shard's view names the proxy before the client meets the cluster.
    let addresses = member.addresses();
    wait_until(WAIT, "the cluster announces the proxy", || async {
        addresses.iter().all(|a| {
            let slots: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut conn(&format!("redis://{a}")))
                .unwrap_or_default();
            slots.contains(&format!(":{}@", proxy.addr().port()))
        })
    })
    .await;
    let urls = {
        let mut u = standalone.urls();
        u.push(member.url());
        u
    };
    set_foreign(&urls[0], key, "someone-else", Duration::from_secs(60));
    let locks = Redlock::builder(urls.clone())
        .node_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2))
        .max_ttl(MAX_TTL)
        .build()
        .expect("valid config");
    warm(&locks).await;
    assert_eq!(
        locks.status(key).await.expect("status").answered(),
        3,
        "every member answers (the shard through the proxy)"
    );

    // Each way: the shard runs the call 2 s after it was sent, and its reply would need 2 s
    // more, far longer than the few ms from the key standing there to the reset below.
    proxy.set_latency(Duration::from_secs(2));
    let attempt = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_acquire(key, Duration::from_secs(60)).await }
    });
    // The shard ran the acquire (our value stands there); its reply is still on the way back.
    wait_until(WAIT, "the acquire ran on the shard", || async {
        value_on(&shard_url, key).is_some_and(|v| v != "someone-else")
    })
    .await;
    proxy.reset();
    proxy.heal();
    let result = tokio::time::timeout(WAIT * 2, attempt)
        .await
        .expect("the attempt ends (within its 10 s node timeout)")
        .expect("task");
    let err = result.map(|l| l.token()).unwrap_err();
    assert!(
        err.is_no_quorum(),
        "the member's resent acquire was read as another owner's refusal: {err}"
    );
    wait_until(WAIT, "the undo cleared our key on the shard", || async {
        value_on(&shard_url, key).is_none()
    })
    .await;
}
