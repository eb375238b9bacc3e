//! Fencing tokens against real servers: monotonic across different majorities and empty
//! restarts, counters raised to a quorum, the resource-side checks, and the restart guard.

use std::time::Duration;

use crate::support::*;
use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, FenceGate, FencedWrite, NodeError, RestartGuard, fenced_set};

/// A client with the restart guard off: these tests restart nodes empty on purpose.
fn unguarded(cluster: &LocalCluster) -> Redlock {
    builder(cluster)
        .restart_guard(RestartGuard::Off)
        .build()
        .unwrap()
}

/// Tokens strictly increase over many acquisitions while different minorities are paused or
/// killed between them, so that different majorities win different rounds.
#[tokio::test]
async fn t10_tokens_grow_across_different_majorities() {
    let mut cluster = cluster(5);
    let locks = unguarded(&cluster);
    let mut last = 0;
    // (paused, killed) per round: every pair of nodes sits out at some point.
    let faults: &[(&[usize], &[usize])] = &[
        (&[], &[]),
        (&[0, 1], &[]),
        (&[2], &[3]),
        (&[], &[4, 0]),
        (&[1, 3], &[]),
        (&[4], &[2]),
        (&[0], &[1]),
        (&[], &[]),
    ];
    for (round, (paused, killed)) in faults.iter().enumerate() {
        for &i in *paused {
            cluster.pause(i).unwrap();
        }
        for &i in *killed {
            cluster.kill(i).unwrap();
        }
        for _ in 0..3 {
            let lock = locks
                .acquire("fenced", TTL)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            let token = lock.token().get();
            assert!(token > last, "round {round}: token {token} after {last}");
            last = token;
            lock.release().await.unwrap();
        }
        for &i in *paused {
            cluster.resume(i).unwrap();
        }
        for &i in *killed {
            cluster.restart(i).unwrap(); // back empty: counter 0 there
        }
    }
}

/// When the winning majority's counters disagree, the lower ones are raised so that a quorum
/// stands at the token; the next holder, whatever its majority, gets a greater token.
#[tokio::test]
async fn t11_counters_are_raised_to_a_quorum() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = unguarded(&cluster);
    // Node 0 saw many earlier terms the others missed; with nodes 3 and 4 down, every quorum
    // is {0, 1, 2} and node 0's counter is the maximum.
    set_fence(&urls[0], "k", 100);
    cluster.kill(3).unwrap();
    cluster.kill(4).unwrap();
    let lock = locks.acquire("k", TTL).await.unwrap();
    assert_eq!(lock.token().get(), 101);
    for url in &urls[..3] {
        assert!(
            fence_on(url, "k") >= 101,
            "{url} was not raised to the token"
        );
    }
    lock.release().await.unwrap();

    // Without node 0, and with 3 and 4 back empty, nodes 1 and 2 still know 101.
    cluster.kill(0).unwrap();
    cluster.restart(3).unwrap();
    cluster.restart(4).unwrap();
    let next = locks.acquire("k", TTL).await.unwrap();
    assert!(next.token().get() > 101, "{}", next.token());
    next.release().await.unwrap();
}

/// Different majorities win while no lock is ever released (locks are left to expire: here
/// deleted by hand, as their expiry would), so nothing heals the counters between rounds: only
/// the raise to a quorum keeps tokens growing. The schedule is one where tokens would repeat
/// without it (round 3's majority {1, 3, 4} meets round 2's quorum only at node 1).
#[tokio::test]
async fn t13_tokens_grow_when_locks_expire_under_different_majorities() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    // Nodes held by another owner in each round: the other three are the winning majority.
    let refusing: &[&[usize]] = &[
        &[3, 4],
        &[0, 1],
        &[2, 0],
        &[1, 4],
        &[2, 3],
        &[0, 4],
        &[1, 2],
    ];
    let mut last = 0;
    for (round, refusing) in refusing.iter().enumerate() {
        for url in &urls {
            del_lock(url, "k");
        }
        for &i in *refusing {
            set_foreign(&urls[i], "k", "another-owner", TTL);
        }
        let lock = locks
            .try_acquire("k", TTL)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let token = lock.token().get();
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        let at_token = urls.iter().filter(|u| fence_on(u, "k") >= token).count();
        assert!(
            at_token >= 3,
            "round {round}: only {at_token} nodes stand at {token}"
        );
        lock.forget();
        // The round returned at its quorum: a refusing node's call may not have run yet, and
        // run after the next round's `del_lock`, it would set the key there.
        locks.flush().await;
    }
}

/// Nodes restarted empty (a minority, counters lost) do not make tokens go backwards, because a
/// majority kept its counters.
#[tokio::test]
async fn t12_tokens_survive_a_minority_restarted_empty() {
    let mut cluster = cluster(5);
    let locks = unguarded(&cluster);
    let mut last = 0;
    for _ in 0..5 {
        let lock = locks.acquire("k", TTL).await.unwrap();
        last = lock.token().get();
        lock.release().await.unwrap();
    }
    cluster.restart_empty(0).unwrap();
    cluster.restart_empty(1).unwrap();
    // Three nodes kept their counters; every quorum includes one of them.
    for _ in 0..5 {
        let lock = locks
            .acquire("k", TTL)
            .await
            .expect("3 intact nodes answer");
        let t = lock.token().get();
        assert!(t > last, "token {t} after {last}");
        last = t;
        lock.release().await.unwrap();
    }
}

/// The post-mortem (seed 002): holder A keeps its lease alive, then its process stalls (a
/// stop-the-world pause: here A's whole runtime thread is frozen, lease task included) past the
/// ttl. B takes the lock with a greater token and writes. When A wakes, it can see the lock is
/// lost before it writes, and the resource rejects its late write anyway.
#[tokio::test]
async fn t20_a_stalled_holder_is_fenced_off() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let ttl = Duration::from_millis(600);
    let store_url = urls[0].clone();
    let a = client(&cluster);
    let (to_main, from_a) = std::sync::mpsc::channel::<u64>();
    let (to_a, from_main) = std::sync::mpsc::channel::<()>();
    // Worker A, on a runtime of its own so that freezing its thread freezes all of A.
    let worker_a =
        std::thread::spawn(move || stalled_holder(&a, ttl, &store_url, &to_main, &from_main));
    let token_a = tokio::task::spawn_blocking(move || from_a.recv_timeout(WAIT))
        .await
        .unwrap()
        .expect("A acquired");

    let b = client(&cluster);
    let worker_b = b
        .acquire_timeout("payout-42", TTL, WAIT)
        .await
        .expect("B takes over once A's lock expires");
    assert!(worker_b.token().get() > token_a);
    let mut store = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&crate::support::direct_config())
        .await
        .unwrap();
    assert_eq!(
        fenced_set(&mut store, "payout:42", worker_b.token(), "paid-by-b")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    to_a.send(()).unwrap();
    let (knew_it_was_lost, late) = tokio::task::spawn_blocking(move || worker_a.join())
        .await
        .unwrap()
        .expect("worker A");
    assert!(
        knew_it_was_lost,
        "A's lost signal had fired by the time it could check"
    );
    assert_eq!(
        late,
        FencedWrite::Stale {
            highest: worker_b.token()
        }
    );
    let stored: String = redis::cmd("GET")
        .arg("payout:42")
        .query_async(&mut store)
        .await
        .unwrap();
    assert_eq!(stored, "paid-by-b");
    // B may write again with the same token; the in-process gate agrees with the Lua check.
    assert_eq!(
        fenced_set(&mut store, "payout:42", worker_b.token(), "paid-by-b-2")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    let gate = FenceGate::new();
    gate.admit(worker_b.token()).unwrap();
    assert_eq!(
        gate.admit(quorumlock::FencingToken::new(token_a))
            .unwrap_err()
            .highest,
        worker_b.token()
    );
    worker_b.release().await.unwrap();
}

/// Holder A: acquires, keeps its lease alive and writes once (sending its token on
/// `acquired`), then stalls past the ttl with its whole runtime frozen; once `b_wrote`, it
/// reports whether it knew it had lost the lock, and what its late write got.
fn stalled_holder(
    a: &Redlock,
    ttl: Duration,
    store_url: &str,
    acquired: &std::sync::mpsc::Sender<u64>,
    b_wrote: &std::sync::mpsc::Receiver<()>,
) -> (bool, FencedWrite) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let lock = a.acquire("payout-42", ttl).await.unwrap();
        lock.keep_alive();
        let mut store = redis::Client::open(store_url)
            .unwrap()
            .get_multiplexed_async_connection_with_config(&crate::support::direct_config())
            .await
            .unwrap();
        let first = fenced_set(&mut store, "payout:42", lock.token(), "started-by-a")
            .await
            .unwrap();
        assert_eq!(first, FencedWrite::Written);
        acquired.send(lock.token().get()).unwrap();
        // The pause: nothing of A runs, its lease cannot extend.
        std::thread::sleep(ttl * 3);
        // A wakes, and waits until B has written (so its late write comes after B's).
        b_wrote.recv_timeout(WAIT).expect("B wrote");
        let knew_it_was_lost = lock.is_lost();
        let late = fenced_set(&mut store, "payout:42", lock.token(), "paid-by-a")
            .await
            .unwrap();
        (knew_it_was_lost, late)
    })
}

/// A client with `max_ttl` that has held "k" once, connected to every node first: a restart is
/// only seen by a client that knew the node before it (a round returns at its quorum, so an
/// acquire does not prove that).
async fn knowing(cluster: &LocalCluster, max_ttl: Duration) -> Redlock {
    let locks = builder(cluster).max_ttl(max_ttl).build().unwrap();
    warm(&locks).await;
    locks
        .acquire("k", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locks
}

/// The delayed-restart rule (default guard): a node this client saw restart empty counts
/// toward no quorum until the max ttl has passed, and errors say so.
#[tokio::test]
async fn t30_a_node_seen_restarting_is_held_out() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = knowing(&cluster, Duration::from_secs(60)).await;
    cluster.restart_empty(0).unwrap();
    // The broken connection is replaced on the next call, which reads the new run id.
    wait_until(WAIT, "node 0 reconnected", || async {
        locks.status("k").await.unwrap().nodes[0].state.is_ok()
    })
    .await;
    // With two more nodes down, the held-out node cannot make up the quorum.
    cluster.kill(1).unwrap();
    cluster.kill(2).unwrap();
    let err = locks.try_acquire("k3", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("{err}")
    };
    let held_out = failures
        .iter()
        .find(|f| f.node == urls[0])
        .expect("node 0 listed");
    match held_out.cause {
        NodeError::HeldOut { remaining } => {
            assert!(remaining > Duration::from_secs(50) && remaining <= Duration::from_secs(60))
        }
        ref other => panic!("node 0: {other}"),
    }
    assert!(err.to_string().contains("held out"), "{err}");
}

/// Regression: `uptime_in_seconds` is the difference of two whole-second clock readings, so a
/// node restarted just before a second boundary reads 1 a few ms later. Taken at face value,
/// the hold-out ended up to a second early (at once with a 1 s max ttl: the chaos suite saw the
/// overlap). The hold-out must end no earlier than the max ttl after the restart began.
#[tokio::test]
async fn t34_a_restart_straddling_a_second_boundary_is_held_out_for_the_whole_max_ttl() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let max_ttl = Duration::from_secs(3);
    let locks = builder(&cluster).max_ttl(max_ttl).build().unwrap();
    warm(&locks).await;
    let mut straddled = false;
    // How long before a second boundary the restart begins: it must start the server before the
    // boundary, so a loaded machine (a slow start) gets a longer lead on each miss.
    let mut lead = Duration::from_millis(50);
    for attempt in 0..8 {
        // No event marks a wall-clock second boundary: sleep to `lead` before the next one.
        let to_boundary = || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            Duration::from_nanos(1_000_000_000 - u64::from(now.subsec_nanos()))
        };
        if to_boundary() < lead {
            tokio::time::sleep(to_boundary()).await;
        }
        tokio::time::sleep(to_boundary().saturating_sub(lead)).await;
        let restarting = std::time::Instant::now();
        cluster.restart_empty(0).unwrap();
        // Started before the boundary: read the uptime just after it (it then reads 1 while the
        // node is well under a second old).
        let left = to_boundary();
        if restarting.elapsed() + left < lead + Duration::from_millis(100) {
            tokio::time::sleep(left + Duration::from_millis(5)).await;
        }
        let uptime: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut conn(&urls[0]))
            .unwrap();
        let reads_one = uptime.contains("uptime_in_seconds:1\r\n");
        let this_straddled = reads_one && restarting.elapsed() < Duration::from_millis(600);
        straddled |= this_straddled;
        if !this_straddled {
            lead = (lead * 2).min(Duration::from_millis(400));
        }
        wait_until(WAIT, "node 0 reconnected", || async {
            locks.status("k").await.unwrap().nodes[0].state.is_ok()
        })
        .await;
        // With the other two hung, the round fails and lists node 0 with its hold-out.
        cluster.pause(1).unwrap();
        cluster.pause(2).unwrap();
        let err = locks.try_acquire("k", TTL).await;
        let since_restart = restarting.elapsed();
        cluster.resume(1).unwrap();
        cluster.resume(2).unwrap();
        let err = err.expect_err("only node 0 is live, and it is held out");
        let Error::NoQuorum { failures, .. } = &err else {
            panic!("{err}")
        };
        let remaining = failures
            .iter()
            .find_map(|f| match f.cause {
                NodeError::HeldOut { remaining } if f.node == urls[0] => Some(remaining),
                _ => None,
            })
            .unwrap_or_else(|| panic!("node 0 held out: {err}"));
        assert!(
            remaining + since_restart >= max_ttl - Duration::from_millis(100),
            "attempt {attempt}: held out {remaining:?} more, {since_restart:?} after the restart \
             began (uptime read 1: {reads_one})"
        );
        if straddled {
            break;
        }
    }
    assert!(
        straddled,
        "no restart straddled a second boundary: nothing was tested"
    );
}

/// The strict guard, for short-lived processes: nodes started less than the max ttl ago are
/// held out on first contact, and the error names each with how long.
#[tokio::test]
async fn t31_strict_guard_holds_out_freshly_started_nodes() {
    // Young nodes (their uptime is what is judged): never a reused cluster.
    let cluster = fresh_cluster(3);
    let locks = builder(&cluster)
        .restart_guard(RestartGuard::Strict)
        .max_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    // Even the first round, which connects and learns the uptimes, must not count them.
    let err = locks.try_acquire("k", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("{err}")
    };
    // The round stops as soon as a quorum is impossible: at least 2 of 3 are listed.
    assert!(failures.len() >= 2, "{err}");
    for f in failures {
        let NodeError::HeldOut { remaining } = f.cause else {
            panic!("{f}")
        };
        assert!(remaining > Duration::from_secs(20), "{f}");
    }
    // Once every node is connected, a failed round names each held-out node, answered or not.
    warm(&locks).await;
    let err = locks.try_acquire("k", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(failures.len(), 3, "{err}");
    assert!(
        failures
            .iter()
            .all(|f| matches!(f.cause, NodeError::HeldOut { .. })),
        "{err}"
    );
    // The default guard trusts the same fresh nodes.
    let relaxed = client(&cluster);
    relaxed
        .try_acquire("k", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Different minorities restarted empty one after the other, each seen by the client: the
/// restarted node's counters are restored from the others before it counts again, so a later
/// majority made only of restarted nodes still hands out a greater token (the chaos suite's
/// t90 regression).
#[tokio::test]
async fn t32_counters_are_restored_on_restarted_nodes() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let max_ttl = Duration::from_millis(300);
    let locks = builder(&cluster).max_ttl(max_ttl).build().unwrap();
    warm(&locks).await;
    let ttl = Duration::from_millis(250);
    let mut last = 0;
    for _ in 0..5 {
        let lock = locks.acquire("k", ttl).await.unwrap();
        last = lock.token().get();
        lock.release().await.unwrap();
    }
    for i in [0, 1] {
        cluster.restart_empty(i).unwrap();
        // The client notices the restart on its next call to the node and repairs it.
        wait_until(WAIT, "restarted node's counter restored", || async {
            let _ = locks.status("k").await;
            fence_on(&urls[i], "k") >= last
        })
        .await;
    }
    // Only the two restarted nodes are left: their counters remember the latest token.
    cluster.kill(2).unwrap();
    let next = std::sync::atomic::AtomicU64::new(0);
    wait_until(WAIT, "the restarted nodes count again", || async {
        match locks.try_acquire("k", ttl).await {
            Ok(lock) => {
                next.store(lock.token().get(), std::sync::atomic::Ordering::SeqCst);
                lock.release().await.is_ok()
            }
            Err(_) => false,
        }
    })
    .await;
    let next = next.into_inner();
    assert!(next > last, "token {next} after {last}");
}

/// A restarted node whose counters cannot be restored (too few clean nodes answer) stays out
/// of every quorum, past the delayed-restart window, and says why; it rejoins once restored.
#[tokio::test]
async fn t33_an_unrepaired_node_stays_out() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let locks = knowing(&cluster, Duration::from_millis(200)).await;
    cluster.pause(2).unwrap(); // one of the two sources hangs
    cluster.restart_empty(0).unwrap();
    wait_until(WAIT, "node 0 reported as repairing", || async {
        match locks.try_acquire("k", Duration::from_millis(500)).await {
            Err(Error::NoQuorum { failures, .. }) => failures
                .iter()
                .any(|f| f.node == urls[0] && matches!(f.cause, NodeError::Repairing)),
            Ok(lock) => {
                lock.release().await.ok();
                false
            }
            Err(_) => false,
        }
    })
    .await;
    cluster.resume(2).unwrap();
    wait_until(WAIT, "node 0 restored and counting", || async {
        fence_on(&urls[0], "k") >= 1
            && locks
                .try_acquire("k", TTL)
                .await
                .map(|l| l.forget())
                .is_ok()
    })
    .await;
}

/// Fencing can be turned off for raw throughput: locks still exclude each other, tokens are 0,
/// no counter is written, and elections refuse such a client.
#[tokio::test]
async fn t40_without_fencing_locks_still_exclude_and_hand_out_no_tokens() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = builder(&cluster).fencing(false).build().unwrap();
    let lock = locks.try_acquire("plain", TTL).await.unwrap();
    assert_eq!(lock.token().get(), 0);
    assert!(locks.try_acquire("plain", TTL).await.unwrap_err().is_held());
    lock.extend(TTL).await.unwrap();
    lock.release().await.unwrap();
    wait_until(WAIT, "released everywhere", || async {
        holders(&urls, "plain") == 0
    })
    .await;
    assert!(urls.iter().all(|u| fence_on(u, "plain") == 0));
    let err: Error = quorumlock::Election::builder(locks, "e")
        .build()
        .unwrap_err()
        .into();
    assert!(
        matches!(err, Error::Config(quorumlock::ConfigError::FencingRequired)),
        "{err}"
    );
}
