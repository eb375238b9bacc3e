//! Item 3: one Redis server counts as one vote at most. Node URLs that reach the same server
//! (two databases of it, `localhost` and `127.0.0.1`, a Unix socket and TCP) are recognised by
//! the server's run id when connecting; neither counts toward a quorum while the duplication
//! stands, and the failure names both URLs.

use std::time::Duration;

use quorumlock::Redlock;
use quorumlock::testkit::{LocalCluster, ServerOptions};

use crate::support::{NODE_TIMEOUT, TTL, init_tracing};

/// Nodes `[a, b, c]` where `a` and `b` reach the same server and `c`'s server is dead: no
/// acquisition may succeed (two votes of one server are one vote, one of three needs two), and
/// the failure names `a` and `b`.
async fn one_server_is_one_vote(a: String, b: String, dead: String) {
    let locks = Redlock::builder([&a, &b, &dead])
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .expect("distinct URLs build");
    let names = locks.node_names();
    // A round may count one of the two before the other has connected; never both, and from
    // then on neither.
    for round in 0..3 {
        match locks.try_acquire("dup", TTL).await {
            Ok(lock) => panic!(
                "round {round}: acquired with token {} on one server counted twice ({a}, {b})",
                lock.token()
            ),
            Err(e) => {
                assert!(e.is_no_quorum(), "round {round}: {e}");
                let text = e.to_string();
                assert!(
                    text.contains(&names[0]) && text.contains(&names[1]),
                    "round {round}: the error names both URLs: {text}"
                );
                assert!(
                    text.contains("same Redis server"),
                    "round {round}: the error says why: {text}"
                );
            }
        }
    }
}

fn dead_url() -> String {
    let mut dead = LocalCluster::start(1).unwrap_or_else(|e| panic!("{e}"));
    let url = dead.urls().remove(0);
    dead.kill(0).unwrap();
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_of_one_server_count_as_one_vote() {
    init_tracing();
    let cluster = LocalCluster::start(1).unwrap_or_else(|e| panic!("{e}"));
    let url = cluster.urls().remove(0);
    one_server_is_one_vote(format!("{url}/0"), format!("{url}/1"), dead_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_and_its_address_count_as_one_vote() {
    init_tracing();
    let cluster = LocalCluster::start(1).unwrap_or_else(|e| panic!("{e}"));
    let port = cluster.get(0).unwrap().port();
    one_server_is_one_vote(
        format!("redis://localhost:{port}"),
        format!("redis://127.0.0.1:{port}"),
        dead_url(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_and_tcp_to_one_server_count_as_one_vote() {
    init_tracing();
    let cluster = LocalCluster::start_with(1, &ServerOptions::new().unix_socket())
        .unwrap_or_else(|e| panic!("{e}"));
    let server = cluster.get(0).unwrap();
    one_server_is_one_vote(server.unix_url().unwrap(), server.url(), dead_url()).await;
}

/// Distinct servers are unaffected: with the duplicate pair beside two healthy nodes of their
/// own, a five-node client still acquires on the three independent servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_servers_still_form_a_quorum_beside_a_duplicate_pair() {
    init_tracing();
    let cluster = LocalCluster::start(4).unwrap_or_else(|e| panic!("{e}"));
    let urls = cluster.urls();
    let locks = Redlock::builder([
        format!("{}/0", urls[0]),
        format!("{}/1", urls[0]),
        urls[1].clone(),
        urls[2].clone(),
        urls[3].clone(),
    ])
    .node_timeout(NODE_TIMEOUT)
    .build()
    .unwrap();
    let lock = locks
        .try_acquire("dup", TTL)
        .await
        .expect("3 independent of 5");
    lock.release().await.unwrap();
}

/// Nodes `[localhost:P, 127.0.0.1:P, Q]` with both servers up: the pair counts for nothing, so
/// one vote of three is left and not even a fresh client's first acquisition (the pair's run
/// ids not known yet) is granted. Eight fresh clients, one first acquisition each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_clients_first_round_counts_a_duplicate_pair_for_nothing() {
    init_tracing();
    let cluster = LocalCluster::start(2).unwrap_or_else(|e| panic!("{e}"));
    let port = cluster.get(0).unwrap().port();
    let other = cluster.urls().remove(1);
    for run in 0..8 {
        let locks = Redlock::builder([
            format!("redis://localhost:{port}"),
            format!("redis://127.0.0.1:{port}"),
            other.clone(),
        ])
        .node_timeout(NODE_TIMEOUT)
        .build()
        .expect("distinct URLs build");
        match locks.try_acquire("dup-first", TTL).await {
            Ok(lock) => panic!(
                "run {run}: a fresh client's first round was granted (token {}) with one server counted",
                lock.token()
            ),
            Err(e) => {
                assert!(e.is_no_quorum(), "run {run}: {e}");
                assert!(
                    e.to_string().contains("same Redis server"),
                    "run {run}: {e}"
                );
            }
        }
        locks.flush().await;
    }
}
