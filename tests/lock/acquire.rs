//! Acquiring against real redis-server processes: the key on every node, contention, node
//! failures, early decisions, and the cleanup of partial, failed, late and cancelled
//! acquisitions.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::LONG;
use crate::support::*;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, LostReason, NodeError, Redlock};
use tokio::time::Instant;

#[tokio::test]
async fn t10_acquire_sets_the_key_on_every_node_and_release_frees_it_at_once() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);

    let lock = locks.try_acquire("job", LONG).await.expect("acquire");
    assert_eq!(lock.key(), "job");
    assert!(lock.validity() > LONG - Duration::from_secs(2) && lock.validity() <= LONG);
    assert!(lock.token().get() >= 1);
    // acquire returns at the quorum; the other nodes' answers may still be in flight.
    assert!(holders(&urls, "job") >= 3, "a quorum holds the key");

    lock.release().await.expect("release");
    // A quorum is released before release() returns; the rest follow in the background.
    assert!(holders(&urls, "job") <= 2);
    wait_until(WAIT, "key gone from every node", || async {
        holders(&urls, "job") == 0
    })
    .await;
    let again = locks
        .try_acquire("job", TTL)
        .await
        .expect("free at once after release");
    again.release().await.unwrap();
}

#[tokio::test]
async fn t11_second_acquirer_is_told_held_by_another_owner() {
    let cluster = cluster(5);
    let a = client(&cluster);
    let b = client(&cluster);
    let lock = a.try_acquire("job", TTL).await.unwrap();

    let err = b.try_acquire("job", TTL).await.unwrap_err();
    assert!(err.is_held(), "{err}");
    assert!(!err.is_no_quorum());
    match &err {
        Error::Held { held, needed, .. } => {
            assert!(*held >= 3);
            assert_eq!(*needed, 3);
        }
        other => panic!("{other}"),
    }
    // With retries it is still "held", never "unreachable".
    assert!(b.acquire("job", TTL).await.unwrap_err().is_held());
    lock.release().await.unwrap();
}

#[tokio::test]
async fn t12_two_of_five_killed_still_acquires() {
    let mut cluster = cluster(5);
    cluster.kill(0).unwrap();
    cluster.kill(3).unwrap();
    let locks = client(&cluster);
    let lock = locks
        .try_acquire("job", TTL)
        .await
        .expect("3 of 5 is a quorum");
    lock.release().await.expect("release on the 3 live nodes");
}

#[tokio::test]
async fn t13_three_of_five_killed_fails_with_too_few_nodes_naming_each() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    for i in [0, 2, 4] {
        cluster.kill(i).unwrap();
    }
    let locks = client(&cluster);
    let start = Instant::now();
    let err = locks.acquire("job", TTL).await.unwrap_err();
    let took = start.elapsed();
    let Error::NoQuorum {
        needed, failures, ..
    } = &err
    else {
        panic!("expected NoQuorum, got {err}");
    };
    assert_eq!(*needed, 3);
    let mut failed: Vec<&str> = failures.iter().map(|f| f.node.as_str()).collect();
    failed.sort();
    let mut dead = vec![urls[0].as_str(), urls[2].as_str(), urls[4].as_str()];
    dead.sort();
    assert_eq!(failed, dead);
    assert!(
        failures
            .iter()
            .all(|f| matches!(f.cause, NodeError::Refused(_) | NodeError::Dropped(_))),
        "{err}"
    );
    // 4 rounds of refused connections and short pauses: nowhere near a timeout.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("too few nodes reachable") && msg.contains(&urls[2]),
        "{msg}"
    );
}

#[tokio::test]
async fn t14_paused_nodes_do_not_slow_a_success() {
    let mut cluster = cluster(5);
    // A per-node timeout far above what a success may take proves we do not wait for it.
    let slow = Duration::from_secs(5);
    let locks = builder(&cluster).node_timeout(slow).build().unwrap();
    // Connect everywhere first, so the pauses hit live connections.
    locks
        .try_acquire("warm", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    cluster.pause(1).unwrap();
    let start = Instant::now();
    let lock = locks.try_acquire("job", TTL).await.expect("4 of 5 answer");
    lock.release()
        .await
        .expect("release with a quorum of answers");
    let one = start.elapsed();

    cluster.pause(3).unwrap();
    let start = Instant::now();
    let lock = locks.try_acquire("job2", TTL).await.expect("3 of 5 answer");
    lock.release().await.unwrap();
    let two = start.elapsed();

    cluster.resume(1).unwrap();
    cluster.resume(3).unwrap();
    assert!(one < slow / 4, "one hung node cost {one:?}");
    assert!(two < slow / 4, "two hung nodes cost {two:?}");
}

#[tokio::test]
async fn t15_a_failed_attempt_leaves_no_key_even_from_late_answers() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = builder(&cluster).build().unwrap();
    warm(&locks).await;

    // Another owner holds nodes 0..3; node 4 is hung and will answer "yes" late.
    for url in &urls[..3] {
        set_foreign(url, "job", "someone-else", LONG);
    }
    cluster.pause(4).unwrap();
    let err = locks.try_acquire("job", LONG).await.unwrap_err();
    assert!(err.is_held(), "{err}");
    // Node 3 said yes and must have been cleaned up.
    wait_until(WAIT, "node 3 released", || async {
        value_on(&urls[3], "job").is_none()
    })
    .await;
    // Node 4 wakes up, runs the queued acquire, then the queued release after it.
    cluster.resume(4).unwrap();
    wait_until(WAIT, "late yes on node 4 released", || async {
        value_on(&urls[4], "job").is_none()
    })
    .await;
    for url in &urls[..3] {
        assert_eq!(value_on(url, "job").as_deref(), Some("someone-else"));
    }
}

/// A won round leaves a hung node's acquire in flight; when the node wakes after the release,
/// the release queued behind it on the same connection removes the key.
#[tokio::test]
async fn t15b_a_late_yes_after_release_is_undone() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    warm(&locks).await;
    cluster.pause(4).unwrap();
    let lock = locks.try_acquire("job", LONG).await.unwrap();
    lock.release().await.unwrap();
    wait_until(WAIT, "released on the live nodes", || async {
        holders(&urls[..4], "job") == 0
    })
    .await;
    cluster.resume(4).unwrap();
    // Node 4 runs the late acquire, then the release: never left holding the key. (Its fencing
    // counter proves the late acquire did run there.)
    wait_until(WAIT, "node 4 answers again", || async {
        locks.status("job").await.unwrap().nodes[4].state.is_ok()
    })
    .await;
    assert_eq!(value_on(&urls[4], "job"), None);
    assert!(
        fence_on(&urls[4], "job") >= 1,
        "the late acquire ran on node 4"
    );
}

#[tokio::test]
async fn t16_a_cancelled_acquire_leaves_no_partial_lock() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = builder(&cluster)
        .node_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    warm(&locks).await;

    // Three hung nodes: the two live ones say yes, then the round waits on the others.
    for i in [0, 1, 2] {
        cluster.pause(i).unwrap();
    }
    let attempt = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.try_acquire("job", LONG).await })
    };
    wait_until(WAIT, "the live nodes said yes", || async {
        value_on(&urls[3], "job").is_some() && value_on(&urls[4], "job").is_some()
    })
    .await;
    assert!(
        !attempt.is_finished(),
        "the round still waits on the hung nodes"
    );
    // The caller gives up (its own timeout, a select!): the future is dropped midway.
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    wait_until(WAIT, "partial lock on the live nodes released", || async {
        value_on(&urls[3], "job").is_none() && value_on(&urls[4], "job").is_none()
    })
    .await;
    for i in [0, 1, 2] {
        cluster.resume(i).unwrap();
    }
    wait_until(
        WAIT,
        "late acquisitions on the woken nodes released",
        || async { (0..3).all(|i| fence_on(&urls[i], "job") >= 1) && holders(&urls, "job") == 0 },
    )
    .await;
}

#[tokio::test]
async fn t17_stale_handle_cannot_release_the_new_owner() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let a = client(&cluster);
    let b = client(&cluster);
    // Connect b everywhere first: a round that wins while a node is still connecting does not
    // send to that node (a lock needs only a quorum).
    warm(&a).await;
    warm(&b).await;
    let stale = a
        .try_acquire("job", Duration::from_millis(800))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, stale.lost())
        .await
        .expect("deadline passes");
    assert!(stale.is_lost());
    wait_until(WAIT, "the key expires on the nodes", || async {
        holders(&urls, "job") == 0
    })
    .await;

    let fresh = b.try_acquire("job", LONG).await.expect("free after expiry");
    assert!(fresh.token() > stale.token());
    spread(&fresh, &urls).await;
    let err = stale.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::NotOwner { owned: 0, .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(holders(&urls, "job"), 5, "the new owner's key survived");
    fresh.release().await.unwrap();
}

/// Heavy concurrency fills each connection's queue (redis-rs holds 50 commands); whatever the
/// library keeps of its rounds afterwards must not hold on to that room. Then, with two nodes
/// hung, every remaining connection must still carry a whole round. (A version that kept
/// unanswered calls unpolled starved a live node's connection for good: every round timed out
/// on it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t25_connections_stay_usable_after_heavy_concurrency() {
    let mut cluster = cluster(5);
    let locks = client(&cluster);
    warm(&locks).await;
    // The locks are held throughout (long-held locks are the case where anything kept with a
    // lock would stay longest).
    let tasks: Vec<_> = (0..128)
        .map(|t| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let mut held = Vec::new();
                for i in 0..20 {
                    if let Ok(lock) = locks.try_acquire(&format!("k{t}-{i}"), LONG).await {
                        held.push(lock);
                    }
                }
                held
            })
        })
        .collect();
    let held: Vec<_> = tokio::time::timeout(
        Duration::from_secs(120),
        futures::future::try_join_all(tasks),
    )
    .await
    .expect("2,560 rounds within two minutes")
    .expect("no task panicked")
    .into_iter()
    .flatten()
    .collect();
    // Distinct keys: every round can win (a few may time out on a loaded machine).
    assert!(held.len() > 2000, "{} acquired", held.len());
    cluster.pause(0).unwrap();
    cluster.pause(1).unwrap();
    for i in 0..20 {
        let lock = locks
            .acquire(&format!("after-{i}"), LONG)
            .await
            .unwrap_or_else(|e| panic!("round {i} with nodes 2, 3, 4 live: {e}"));
        lock.release().await.unwrap();
    }
    cluster.resume(0).unwrap();
    cluster.resume(1).unwrap();
    drop(held);
    locks.flush().await;
}

/// Mutual exclusion under contention: 8 tasks x 20 acquisitions of one key; no two critical
/// sections overlap (checked live with a counter and afterwards from recorded intervals), and
/// tokens grow with every acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_contention_never_overlaps_and_tokens_grow() {
    let cluster = cluster(5);
    let locks = client(&cluster);
    let inside = Arc::new(AtomicUsize::new(0));
    let record = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (locks, inside, record) = (locks.clone(), inside.clone(), record.clone());
            tokio::spawn(async move {
                for _ in 0..20 {
                    let lock = locks
                        .acquire_timeout("hot", Duration::from_secs(5), Duration::from_secs(60))
                        .await
                        .expect("acquire within the wait");
                    let start = Instant::now();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    // Long enough that an overlap, if the lock allowed one, would be seen.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let end = Instant::now();
                    assert!(!lock.is_lost());
                    record.lock().unwrap().push((start, end, lock.token()));
                    lock.release().await.expect("release");
                }
            })
        })
        .collect();
    tokio::time::timeout(
        Duration::from_secs(120),
        futures::future::try_join_all(tasks),
    )
    .await
    .expect("160 acquisitions within two minutes")
    .expect("no task panicked");
    let mut intervals = record.lock().unwrap().clone();
    assert_eq!(intervals.len(), 160);
    intervals.sort_by_key(|&(start, _, _)| start);
    for w in intervals.windows(2) {
        assert!(w[0].1 <= w[1].0, "critical sections overlap");
        assert!(
            w[0].2 < w[1].2,
            "token did not grow: {} then {}",
            w[0].2,
            w[1].2
        );
    }
}

/// A node known down whose connection is being made again (it came back hung): an
/// acquisition's call to it waits for the connection, and the release must not wait for that
/// call (it waited up to the node timeout: every release paid it while a paused node's
/// connection was re-made, 50 ms by default). The timeouts are 30 s so that a release that
/// waits fails the bounded wait below.
#[tokio::test]
async fn t26_release_does_not_wait_for_a_call_to_a_node_known_down() {
    let mut cluster = cluster(5);
    let locks = patient(&cluster).await;
    // Node 0 dies: the next call to it fails at once, and the client knows it down.
    cluster.kill(0).unwrap();
    let lock = locks.try_acquire("downed", TTL).await.expect("4 of 5");
    lock.release().await.expect("release");
    // It comes back, but hung: a connection to it is accepted and never answered.
    cluster.restart(0).unwrap();
    cluster.pause(0).unwrap();
    // Past the client's reconnect backoff after the refusal (25 ms): a timer of the library's,
    // with no event to await. The next call to node 0 then connects, and waits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lock = tokio::time::timeout(WAIT, locks.try_acquire("downed", LONG_TTL))
        .await
        .expect("the acquisition does not wait for a node known down")
        .expect("4 of 5");
    tokio::time::timeout(WAIT, lock.release())
        .await
        .expect("the release does not wait for the call to the node known down")
        .expect("release");
    cluster.resume(0).unwrap();
}

/// A split vote with a node hung: three other owners' values on three nodes, ours on one, the
/// fifth node SIGSTOPped after the client has connected to it. The undo before the random
/// pause waits for the node that set our value only; the hung node's release goes to it in
/// the background. It waited for every node not known to refuse, the hung one too: each
/// contention round cost the node timeout (50 ms by default; 30 s here, so that an undo that
/// waits fails the bounded waits below).
#[tokio::test]
async fn t27_split_vote_undo_does_not_wait_for_a_hung_node() {
    refused_with_a_node_hung("split", ["x", "y", "z"]).await;
}

/// A refused round with a node hung: another owner's value on three nodes, ours set on one,
/// the fifth node SIGSTOPped after the client has connected to it. The undo of a try that
/// gives up runs in the background, and it releases our value where it was set at once: it
/// waited for the hung node's answer first (the node timeout: 50 ms by default, 30 s here),
/// and our value stood there all that time, refusing everyone else's rounds on that node.
#[tokio::test]
async fn t28_undo_of_a_refused_round_does_not_wait_for_a_hung_node() {
    refused_with_a_node_hung("refused", ["theirs"; 3]).await;
}

/// `others` on nodes 1–3, node 4 hung (30 s node timeout): a try on `key` is refused (a split
/// vote when `others` differ) within [`WAIT`], our value is released on node 0 within [`WAIT`]
/// (the last round's undo runs in the background), and on node 4 once it resumes.
async fn refused_with_a_node_hung(key: &str, others: [&str; 3]) {
    let mut cluster = cluster(5);
    let locks = patient(&cluster).await;
    let urls = cluster.urls();
    for (url, value) in urls[1..4].iter().zip(others) {
        set_foreign(url, key, value, LONG_TTL);
    }
    cluster.pause(4).unwrap();
    // A ttl longer than the waits below: our value does not simply expire meanwhile.
    let err = tokio::time::timeout(WAIT, locks.try_acquire(key, LONG_TTL))
        .await
        .expect("the round and its undo do not wait for the hung node")
        .expect_err("no value of ours stands on a quorum");
    assert!(err.is_held(), "{err}");
    released_on(&urls[0], key, "our value is released on node 0").await;
    cluster.resume(4).unwrap();
    released_on(&urls[4], key, "our value is released on the resumed node").await;
}

/// Waits (bounded by [`WAIT`]) until `key` has no value on the node at `url`.
async fn released_on(url: &str, key: &str, what: &str) {
    wait_until(WAIT, what, || async move { value_on(url, key).is_none() }).await;
}

/// A client whose node and connect timeouts are 30 s, connected to every node: a test that
/// bounds a wait by [`WAIT`] fails if the library waits for a hung node.
async fn patient(cluster: &LocalCluster) -> Redlock {
    let locks = builder(cluster)
        .node_timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    warm(&locks).await;
    locks
}

/// A fresh client (a new process) with one node SIGSTOPped before it is built: its connection
/// to that node is never made, so the acquisition's call there is never handed to a
/// connection. The lock is taken on the other four, and its release must not wait for that
/// call nor for the node (it waited for the call to be handed, up to the node timeout, then
/// for the node again): the key cannot stand where the call was never sent. The timeouts are
/// 5 s, so that a release that waits fails the bounded wait below; the call is never sent
/// afterwards either.
#[tokio::test]
async fn t29_a_fresh_clients_release_does_not_wait_for_a_node_that_never_answered() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    cluster.pause(0).unwrap();
    let locks = builder(&cluster)
        .node_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let took = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), async {
        let lock = locks.try_acquire("fresh", LONG).await.expect("4 of 5");
        lock.release().await.expect("release");
        locks.flush().await;
    })
    .await
    .unwrap_or_else(|_| panic!("acquire, release and flush took {:?}", took.elapsed()));
    assert_eq!(holders(&urls[1..], "fresh"), 0, "released on the others");
    cluster.resume(0).unwrap();
    // The connection is made now; the acquisition's call, given up, is not sent.
    warm(&locks).await;
    locks.flush().await;
    assert_eq!(
        value_on(&urls[0], "fresh"),
        None,
        "never set on the hung node"
    );
}
