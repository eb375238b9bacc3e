//! The fenced acquire without Lua (issue 17): what a Redis 7 node receives (`SET NX PX GET` +
//! `INCR`, no `EVALSHA`), and nodes kept on the acquire
//! script beside pipelined ones in one client, against another client.

use crate::LONG;
use crate::support::*;
use quorumlock::Error;

/// On Redis 7, an acquisition costs each node one `SET` and one `INCR` and no script: after
/// `N` acquire+release, every node counts `N` `EVALSHA` (the releases), `N` `SET`s and `N`
/// `INCR`s.
#[tokio::test]
async fn p1_a_redis_7_node_receives_set_and_incr_and_no_acquire_script() {
    const N: u64 = 20;
    let (_cluster, urls, locks) = pipelining_three().await;
    let mut last = 0;
    for _ in 0..N {
        let lock = locks.acquire("p1", TTL).await.unwrap();
        assert!(lock.token().get() > last);
        last = lock.token().get();
        lock.release().await.unwrap();
    }
    // Every node has run the last release (its key is gone) and all the acquires before it.
    wait_until(WAIT, "every node ran every call", || async {
        urls.iter()
            .all(|u| value_on(u, "p1").is_none() && calls(u, "incr") >= N)
    })
    .await;
    for url in &urls {
        let seen = [script_calls(url), calls(url, "set"), calls(url, "incr")];
        assert_eq!(seen, [N, N, N], "{url}: evalsha, set, incr");
    }
}

/// Nodes kept on the acquire script (1 and 3 of five, in client `a` only) beside pipelined
/// ones: mutual exclusion holds against a client whose nodes all pipeline, tokens strictly
/// increase across both, and the script nodes did run acquire scripts.
#[tokio::test]
async fn p2_script_and_pipelined_nodes_interoperate() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let a = builder(&cluster)
        .testkit_script_acquire(1)
        .testkit_script_acquire(3)
        .build()
        .unwrap();
    let b = client(&cluster);
    for locks in [&a, &b] {
        warm(locks).await;
    }
    reset_stats(&urls);
    let mut last = 0;
    for round in 0..10 {
        let (holder, other) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let lock = holder.acquire("p2", TTL).await.unwrap();
        let token = lock.token().get();
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
        let err = other.try_acquire("p2", TTL).await.unwrap_err();
        assert!(matches!(err, Error::Held { .. }), "round {round}: {err}");
        lock.release().await.unwrap();
    }
    // Both clients send their releases everywhere (10 per node); `a` also sends its acquire
    // scripts, 5 winning and 5 refused, to nodes 1 and 3 only.
    wait_until(WAIT, "every node ran every release", || async {
        urls.iter().all(|u| value_on(u, "p2").is_none())
    })
    .await;
    let evalsha: Vec<u64> = urls.iter().map(|u| script_calls(u)).collect();
    for (i, n) in evalsha.iter().enumerate() {
        if i == 1 || i == 3 {
            assert!(*n >= 20, "node {i}: {evalsha:?}");
        } else {
            assert!(*n < 20, "node {i}: {evalsha:?}");
        }
    }
}

/// Three pipelining (Redis 7) nodes, a client connected to all of them, and their command
/// statistics zeroed.
async fn pipelining_three() -> (Cluster, Vec<String>, quorumlock::Redlock) {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = client(&cluster);
    warm(&locks).await;
    reset_stats(&urls);
    (cluster, urls, locks)
}

/// Zeroes every node's command statistics (`CONFIG RESETSTAT`).
fn reset_stats(urls: &[String]) {
    for url in urls {
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut conn(url))
            .unwrap();
    }
}

/// A release and an extension skip the counter raise where the node's own `INCR` returned the
/// token on the connection they run on: the node stands there already (counters never decrease
/// while the server process lives). An extension reads the lock key (a `GET` inside the
/// script, counted by `INFO commandstats`) on every node and the counter only on the nodes not
/// seen at the token, at most one of three per call; a release reads with `MGET` only, the
/// counter in the same one where it checks it, and runs no `GET`: at most `4 N` `GET`s for `N`
/// acquire + extend + release on 3 nodes. Every node still ends at the last token.
#[tokio::test]
async fn p3_release_and_extend_skip_the_raise_where_the_counter_was_seen_at_the_token() {
    const N: u64 = 20;
    let (_cluster, urls, locks) = pipelining_three().await;
    let mut last = 0;
    for _ in 0..N {
        let lock = locks.acquire("p3", TTL).await.unwrap();
        assert!(lock.token().get() > last);
        last = lock.token().get();
        lock.extend(TTL).await.unwrap();
        lock.release().await.unwrap();
    }
    wait_until(WAIT, "every node ran every call", || async {
        urls.iter()
            .all(|u| value_on(u, "p3").is_none() && script_calls(u) >= 2 * N)
    })
    .await;
    let gets: u64 = urls.iter().map(|u| calls(u, "get")).sum();
    assert!(
        gets <= 4 * N,
        "{gets} GETs for {N} extend + release on 3 nodes"
    );
    for url in &urls {
        assert_eq!(fence_on(url, "p3"), last, "{url}");
    }
}

/// An acquire+release costs each node at most five commands when nobody waits (counted on the
/// nodes: `INFO commandstats`, the commands scripts call included; the clock-jump check's
/// `TIME`, one per node per 10 ms of acquires at most, left out): `SET … NX PX … GET` and
/// `INCR`, then the release's `EVALSHA`, its `MGET` and `DEL`. Also on a node whose `INCR`
/// answered after the verdict (node 0, paused while the other two decide both rounds), where
/// the release checks the counter: it reads it in the same `MGET` as the lock key and the
/// waiters count (node 0's `MONITOR` shows the three keys named there) and, standing at the
/// token, leaves it alone.
#[tokio::test]
async fn p8_acquire_and_release_cost_a_node_at_most_5_commands_also_where_the_counter_is_checked() {
    const N: usize = 5;
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    // A node timeout no loaded machine reaches: node 0's calls wait for it, never given up.
    let locks = builder(&cluster)
        .node_timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap();
    warm(&locks).await;
    let mut monitor = Monitor::start(&urls[0]);
    let before = readings(&urls);
    let mut last = 0;
    let mut node_0 = Vec::new();
    for _ in 0..N {
        cluster.faults().server(0).unwrap().pause().unwrap();
        let lock = locks.acquire("p8", TTL).await.unwrap();
        assert!(lock.token().get() > last);
        last = lock.token().get();
        lock.release().await.unwrap();
        cluster.faults().server(0).unwrap().resume().unwrap();
        // Node 0 runs the round's `SET` and `INCR`, then the release's: its `DEL` ends it.
        let (back, lines) = tokio::task::spawn_blocking(move || {
            let lines = monitor.until(1, |l| l.contains("lua] \"DEL\""));
            (monitor, lines)
        })
        .await
        .unwrap();
        monitor = back;
        node_0.extend(lines);
    }
    let after = readings(&urls);
    for (n, url) in urls.iter().enumerate() {
        let ran = ran_between(&before[n], &after[n]);
        let counted: u64 = ran
            .iter()
            .filter(|(name, _)| name.as_str() != "time")
            .map(|(_, &k)| k)
            .sum();
        assert!(
            counted <= 5 * N as u64,
            "node {n}: {counted} commands for {N} acquire+release (at most {}): {ran:?}",
            5 * N
        );
        assert_eq!(fence_on(url, "p8"), last, "{url}");
    }
    let full = format!(
        "lua] \"MGET\" \"{}\" \"{}:waiters:n\" \"{}\"",
        lock_key("p8"),
        lock_key("p8"),
        fence_key("p8")
    );
    let checked = node_0.iter().filter(|l| l.contains(&full)).count();
    assert_eq!(
        checked, N,
        "node 0's releases that checked the counter in their MGET: {node_0:#?}"
    );
}

/// With fencing off there is no counter to raise (token 0): the release reads none. Counted:
/// the release script's only read on each node is the lock key's, with the waiters count, in
/// one `MGET`, and it runs no `GET` (a plain `SET NX PX` acquires, so every read is the
/// release's; the test reads keys only after counting).
#[tokio::test]
async fn p6_with_fencing_off_a_release_reads_no_counter() {
    const N: u64 = 20;
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster).fencing(false).build().unwrap();
    warm(&locks).await;
    reset_stats(&urls);
    for _ in 0..N {
        let lock = locks.acquire("p6", TTL).await.unwrap();
        lock.release().await.unwrap();
    }
    // Only the releases run scripts here.
    wait_until(WAIT, "every node ran every release", || async {
        urls.iter().all(|u| script_calls(u) >= N)
    })
    .await;
    let reads: Vec<(u64, u64)> = urls
        .iter()
        .map(|u| (calls(u, "get"), calls(u, "mget")))
        .collect();
    assert!(
        reads.iter().all(|&r| r == (0, N)),
        "(GETs, MGETs) per node for {N} releases with fencing off: {reads:?} (one MGET each: \
         the lock key and the waiters count)"
    );
    assert!(urls.iter().all(|u| value_on(u, "p6").is_none()));
}

/// A node that restarted empty between the acquisition and the release is on a new
/// connection: what was seen on the old one says nothing of it, and the release raises its
/// counter back to the token (before the lean release this held for every node).
#[tokio::test]
async fn p4_a_release_raises_the_counter_of_a_node_restarted_since_the_acquisition() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let locks = client(&cluster);
    warm(&locks).await;
    let lock = locks.acquire("p4", TTL).await.unwrap();
    let token = lock.token().get();
    // Every node's own `INCR` gave the token: the release would skip the raise on all three.
    wait_until(WAIT, "every node holds the lock at the token", || async {
        urls.iter()
            .all(|u| value_on(u, "p4").is_some() && fence_on(u, "p4") == token)
    })
    .await;
    cluster.restart_empty(0).unwrap();
    assert_eq!(fence_on(&urls[0], "p4"), 0);
    // The broken connection is replaced on the next call.
    wait_until(WAIT, "node 0 reconnected", || async {
        locks.status("p4").await.unwrap().nodes[0].state.is_ok()
    })
    .await;
    lock.release().await.unwrap();
    wait_until(WAIT, "node 0's counter raised to the token", || async {
        fence_on(&urls[0], "p4") == token
    })
    .await;
    for url in &urls[1..] {
        assert_eq!(fence_on(url, "p4"), token, "{url}");
    }
}

/// Counts the wake-ups of the task that polls the future it wraps, also after the future has
/// finished: whatever kept the task's waker past the end of the call is seen waking it.
struct CountWakes {
    wakes: std::sync::atomic::AtomicUsize,
    task: std::task::Waker,
}

impl std::task::Wake for CountWakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.wakes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.task.wake_by_ref();
    }
}

/// Runs `fut` to its end with every poll's waker counted; returns its output and the counter.
async fn counting_wakes<F: std::future::Future>(fut: F) -> (F::Output, std::sync::Arc<CountWakes>) {
    let mut fut = std::pin::pin!(fut);
    let mut counter: Option<std::sync::Arc<CountWakes>> = None;
    let out = std::future::poll_fn(|cx| {
        let count = counter.get_or_insert_with(|| {
            std::sync::Arc::new(CountWakes {
                wakes: 0.into(),
                task: cx.waker().clone(),
            })
        });
        let waker = std::task::Waker::from(std::sync::Arc::clone(count));
        fut.as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
    })
    .await;
    (out, counter.expect("polled at least once"))
}

/// The calls of a decided round that answer after the verdict (two nodes paused while the
/// acquisition and the release are decided by the other three) do not wake the task that
/// acquired or released: nothing in it reads them there (the lock reads its round's late
/// answers when it releases, the client collects the release's whenever a round settles). They
/// used to, two wake-ups per acquisition and two per release for nothing (issue 17).
#[tokio::test]
async fn p5_answers_after_the_verdict_do_not_wake_the_caller() {
    let mut cluster = cluster(5);
    let locks = client(&cluster);
    warm(&locks).await;
    // Every node has answered everything sent to it before: `status` waits for all five on
    // the same connections, behind the calls of the round before it.
    let all_answered = |what: &'static str| {
        let locks = &locks;
        async move {
            let status = locks.status("p5").await.unwrap();
            for (i, node) in status.nodes.iter().enumerate() {
                assert!(node.state.is_ok(), "{what}: node {i}: {:?}", node.state);
            }
        }
    };
    let paused = |cluster: &mut quorumlock::testkit::LocalCluster, pause: bool| {
        for i in [3, 4] {
            let server = cluster.server(i).unwrap();
            if pause {
                server.pause().unwrap();
            } else {
                server.resume().unwrap();
            }
        }
    };

    paused(cluster.faults(), true);
    let (lock, acquired) = counting_wakes(locks.acquire("p5", TTL)).await;
    let lock = lock.unwrap();
    let at_grant = acquired.wakes.load(std::sync::atomic::Ordering::SeqCst);
    paused(cluster.faults(), false);
    all_answered("after the acquisition").await;
    let status = locks.status("p5").await.unwrap();
    let ours = status
        .nodes
        .iter()
        .filter(|n| n.state.as_ref().is_ok_and(|s| s.value.is_some()))
        .count();
    assert_eq!(ours, 5, "the paused nodes' acquire calls ran");
    assert_eq!(
        acquired.wakes.load(std::sync::atomic::Ordering::SeqCst),
        at_grant,
        "wake-ups of the acquiring task after its acquisition returned"
    );

    paused(cluster.faults(), true);
    let (released, releasing) = counting_wakes(lock.release()).await;
    released.unwrap();
    let at_release = releasing.wakes.load(std::sync::atomic::Ordering::SeqCst);
    paused(cluster.faults(), false);
    all_answered("after the release").await;
    let status = locks.status("p5").await.unwrap();
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.state.as_ref().is_ok_and(|s| s.value.is_none())),
        "the paused nodes' release calls ran: {status:?}"
    );
    assert_eq!(
        releasing.wakes.load(std::sync::atomic::Ordering::SeqCst),
        at_release,
        "wake-ups of the releasing task after its release returned"
    );
}

/// A fresh client (a new process: every cron job is one) takes one uncontended lock on 5 Redis
/// 7 nodes with at most 4 commands per node, connection setup included, read from
/// `INFO commandstats`: whether the nodes' script cache is empty (the first client after a
/// restart) or not. Its release is counted and printed too.
#[tokio::test]
async fn p7_a_fresh_client_takes_a_lock_with_at_most_4_commands_per_node() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    for cache in ["empty", "filled"] {
        let before = readings(&urls);
        // A node timeout no loaded machine reaches: one round, no retry.
        let locks = builder(&cluster)
            .node_timeout(std::time::Duration::from_secs(5))
            .build()
            .unwrap();
        let lock = locks.try_acquire("fresh", LONG).await.expect("acquired");
        let taking = readings(&urls);
        lock.release().await.expect("released");
        locks.flush().await;
        let after = readings(&urls);
        assert_fresh_take(
            &urls,
            [&before, &taking, &after],
            &format!("script cache {cache}"),
        );
    }
}
