//! What waiting costs the nodes, counted in rounds (`SET`s per node, no timing): a refused
//! round sends no undo, fresh waiters cost at most four rounds a second, a fresh client's lock
//! stands on every node.

use crate::proxy;

use std::time::Duration;

use crate::sets_since;
use crate::support::*;
use quorumlock::Redlock;

/// A round refused on every node by the holder's value costs one call per node: the undo of
/// the attempt skips the nodes that answered "held by another" (our value is not there). A
/// node that did not answer so still gets the undo (w17's hung node).
#[tokio::test]
async fn w16_a_refused_round_sends_no_undo_where_it_was_refused() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = client(&cluster);
    let other = client(&cluster);
    warm(&other).await;
    let ttl = Duration::from_secs(60);
    let lock = holder.acquire("w16", ttl).await.unwrap();
    spread(&lock, &urls).await;
    // Per node: the round's `INCR` (each round is one `SET NX PX GET` + `INCR` per node on
    // Redis 7 nodes) and the undo's `EVALSHA` (the release script).
    let count = || -> Vec<(u64, u64)> {
        urls.iter()
            .map(|u| (calls(u, "incr"), script_calls(u)))
            .collect()
    };
    let made = |before: &[(u64, u64)]| -> Vec<(u64, u64)> {
        count()
            .iter()
            .zip(before)
            .map(|(now, b)| (now.0 - b.0, now.1 - b.1))
            .collect()
    };
    let before = count();
    let err = other.try_acquire("w16", ttl).await.unwrap_err();
    assert!(err.is_held(), "{err}");
    other.flush().await;
    assert_eq!(
        made(&before),
        vec![(1, 0); 5],
        "(round, undo) calls per node for one refused round"
    );
    // Split: two nodes free, three held. The two that said yes get the undo, the others not.
    del_lock(&urls[0], "w16");
    del_lock(&urls[1], "w16");
    let before = count();
    assert!(other.try_acquire("w16", ttl).await.unwrap_err().is_held());
    other.flush().await;
    assert_eq!(
        made(&before),
        vec![(1, 1), (1, 1), (1, 0), (1, 0), (1, 0)],
        "the undo goes where the round said yes"
    );
    assert_eq!(value_on(&urls[0], "w16"), None, "undone");
    lock.release().await.unwrap();
}

/// What the holder of a w18 scenario does while others wait.
#[derive(Debug, Clone, Copy)]
enum Holding {
    /// `acquire` then `keep_alive()`, on a fresh client.
    KeepAlive,
    /// `with_lock` (which keeps the lock alive) on a fresh client.
    WithLock,
    /// `keep_alive()`, the key deleted on two of five nodes after the acquisition: it stands on
    /// a bare majority.
    BareMajority,
}

/// Rounds per second per waiting client while a lock is held: `clients` fresh clients with
/// `per_client` waiters each wait `wait` for a lock `holding` keeps. Returns the largest
/// number of rounds a node received, the largest number of commands a node ran (the holder's
/// extensions included), and the seconds from the first waiter's start to the last one's end.
async fn waiting_rounds(
    cluster: &quorumlock::testkit::LocalCluster,
    key: &'static str,
    holding: Holding,
    (clients, per_client): (usize, usize),
    wait: Duration,
) -> (u64, u64, f64) {
    let urls = cluster.urls();
    let ttl = Duration::from_secs(3);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let holder_client = client(cluster);
    if let Holding::BareMajority = holding {
        // Warm: its acquisition reaches every node, which the test then takes from two.
        warm(&holder_client).await;
    }
    let holder = tokio::spawn(async move {
        match holding {
            Holding::KeepAlive | Holding::BareMajority => {
                let lock = holder_client
                    .acquire_timeout(key, ttl, WAIT)
                    .await
                    .expect("the holder acquires");
                lock.keep_alive();
                let _ = held_tx.send(());
                let _ = stop_rx.await;
                let _ = lock.release().await;
            }
            Holding::WithLock => {
                holder_client
                    .with_lock(key, ttl, |_ctx| async move {
                        let _ = held_tx.send(());
                        let _ = stop_rx.await;
                    })
                    .await
                    .expect("the holder's work ran under the lock");
            }
        }
    });
    tokio::time::timeout(WAIT, held_rx)
        .await
        .expect("the holder acquires in time")
        .expect("the holder runs");
    if let Holding::BareMajority = holding {
        // Every node first holds the key (the acquisition's calls have all landed), then two
        // lose it: it stands on exactly three of five.
        wait_until(WAIT, "every node holds the holder's key", || async {
            holders(&urls, key) == urls.len()
        })
        .await;
        del_lock(&urls[3], key);
        del_lock(&urls[4], key);
    }
    let before = sets(&urls);
    let all_before: Vec<u64> = urls.iter().map(|u| commands(u)).collect();
    let start = tokio::time::Instant::now();
    let waiters: Vec<_> = (0..clients)
        .flat_map(|_| {
            // Fresh: built now, its connections not up yet, as every `redlock` run's.
            let locks = client(cluster);
            (0..per_client).map(move |_| {
                let locks = locks.clone();
                tokio::spawn(async move { locks.acquire_timeout(key, ttl, wait).await })
            })
        })
        .collect();
    for w in waiters {
        let got = tokio::time::timeout(WAIT * 3, w)
            .await
            .expect("the waiter gives up in time")
            .unwrap();
        assert!(got.is_err(), "a waiter acquired a held lock");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let rounds = sets_since(&urls, &before);
    let all = urls
        .iter()
        .zip(&all_before)
        .map(|(u, b)| commands(u) - b)
        .max()
        .unwrap_or(0);
    let _ = stop_tx.send(());
    tokio::time::timeout(WAIT, holder)
        .await
        .expect("the holder ends")
        .unwrap();
    (*rounds.iter().max().unwrap(), all, elapsed)
}

/// While a lock is held, fresh waiting clients cost the nodes at most 4 rounds per second each,
/// whatever the holder does: keep it alive, run `with_lock`, or keep alive a key standing on a
/// bare majority (a waiter's `SET` then succeeds on the other nodes, and the undo of its failed
/// round must not wake it as a release would: issue 27). One and several clients, one and two
/// waiters per client.
///
/// Bound: a waiter refused by a holder makes its round, registers, reads the holder's key, then
/// sleeps until the holder's key would expire on a quorum (at least 2 s ahead: the holder
/// extends its 3 s ttl every second) or 1 s, whichever is first, reads the key again and sleeps
/// on while it stands; past its wait it makes the rounds it still owes (`1 + retry_count` = 4 in
/// all), 1 s apart. Nothing else wakes it (no release). So one client's waiters make 4 rounds
/// in at least 3 s, and 4 per second of the measured time (which only grows on a loaded
/// machine) is not reached by chance: no timing enters the count. Three `SET`s more are allowed
/// per node for the holder: its acquisition's calls to nodes still connecting, which may land
/// after the count started, and its extensions' re-set of a missing key and raise of a lagging
/// counter (once per node each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w18_fresh_waiters_cost_at_most_four_rounds_a_second() {
    let cluster = cluster(5);
    let wait = Duration::from_secs(2);
    let scenarios: [(&'static str, Holding, (usize, usize)); 6] = [
        ("w18-a", Holding::KeepAlive, (1, 1)),
        ("w18-b", Holding::KeepAlive, (3, 2)),
        ("w18-c", Holding::WithLock, (1, 1)),
        ("w18-d", Holding::WithLock, (2, 2)),
        ("w18-e", Holding::BareMajority, (1, 1)),
        ("w18-f", Holding::BareMajority, (3, 1)),
    ];
    let mut report = Vec::new();
    for (key, holding, shape) in scenarios {
        let (rounds, all, secs) = waiting_rounds(&cluster, key, holding, shape, wait).await;
        let per_client = rounds.saturating_sub(3) as f64 / shape.0 as f64 / secs;
        eprintln!(
            "{key} {holding:?} {shape:?}: {rounds} rounds on the busiest node in {secs:.2} s, \
             {per_client:.1} per second per waiting client; {:.0} commands per second per \
             waiting client on the busiest node",
            all as f64 / shape.0 as f64 / secs
        );
        report.push((key, holding, shape, rounds, per_client));
    }
    for (key, holding, shape, rounds, per_client) in report {
        assert!(
            per_client <= 4.0,
            "{key} {holding:?} {shape:?}: {rounds} rounds, {per_client:.1} per second per \
             waiting client (at most 4)"
        );
    }
}

/// A fresh client's won round reaches every reachable node, not just the quorum that answered
/// first: two nodes are reached through proxies that add 40 ms each way, so their connections
/// are still being made when the three others have granted the lock. The calls to them are sent
/// once they connect (within the node timeout), so the key stands on all five. A release right
/// after the acquisition stops that: the calls not yet sent never are, the release skips their
/// nodes and goes after the acquisition on the others (nothing is left behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w19_a_fresh_clients_lock_stands_on_every_node() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let slow = [
        proxy::Proxy::for_url(&urls[3]).await.unwrap(),
        proxy::Proxy::for_url(&urls[4]).await.unwrap(),
    ];
    for p in &slow {
        p.set_latency(Duration::from_millis(40));
    }
    let mut through = urls[..3].to_vec();
    through.extend(slow.iter().map(|p| p.url()));
    let fresh = || {
        Redlock::builder(through.clone())
            .node_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let ttl = Duration::from_secs(60);
    let locks = fresh();
    let lock = locks.acquire("w19", ttl).await.unwrap();
    wait_until(
        WAIT,
        "all five nodes hold the fresh client's key",
        || async { holders(&urls, "w19") == urls.len() },
    )
    .await;
    lock.release().await.unwrap();
    tokio::time::timeout(WAIT, locks.flush())
        .await
        .expect("flush is bounded");
    // Again on a fresh client, released at once.
    let locks = fresh();
    let lock = locks.acquire("w19", ttl).await.unwrap();
    lock.release().await.unwrap();
    tokio::time::timeout(WAIT, locks.flush())
        .await
        .expect("flush is bounded");
    assert_eq!(holders(&urls, "w19"), 0, "a key outlived its release");
}

/// A fresh waiter (a new client: every `redlock run --wait`) refused by a holder makes one
/// round per hold, counted on the nodes (`INCR`s of the fenced acquire): once its subscriptions
/// and marker stand, it reads the holder's key (`PTTL`) and, the key standing, waits for the
/// release notice. It made a second round at once, refused as the first. The waiter then takes
/// the lock at the release, in one more round.
#[tokio::test]
async fn w25_a_fresh_waiter_makes_one_refused_round_per_hold() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = client(&cluster);
    let lock = holder
        .try_acquire("w25", Duration::from_secs(30))
        .await
        .unwrap();
    spread(&lock, &urls).await;
    let waiter = crate::patient(&cluster).await;
    // A fenced round runs one `INCR` per node, refused or not (the pipelined acquire); the
    // waiters mark's `SET` of the waiters count is not a round.
    let incrs = |urls: &[String]| -> Vec<u64> { urls.iter().map(|u| calls(u, "incr")).collect() };
    let before = incrs(&urls);
    let pttls: Vec<u64> = urls.iter().map(|u| calls(u, "pttl")).collect();
    let waiting = tokio::spawn(async move {
        let got = waiter
            .acquire_timeout("w25", Duration::from_secs(30), WAIT)
            .await;
        got.map(|l| l.token())
    });
    // Its refused rounds are over once it has read the holder's key on every node.
    wait_until(WAIT, "the waiter reads the holder's key", || async {
        urls.iter().zip(&pttls).all(|(u, &p)| calls(u, "pttl") > p)
    })
    .await;
    assert_eq!(
        incrs(&urls)
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>(),
        [1; 5],
        "refused rounds per node"
    );
    let released = lock.token();
    lock.release().await.unwrap();
    let token = waiting.await.unwrap().expect("acquired at the release");
    assert!(token > released);
    assert_eq!(
        incrs(&urls)
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>(),
        [2; 5],
        "rounds per node, the won one included"
    );
}
