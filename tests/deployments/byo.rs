//! Bring your own client (issue 15, item 4): members given as `redis::Client`s (and a
//! `ClusterClient`) the user configured, against real `redis-server` processes that require a
//! password the member URLs never carry.

#[cfg(feature = "tls")]
use crate::pki;

use std::time::Duration;

use crate::support::*;
use quorumlock::testkit::{LocalCluster, RedisClusterMember, RedisServer, ServerOptions};
use quorumlock::{ConfigError, Error, NodeError, RedlockBuilder};
use redis::{ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo};

const PASSWORD: &str = "byo-s3cret";

fn protected(n: usize) -> LocalCluster {
    init_tracing();
    LocalCluster::start_with(n, &ServerOptions::new().password(PASSWORD))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A client as a service would build it: address, credentials and RESP version in code, no
/// URL anywhere.
fn user_client(port: u16, password: &str, protocol: ProtocolVersion) -> redis::Client {
    let info = ConnectionAddr::Tcp("127.0.0.1".to_owned(), port)
        .into_connection_info()
        .expect("address")
        .set_redis_settings(
            RedisConnectionInfo::default()
                .set_password(password)
                .set_protocol(protocol),
        );
    redis::Client::open(info).expect("client")
}

fn port(cluster: &LocalCluster, i: usize) -> u16 {
    cluster.get(i).expect("node").port()
}

/// Members 0..3 of `cluster` as user clients (the second speaking RESP3), the first with
/// `first_password`, the others with the right one.
fn user_clients(cluster: &LocalCluster, first_password: &str) -> RedlockBuilder {
    RedlockBuilder::default()
        .client(user_client(
            port(cluster, 0),
            first_password,
            ProtocolVersion::RESP2,
        ))
        .client(user_client(
            port(cluster, 1),
            PASSWORD,
            ProtocolVersion::RESP3,
        ))
        .client(user_client(
            port(cluster, 2),
            PASSWORD,
            ProtocolVersion::RESP2,
        ))
}

fn tuned(builder: RedlockBuilder) -> RedlockBuilder {
    builder
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
}

/// Three password-protected nodes reached only through user-built clients (one speaking
/// RESP3): a lock is taken with a token, lands on the nodes, is extended and released; the
/// node names carry no password.
#[tokio::test]
async fn b10_password_nodes_through_user_clients() {
    let cluster = protected(3);
    let locks = tuned(user_clients(&cluster, PASSWORD))
        .build()
        .expect("valid config");
    assert_eq!(
        locks.node_names(),
        (0..3)
            .map(|i| format!("redis://127.0.0.1:{}", port(&cluster, i)))
            .collect::<Vec<_>>()
    );
    warm(&locks).await;
    let lock = locks.try_acquire("byo", TTL).await.expect("acquire");
    assert!(lock.token().get() > 0, "a fencing token");
    let urls = cluster.urls(); // the testkit's URLs carry the password, for direct reads
    spread(&lock, &urls).await;
    assert_eq!(holders(&urls, "byo"), 3);
    lock.extend(TTL).await.expect("extend");
    let first = lock.token();
    lock.release().await.expect("release");
    // The release returns at a quorum; the last node's may come after it (awaited, bounded).
    wait_until(WAIT, "released on every node", || async {
        holders(&urls, "byo") == 0
    })
    .await;
    let again = locks.try_acquire("byo", TTL).await.expect("acquire again");
    assert!(again.token() > first, "tokens increase");
    again.release().await.expect("release");
}

/// Members by URL and by client mix, in any order; a client and a URL for the same server are
/// one node, refused at build.
#[tokio::test]
async fn b11_mixed_url_and_client_members() {
    let cluster = protected(3);
    let urls = cluster.urls();
    let locks = tuned(
        RedlockBuilder::default()
            .node(&urls[0])
            .client(user_client(
                port(&cluster, 1),
                PASSWORD,
                ProtocolVersion::RESP3,
            ))
            .node(&urls[2]),
    )
    .build()
    .expect("valid config");
    let lock = locks.try_acquire("mixed", TTL).await.expect("acquire");
    spread(&lock, &urls).await;
    lock.release().await.expect("release");

    let err = RedlockBuilder::default()
        .node(&urls[0])
        .client(user_client(
            port(&cluster, 0),
            PASSWORD,
            ProtocolVersion::RESP2,
        ))
        .node(&urls[1])
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::DuplicateNode(_)), "{err}");
}

/// Self-healing kept: a node behind a user's client, restarted empty, is reconnected (its
/// credentials come from the client again) and held out of quorums for the max ttl, as a URL
/// node would be.
#[tokio::test]
async fn b12_a_restarted_node_behind_a_user_client_is_held_out() {
    let mut cluster = protected(3);
    let mut builder = RedlockBuilder::default().max_ttl(Duration::from_secs(60));
    for i in 0..3 {
        builder = builder.client(user_client(
            port(&cluster, i),
            PASSWORD,
            ProtocolVersion::RESP2,
        ));
    }
    let locks = tuned(builder).build().expect("valid config");
    warm(&locks).await;
    locks
        .try_acquire("k", TTL)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    cluster.restart_empty(0).unwrap();
    wait_until(WAIT, "node 0 reconnected", || async {
        locks.status("k").await.unwrap().nodes[0].state.is_ok()
    })
    .await;
    cluster.kill(1).unwrap();
    let err = locks.try_acquire("k2", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err}")
    };
    let node0 = format!("redis://127.0.0.1:{}", port(&cluster, 0));
    let held = failures
        .iter()
        .find(|f| f.node == node0)
        .unwrap_or_else(|| panic!("node 0 not listed: {err}"));
    assert!(
        matches!(held.cause, NodeError::HeldOut { remaining } if remaining > Duration::from_secs(50)),
        "node 0: {}",
        held.cause
    );
}

/// A user's client with a wrong password, or none, against a protected node: a typed error
/// naming the refusal, never a panic and never a hang; the other nodes still make the quorum.
#[tokio::test]
async fn b13_a_client_with_wrong_credentials_gives_a_typed_error() {
    let cluster = protected(3);
    let locks = tuned(
        RedlockBuilder::default()
            .client(user_client(
                port(&cluster, 0),
                "wrong",
                ProtocolVersion::RESP2,
            ))
            .client(
                redis::Client::open(format!("redis://127.0.0.1:{}", port(&cluster, 1))).unwrap(),
            )
            .client(user_client(
                port(&cluster, 2),
                PASSWORD,
                ProtocolVersion::RESP2,
            )),
    )
    .build()
    .expect("nothing connects at build");
    let err = locks.try_acquire("auth", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err}")
    };
    assert_eq!(failures.len(), 2, "{err}");
    for f in failures {
        let NodeError::Redis(e) = &f.cause else {
            panic!("{}: expected the server's refusal, got {}", f.node, f.cause)
        };
        let kind = e.kind();
        assert!(
            kind == redis::ErrorKind::AuthenticationFailed
                || e.to_string().to_lowercase().contains("auth"),
            "{}: {e} ({kind:?})",
            f.node
        );
    }
    assert!(
        !err.to_string().contains("wrong"),
        "no password in the message: {err}"
    );

    // With the two good members the third's failure does not matter.
    let good = tuned(user_clients(&cluster, "wrong")).build().unwrap();
    good.try_acquire("auth", TTL)
        .await
        .expect("two of three")
        .release()
        .await
        .expect("release");
}

/// A user's `ClusterClient` as one member beside two URL members: the lock stands on the
/// Cluster's shard for its key and on the standalone nodes.
#[tokio::test]
async fn b14_a_user_cluster_client_as_one_member() {
    let member = {
        init_tracing();
        RedisClusterMember::start().unwrap_or_else(|e| panic!("{e}"))
    };
    let standalone = cluster(2);
    let seeds: Vec<String> = member
        .addresses()
        .iter()
        .map(|a| format!("redis://{a}"))
        .collect();
    let cluster_client = redis::cluster::ClusterClient::builder(seeds)
        .use_protocol(ProtocolVersion::RESP3)
        .build()
        .unwrap();
    let urls = standalone.urls();
    let locks = tuned(
        RedlockBuilder::default()
            .cluster_client(cluster_client)
            .node(&urls[0])
            .node(&urls[1]),
    )
    .build()
    .expect("valid config");
    assert_eq!(locks.node_names()[0], "cluster client #1");
    warm(&locks).await;
    let lock = locks
        .try_acquire("byo-cluster", TTL)
        .await
        .expect("acquire");
    let status = locks.status("byo-cluster").await.expect("status");
    assert_eq!(status.answered(), 3, "{status:?}");
    lock.release().await.expect("release");
}

/// A user's client that reaches a replica instead of a master: the member counts as failed
/// (its writes are refused: `READONLY`), named in the error; the two masters still make the
/// quorum. What `RedlockBuilder::client` documents as "a standalone master, not a replica".
#[tokio::test]
async fn b15_a_client_of_a_replica_counts_as_failed() {
    let masters = cluster(2);
    let replica = RedisServer::start(&ServerOptions::new().replica_of(port(&masters, 0)))
        .unwrap_or_else(|e| panic!("{e}"));
    let urls = masters.urls();
    let locks = tuned(
        RedlockBuilder::default()
            .node(&urls[0])
            .node(&urls[1])
            .client(redis::Client::open(replica.url()).unwrap()),
    )
    .build()
    .expect("valid config");
    locks
        .try_acquire("r", TTL)
        .await
        .expect("two masters of three")
        .release()
        .await
        .expect("release");
    // With one master gone, the replica cannot stand in for it.
    let mut masters = masters;
    masters.kill(1).unwrap();
    let err = locks.try_acquire("r2", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err}")
    };
    let on_replica = failures
        .iter()
        .find(|f| f.node == replica.url())
        .unwrap_or_else(|| panic!("the replica is not named: {err}"));
    assert!(
        matches!(&on_replica.cause, NodeError::Redis(e)
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)),
        "{}",
        on_replica.cause
    );
}

/// A user's client built with its own TLS certificates (a private CA, a client certificate for
/// `tls-auth-clients yes`): kept by the member, which reaches the node over mutual TLS; the
/// same address without the client's certificates is refused.
#[cfg(feature = "tls")]
#[tokio::test]
async fn b16_a_user_client_keeps_its_tls_certificates() {
    let pki = pki::Pki::new();
    init_tracing();
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start(&pki.server_options(true)).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let read = |name: &str| std::fs::read(pki.path(name)).expect("PEM file");
    let tls_client = |s: &RedisServer| {
        redis::Client::build_with_tls(
            s.tls_url().unwrap(),
            redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: read("client.crt"),
                    client_key: read("client.key"),
                }),
                root_cert: Some(read("ca.crt")),
            },
        )
        .expect("TLS client")
    };
    // Room for TLS handshakes in a debug build on a busy box.
    let slow = |b: RedlockBuilder| b.node_timeout(Duration::from_secs(2));
    let locks = slow(
        servers
            .iter()
            .fold(RedlockBuilder::default(), |b, s| b.client(tls_client(s))),
    )
    .build()
    .expect("valid config");
    assert!(
        locks
            .node_names()
            .iter()
            .all(|n| n.starts_with("rediss://"))
    );
    let lock = locks
        .try_acquire("tls", TTL)
        .await
        .expect("over mutual TLS");
    let plain: Vec<String> = servers.iter().map(RedisServer::url).collect();
    spread(&lock, &plain).await;
    lock.release().await.expect("release");

    let bare = slow(servers.iter().fold(RedlockBuilder::default(), |b, s| {
        b.client(redis::Client::open(s.tls_url().unwrap()).unwrap())
    }))
    .build()
    .unwrap();
    let err = bare.try_acquire("tls", TTL).await.unwrap_err();
    assert!(err.is_no_quorum(), "{err}");
}

/// Features that open connections of their own go through the user's clients too: an election
/// over password nodes reached only through clients (RESP3 ones included) leads, writes its
/// leader record (the lock's connection) and is read back; a waiter, which subscribes to release
/// notices (a second connection per node, from the same client), takes the lock once the
/// holder releases.
#[tokio::test]
async fn b17_elections_and_waiting_through_user_clients() {
    let cluster = protected(3);
    let build = || {
        tuned((0..3).fold(RedlockBuilder::default(), |b, i| {
            b.client(user_client(
                port(&cluster, i),
                PASSWORD,
                if i == 1 {
                    ProtocolVersion::RESP3
                } else {
                    ProtocolVersion::RESP2
                },
            ))
        }))
        .build()
        .expect("valid config")
    };
    let locks = build();
    let election = quorumlock::Election::builder(locks.clone(), "byo-e")
        .ttl(TTL)
        .candidate("alpha")
        .build()
        .unwrap();
    let leadership = lead(&election).await;
    let leader = election.leader().await.expect("leader read");
    assert_eq!(
        leader.and_then(|l| l.candidate).as_deref(),
        Some("alpha"),
        "the leader read back through the user's clients"
    );
    leadership.resign().await.expect("resign");

    let other = build();
    let held = locks.try_acquire("w", TTL).await.expect("acquire");
    let waiter = tokio::spawn(async move {
        other
            .acquire_timeout("w", TTL, Duration::from_secs(20))
            .await
    });
    // The waiters marker on the nodes says the waiter was refused and waits (subscribed).
    let marker = format!("{}:waiters", lock_key("w"));
    wait_until(WAIT, "the waiter waits", || async {
        cluster.urls().iter().any(|u| {
            redis::cmd("EXISTS")
                .arg(&marker)
                .query::<u32>(&mut conn(u))
                .expect("EXISTS")
                == 1
        })
    })
    .await;
    held.release().await.expect("release");
    let taken = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("the waiter takes the lock within the wait")
        .expect("task")
        .expect("acquired after the release");
    taken.release().await.expect("release");
}

/// Credentials on a Cluster member (every shard `requirepass`): by URL
/// (`redis+cluster://:PASSWORD@...`) and through a user's `ClusterClient` carrying the
/// password, each beside password-protected standalone nodes reached by client; a cluster
/// client with a wrong password fails with a typed error, never a panic.
#[tokio::test]
async fn b18_a_password_cluster_by_url_and_by_cluster_client() {
    init_tracing();
    let member = RedisClusterMember::start_with(&ServerOptions::new().password(PASSWORD))
        .unwrap_or_else(|e| panic!("{e}"));
    let standalone = protected(2);
    let with_cluster = |b: RedlockBuilder| {
        tuned((0..2).fold(b, |b, i| {
            b.client(user_client(
                port(&standalone, i),
                PASSWORD,
                ProtocolVersion::RESP2,
            ))
        }))
        .build()
        .expect("valid config")
    };
    let seeds = |password: &str| {
        redis::cluster::ClusterClient::builder(
            member
                .addresses()
                .iter()
                .map(|a| format!("redis://{a}"))
                .collect::<Vec<_>>(),
        )
        .password(password)
        .build()
        .unwrap()
    };
    assert!(
        member.url().starts_with("redis+cluster://:"),
        "{}",
        member.url()
    );
    for (what, locks) in [
        (
            "by URL",
            with_cluster(RedlockBuilder::default().node(member.url())),
        ),
        (
            "by cluster client",
            with_cluster(RedlockBuilder::default().cluster_client(seeds(PASSWORD))),
        ),
    ] {
        assert!(
            locks.node_names().iter().all(|n| !n.contains(PASSWORD)),
            "{:?}",
            locks.node_names()
        );
        warm(&locks).await;
        let lock = locks.try_acquire("pw", TTL).await.expect(what);
        let status = locks.status("pw").await.expect("status");
        assert_eq!(status.answered(), 3, "{what}: {status:?}");
        lock.release().await.expect("release");
    }

    let wrong = tuned(
        RedlockBuilder::default()
            .cluster_client(seeds("wrong"))
            .node(&standalone.urls()[0]),
    )
    .build()
    .unwrap();
    let err = wrong.try_acquire("pw", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err}")
    };
    let cluster = failures
        .iter()
        .find(|f| f.node == "cluster client #1")
        .unwrap_or_else(|| panic!("the cluster member is not named: {err}"));
    assert!(
        cluster.cause.to_string().to_lowercase().contains("auth")
            || cluster
                .cause
                .to_string()
                .to_lowercase()
                .contains("password"),
        "{}",
        cluster.cause
    );
}

/// A user's client that names its library (`set_lib_name`) has the name sent on the member's
/// connection (`CLIENT SETINFO`, refused without harm by servers before Redis 7.2); a client
/// that names none sends no `CLIENT SETINFO` at all. Counted on the nodes.
#[tokio::test]
async fn b19_a_library_name_a_client_gives_is_sent_and_none_otherwise() {
    let cluster = protected(3);
    let urls = cluster.urls();
    let named = |i: usize| {
        let info = ConnectionAddr::Tcp("127.0.0.1".to_owned(), port(&cluster, i))
            .into_connection_info()
            .expect("address")
            .set_redis_settings(
                RedisConnectionInfo::default()
                    .set_password(PASSWORD)
                    .set_lib_name("billing", "2.1"),
            );
        redis::Client::open(info).expect("client")
    };
    // What `CLIENT SETINFO` costs a node: counted under its name from Redis 7.2 on, before that
    // among the commands the server does not know.
    let setinfo = |ran: &std::collections::BTreeMap<String, u64>| {
        ran.get("client|setinfo").copied().unwrap_or(0) + ran.get("unknown").copied().unwrap_or(0)
    };
    let before = readings(&urls);
    let plain = tuned(user_clients(&cluster, PASSWORD)).build().unwrap();
    // Connected to every node (a round returns at its quorum), so every set-up is counted.
    warm(&plain).await;
    let between = readings(&urls);
    let locks = tuned(
        RedlockBuilder::default()
            .client(named(0))
            .client(named(1))
            .client(named(2)),
    )
    .build()
    .unwrap();
    warm(&locks).await;
    let after = readings(&urls);
    for i in 0..3 {
        let unnamed = ran_between(&before[i], &between[i]);
        assert_eq!(
            setinfo(&unnamed),
            0,
            "node {i}, a client naming no library: {unnamed:?}"
        );
        let named = ran_between(&between[i], &after[i]);
        assert_eq!(
            setinfo(&named),
            2,
            "node {i}, a client naming one: {named:?}"
        );
    }
}
