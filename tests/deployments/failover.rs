//! Failovers inside a member (issue 26, items 1 and 2): a Redis Cluster master that fails over
//! to a replica that missed writes, and a failback to a server that kept its run id, are held
//! out like a restart.

use std::time::Duration;

use crate::members::{
    MAX_TTL, client_for, cluster_member, first_counted, sentinel_group, shard_url,
};
use crate::support::*;
use quorumlock::testkit::{RedisClusterMember, RedisServer, ServerOptions};
use quorumlock::{Error, Lock, NodeError, Redlock, RedlockBuilder, RestartGuard};
use tokio::time::Instant;

/// The ttl of d8's locks, and its clients' max ttl.
const D8_TTL: Duration = Duration::from_secs(8);

/// One `INFO` field of a server.
fn info_field(url: &str, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg(section).query(&mut conn(url)).ok()?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_owned())
}

/// Issue 26, item 1: a Cluster member whose master fails over to a replica that missed the
/// master's last writes. C1 holds the lock on standalone A and on the member (B unreachable to
/// it); the replica's replication link is cut before C1's write (a wrong `masterauth` makes it
/// fail to reconnect), the master is killed and the replica takes over (`CLUSTER FAILOVER
/// TAKEOVER`): the member now lacks C1's key and counter. C2, which met the member before,
/// sees a run id it has not met: the member must be held out for the max ttl from then (the
/// promoted replica's uptime says nothing about when it was promoted) and repaired, so C2 never
/// takes B plus the member while C1's lock is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d8_a_cluster_failover_to_a_replica_that_missed_writes_is_held_out() {
    let standalone = cluster(2);
    let mut member = cluster_member();
    let shard = member.shard_of(&lock_key("job")).expect("shard");
    let replica = member.add_replica(shard).expect("replica");
    let master_url = shard_url(&mut member, "job");
    let replica_url = member.replica(replica).expect("replica").url();
    let urls = vec![
        standalone.urls()[0].clone(),
        standalone.urls()[1].clone(),
        member.url(),
    ];
    let client = |urls: Vec<String>| failover_builder(urls).build().expect("valid config");
    // B is unreachable to C1 (nothing listens on port 1).
    let c1 = client(vec![
        urls[0].clone(),
        "redis://127.0.0.1:1".to_owned(),
        urls[2].clone(),
    ]);
    let c2 = client(urls.clone());
    warm(&c2).await;
    cut_the_replica_off(&master_url, &replica_url).await;

    let lock = c1.try_acquire("job", D8_TTL).await.expect("C1 acquires");
    let t1 = lock.token().get();
    assert!(
        value_on(&master_url, "job").is_some(),
        "C1 holds on the member"
    );
    let mut on_replica = conn(&replica_url);
    let () = redis::cmd("READONLY")
        .query(&mut on_replica)
        .expect("READONLY");
    let replicated: Option<String> = redis::cmd("GET")
        .arg(lock_key("job"))
        .query(&mut on_replica)
        .expect("GET on the replica");
    assert!(replicated.is_none(), "the replica missed C1's write");

    take_over_with_the_replica(&mut member, shard, replica, &replica_url).await;
    // While C1's lock is valid, C2 never holds it too.
    c2_never_takes_over(&c2, &lock).await;

    // Then the member counts again, repaired: tokens never go backwards.
    let next = until_the_member_counts_again(&c2).await;
    assert!(next.token().get() > t1, "token {} after {t1}", next.token());
    assert!(
        fence_on(&replica_url, "job") >= t1,
        "the promoted replica's counter restored"
    );
    next.release().await.expect("release");
    drop(lock);
}

/// A client builder with the failover tests' timeouts and `D8_TTL` as the max ttl.
fn failover_builder(urls: Vec<String>) -> RedlockBuilder {
    Redlock::builder(urls)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .max_ttl(D8_TTL)
}

/// The replica stops receiving its master's writes, for good (a wrong `masterauth`, its link
/// cut), and it is older than the max ttl.
async fn cut_the_replica_off(master_url: &str, replica_url: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("masterauth")
        .arg("not-the-password")
        .query(&mut conn(replica_url))
        .expect("CONFIG SET masterauth");
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut conn(master_url))
        .expect("CLIENT KILL TYPE replica");
    wait_until(WAIT, "the replica's link is down", || async {
        info_field(replica_url, "replication", "master_link_status").as_deref() == Some("down")
    })
    .await;
    // Older than the max ttl: its uptime must not excuse it from the hold-out.
    wait_until(
        WAIT + D8_TTL,
        "the replica is older than the max ttl",
        || async {
            info_field(replica_url, "server", "uptime_in_seconds")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|s| s > D8_TTL.as_secs() + 1)
        },
    )
    .await;
}

/// The master of `shard` dies; the replica takes over at once, and the cluster routes the key
/// to it.
async fn take_over_with_the_replica(
    member: &mut RedisClusterMember,
    shard: usize,
    replica: usize,
    replica_url: &str,
) {
    member.kill_shard(shard).expect("kill the master");
    let () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query(&mut conn(replica_url))
        .expect("CLUSTER FAILOVER TAKEOVER");
    let other = (shard + 1) % RedisClusterMember::SHARDS;
    let other_url = format!(
        "redis://127.0.0.1:{}",
        member.shard(other).expect("shard").port()
    );
    let replica_port = member.replica(replica).expect("replica").port();
    wait_until(
        WAIT,
        "the cluster routes the key to the promoted replica",
        || async {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut conn(&other_url))
                .unwrap_or_default();
            nodes.lines().any(|l| {
                l.contains(&format!("127.0.0.1:{replica_port}@"))
                    && l.contains("master")
                    && !l.contains("fail")
                    && l.split_whitespace().count() > 8
            })
        },
    )
    .await;
}

/// While C1's `lock` is valid (500 ms margin), C2 tries "job" every 100 ms and never wins;
/// the promoted member is held out or repairing.
async fn c2_never_takes_over(c2: &Redlock, lock: &Lock) {
    let mut held_out = false;
    let mut attempts = 0;
    while lock.validity() > Duration::from_millis(500) {
        match c2.try_acquire("job", D8_TTL).await {
            Ok(second) => panic!(
                "two holders: C2 acquired with token {} while C1's lock (token {}) is valid for {:?} more",
                second.token(),
                lock.token().get(),
                lock.validity()
            ),
            Err(Error::NoQuorum { failures, .. }) => {
                held_out |= failures
                    .iter()
                    .any(|f| matches!(f.cause, NodeError::HeldOut { .. } | NodeError::Repairing));
            }
            Err(e) => assert!(e.is_held(), "{e}"),
        }
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(attempts > 3, "C2 tried {attempts} times only");
    assert!(held_out, "the promoted member was held out or repairing");
}

/// Then the member counts again, repaired: C2 acquires "job" within the bounded wait.
async fn until_the_member_counts_again(c2: &Redlock) -> Lock {
    let deadline = Instant::now() + WAIT + D8_TTL;
    loop {
        assert!(Instant::now() < deadline, "the member never counted again");
        if let Ok(next) = c2.try_acquire("job", D8_TTL).await {
            break next;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 26, item 2: a failback to a server that kept its run id. The client meets primary P,
/// then makes no call while the sentinels fail over to the replica and back to P (demoted,
/// resynchronised from the other server, promoted again: the same process, so the same run
/// id, but its data is now whatever replication brought, which may lack the last writes made
/// while the other server was primary). The client must see the change (P's replication id is
/// new: it was promoted again), hold the member out for the max ttl and repair it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d9_a_failback_to_a_server_that_kept_its_run_id_is_held_out() {
    let standalone = cluster(2);
    let group = sentinel_group();
    let mut urls = standalone.urls();
    urls.push(group.url());
    let a = client_for(urls.clone());
    warm(&a).await;

    let first = group.primary_port().expect("primary");
    group.failover().expect("failover");
    let second = group.wait_for_new_primary(first).expect("new primary");
    // No call from `a` while `second` is primary.
    group.failover().expect("failback");
    let back = group.wait_for_new_primary(second).expect("failback");
    assert_eq!(back, first, "the first primary leads again");
    let since = Instant::now();

    let probes: Vec<String> = (0..20).map(|i| format!("probe-{i}")).collect();
    let (landed, held_out) = first_counted(&a, &urls[0], &probes, since).await;
    assert!(
        held_out,
        "the failback was not seen: the member counted {landed:?} after it, never held out"
    );
    assert!(
        landed >= MAX_TTL,
        "the member counted {landed:?} after the failback, before the max ttl {MAX_TTL:?}"
    );
}

/// How the address of a standalone member moves in [`standalone_failover`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Move {
    /// To the promoted replica (a virtual IP taken over, a DNS name repointed).
    ToReplica,
    /// Nowhere: the server behind it is demoted, resynchronised from the promoted replica and
    /// promoted back (a failback: the same process, the same run id); the failover tooling
    /// closes the clients' connections, as Sentinel does.
    Failback,
}

/// Polls `url` until `INFO replication` says its link to its master is up.
async fn link_up(url: &str) {
    wait_until(WAIT, "the replica's link is up", || async {
        info_field(url, "replication", "master_link_status").as_deref() == Some("up")
    })
    .await;
}

/// A standalone member (one address, here a proxy) whose server is replaced by a promoted
/// replica that missed C1's write. C1 holds "job" on standalone A and the member (B is
/// unreachable to it). Then the address moves to the promoted replica (or the server behind it
/// fails back). Neither C2, a client that met the old server, nor a fresh client with the
/// strict guard (as every `redlock --restart-guard strict` run is) may take "job" while C1's
/// lock is valid: the promoted server is held out for the max ttl from when the client met it
/// and repaired, whatever its uptime and whatever durability marker it replicated.
async fn standalone_failover(aof: bool, how: Move) {
    let standalone = cluster(2);
    let options = if aof {
        ServerOptions::new().aof_always()
    } else {
        ServerOptions::new()
    };
    let start = |o: &ServerOptions| RedisServer::start(o).unwrap_or_else(|e| panic!("{e}"));
    let x = start(&options);
    let y = start(&options.clone().replica_of(x.port()));
    let (x_url, y_url) = (x.url(), y.url());
    link_up(&y_url).await;
    let address = crate::proxy::Proxy::for_url(&x_url).await.expect("proxy");
    let urls = vec![
        standalone.urls()[0].clone(),
        standalone.urls()[1].clone(),
        address.url(),
    ];
    let client = |urls: Vec<String>, guard: RestartGuard| {
        failover_builder(urls)
            .restart_guard(guard)
            .build()
            .expect("valid config")
    };
    let c2 = client(urls.clone(), RestartGuard::Restarted);
    warm(&c2).await;
    promote_the_replica(aof, &x_url, &y_url, &urls).await;

    let c1 = client(
        vec![
            urls[0].clone(),
            "redis://127.0.0.1:1".to_owned(),
            urls[2].clone(),
        ],
        RestartGuard::Restarted,
    );
    let lock = c1.try_acquire("job", D8_TTL).await.expect("C1 acquires");
    let t1 = lock.token().get();
    assert!(value_on(&x_url, "job").is_some(), "C1 holds on the member");
    assert!(value_on(&y_url, "job").is_none(), "the replica missed C1");

    let new_url = move_the_member(how, &address, &x_url, &y).await;
    let moved = Instant::now();
    let what = match how {
        Move::ToReplica => "the member's address moved to the promoted replica",
        Move::Failback => "the member's server failed back",
    };
    let fresh = || client(urls.clone(), RestartGuard::Strict);
    neither_takes_over(&c2, fresh, &lock, moved, what).await;

    // Then the member counts again, repaired: tokens never go backwards.
    let next = until_the_member_counts_again(&c2).await;
    assert!(next.token().get() > t1, "token {} after {t1}", next.token());
    next.release().await.expect("release");
    // Calls start the repair; the member may still be held out when A frees up.
    wait_until(
        WAIT + D8_TTL,
        "the promoted server's counter restored",
        || async {
            let _ = c2.status("job").await;
            fence_on(&new_url, "job") >= t1
        },
    )
    .await;
    drop(lock);
}

/// Replica Y is promoted (with `aof`, once C2's durability marker reached it): from now on it
/// misses X's writes; then every server is older than the max ttl.
async fn promote_the_replica(aof: bool, x_url: &str, y_url: &str, urls: &[String]) {
    if aof {
        // The durability marker C2 wrote on X reaches the replica.
        wait_until(WAIT, "the marker is replicated", || async {
            value_on_raw(y_url, "quorumlock:durability-marker").is_some()
        })
        .await;
    }
    // The replica is promoted: from now on it misses X's writes.
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut conn(y_url))
        .expect("REPLICAOF NO ONE");
    // Every server older than the max ttl: no uptime excuses a hold-out.
    wait_until(
        WAIT + D8_TTL,
        "the servers are older than the max ttl",
        || async {
            [y_url, x_url, &urls[0], &urls[1]].iter().all(|u| {
                info_field(u, "server", "uptime_in_seconds")
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|s| s > D8_TTL.as_secs() + 1)
            })
        },
    )
    .await;
}

/// The member moves as `how` says: its address to Y, or X fails back (demoted, resynchronised
/// from Y, promoted again). Returns the URL of the server now behind the address.
async fn move_the_member(
    how: Move,
    address: &crate::proxy::Proxy,
    x_url: &str,
    y: &RedisServer,
) -> String {
    let y_url = y.url();
    match how {
        Move::ToReplica => {
            address.retarget(crate::proxy::socket_addr(&y_url).expect("address"));
            y_url
        }
        Move::Failback => {
            let () = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(y.port())
                .query(&mut conn(x_url))
                .expect("REPLICAOF (demote)");
            link_up(x_url).await;
            assert!(value_on(x_url, "job").is_none(), "X resynchronised");
            let () = redis::cmd("REPLICAOF")
                .arg("NO")
                .arg("ONE")
                .query(&mut conn(x_url))
                .expect("REPLICAOF NO ONE (promote back)");
            address.reset();
            x_url.to_owned()
        }
    }
}

/// While C1's `lock` is valid (500 ms margin), neither C2 nor a `fresh` strict client (a new
/// one per attempt) takes "job" after the member moved (`what`, at `moved`); both see it held
/// out.
async fn neither_takes_over(
    c2: &Redlock,
    fresh: impl Fn() -> Redlock,
    lock: &Lock,
    moved: Instant,
    what: &str,
) {
    let mut held_out = [false; 2];
    let mut attempts = 0;
    while lock.validity() > Duration::from_millis(500) {
        let fresh = fresh();
        for (i, (who, locks)) in [("C2", c2), ("a fresh strict client", &fresh)]
            .into_iter()
            .enumerate()
        {
            match locks.try_acquire("job", D8_TTL).await {
                Ok(second) => panic!(
                    "two holders: {who} took \"job\" (token {}) {} ms after {what}, while C1's \
                     lock (token {}) was valid for {} ms more",
                    second.token(),
                    moved.elapsed().as_millis(),
                    lock.token().get(),
                    lock.validity().as_millis()
                ),
                Err(Error::NoQuorum { failures, .. }) => {
                    held_out[i] |= failures.iter().any(|f| {
                        matches!(f.cause, NodeError::HeldOut { .. } | NodeError::Repairing)
                    });
                }
                Err(e) => assert!(e.is_held(), "{e}"),
            }
        }
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(attempts > 3, "tried {attempts} times only");
    assert_eq!(held_out, [true; 2], "the promoted server was held out");
}

/// The value of a key by its full name.
fn value_on_raw(url: &str, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut conn(url))
        .ok()
        .flatten()
}

/// A standalone member's address moves to a promoted replica that missed the last lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d12_a_standalone_address_moved_to_a_promoted_replica_is_held_out() {
    standalone_failover(false, Move::ToReplica).await;
}

/// As d12, both servers with `appendfsync always`: the promoted replica carries the durability
/// marker it replicated from the old master, which proves nothing about C1's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d13_a_promoted_replica_is_not_trusted_for_a_replicated_durability_marker() {
    standalone_failover(true, Move::ToReplica).await;
}

/// A standalone member's server demoted, resynchronised and promoted back: the same run id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d14_a_standalone_failback_with_the_same_run_id_is_held_out() {
    standalone_failover(false, Move::Failback).await;
}
