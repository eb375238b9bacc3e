//! Building a client and its typed errors, `status`, nodes that come back, the background
//! release of a dropped guard, node URLs (unix sockets, passwords, users, databases) and a
//! flushed script cache.

use std::time::Duration;

use crate::LONG;
use crate::support::*;
use quorumlock::{ArgumentError, ConfigError, Error, NodeError, Redlock};

#[tokio::test]
async fn t30_building_needs_no_live_node_and_rejects_bad_config() {
    // Nothing listens on these ports: building still succeeds.
    let locks = Redlock::builder([
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ])
    .build()
    .expect("no connection at build time");
    assert_eq!((locks.node_count(), locks.quorum()), (3, 2));
    let err = locks.try_acquire("k", TTL).await.unwrap_err();
    assert!(err.is_no_quorum(), "{err}");

    let none: [&str; 0] = [];
    assert!(matches!(
        Redlock::builder(none).build(),
        Err(ConfigError::NoNodes)
    ));
    assert!(matches!(
        Redlock::builder(["nonsense://x"]).build(),
        Err(ConfigError::InvalidUrl { .. })
    ));
    assert!(matches!(
        Redlock::builder(["redis://u:secret@127.0.0.1:1", "redis://127.0.0.1:1"]).build(),
        Err(ConfigError::DuplicateNode(n)) if !n.contains("secret")
    ));
    assert!(matches!(
        Redlock::builder(["redis://127.0.0.1:1"])
            .drift_factor(0.7)
            .build(),
        Err(ConfigError::DriftFactor(_))
    ));
    assert!(
        Redlock::builder(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
            .build()
            .is_ok()
    );
    assert!(
        Redlock::builder(["unix:///tmp/none.sock", "redis://127.0.0.1:1/3"])
            .build()
            .is_ok()
    );
}

#[tokio::test]
async fn t31_bad_arguments_are_typed_errors() {
    let cluster = cluster(3);
    let locks = client(&cluster);
    for (key, ttl) in [
        ("", TTL),
        ("}x", TTL),
        ("k", Duration::from_millis(2)),
        ("k", Duration::from_millis(3)),
        ("k", Duration::from_millis(12)),
        ("k", Duration::ZERO),
    ] {
        let err = locks.try_acquire(key, ttl).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument(_)),
            "{key:?} {ttl:?}: {err}"
        );
    }
    // The shortest ttl that works: the drift allowance and a round trip (13 ms at the default
    // drift factor); each shorter one names it.
    let err = locks
        .try_acquire("k", Duration::from_millis(12))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument(quorumlock::ArgumentError::TtlTooShort { min, .. })
                if min == Duration::from_millis(13)
        ),
        "{err}"
    );
    // 13 ms passes the check (whether a round is quick enough to leave validity is the
    // round's outcome, not the argument's).
    let outcome = locks.try_acquire("k", Duration::from_millis(13)).await;
    assert!(
        !matches!(outcome, Err(Error::InvalidArgument(_))),
        "{:?}",
        outcome.err()
    );
}

/// Settings and arguments beyond any sensible value are typed errors, never panics (an
/// `Instant + Duration::MAX` would panic).
#[tokio::test]
async fn t37_absurd_settings_are_typed_errors() {
    let urls = [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ];
    for builder in [
        Redlock::builder(urls).node_timeout(Duration::MAX),
        Redlock::builder(urls).connect_timeout(Duration::from_secs(86_400)),
        Redlock::builder(urls).retry_delay(Duration::ZERO, Duration::MAX),
        Redlock::builder(urls).max_ttl(Duration::MAX),
    ] {
        assert!(
            matches!(builder.build(), Err(ConfigError::TooLong { .. })),
            "accepted an absurd setting"
        );
    }
    let cluster = cluster(3);
    let locks = client(&cluster);
    let err = locks
        .try_acquire("k", Duration::from_secs(50 * 86_400))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(ArgumentError::TtlTooLong(_))),
        "{err}"
    );
    let lock = locks.try_acquire("k", TTL).await.unwrap();
    let err = lock.extend(Duration::MAX).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    lock.release().await.unwrap();
}

#[tokio::test]
async fn t32_status_reports_each_node() {
    let mut cluster = cluster(5);
    let locks = client(&cluster);
    // Connected everywhere first: a round that wins while a node is still connecting
    // does not send to that node (a lock needs only a quorum).
    warm(&locks).await;
    let urls = cluster.urls();
    let lock = locks.try_acquire("job", TTL).await.unwrap();
    spread(&lock, &urls).await;
    cluster.kill(4).unwrap();
    let status = locks.status("job").await.unwrap();
    assert_eq!(status.answered(), 4);
    assert!(status.holder().is_some());
    assert_eq!(status.max_fence(), lock.token());
    assert!(status.nodes[4].state.is_err());
    let held = status.nodes[0].state.as_ref().unwrap();
    assert!(held.ttl.unwrap() > Duration::from_secs(9));
    lock.release().await.unwrap();
    assert_eq!(locks.status("job").await.unwrap().holder(), None);
}

#[tokio::test]
async fn t33_a_killed_node_that_comes_back_is_used_again() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let locks = builder(&cluster)
        .restart_guard(quorumlock::RestartGuard::Off)
        .build()
        .unwrap();
    locks
        .try_acquire("a", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    cluster.kill(0).unwrap();
    locks
        .try_acquire("b", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    cluster.restart(0).unwrap();
    wait_until(WAIT, "node 0 holds a fresh lock again", || async {
        let lock = locks.try_acquire("c", TTL).await.unwrap();
        let back = value_on(&urls[0], "c").is_some();
        lock.release().await.unwrap();
        back
    })
    .await;
}

#[tokio::test]
async fn t34_dropping_the_guard_releases_in_the_background() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let lock = locks.try_acquire("job", LONG).await.unwrap();
    let lost = lock.lost_token();
    drop(lock);
    assert!(
        lost.is_cancelled(),
        "holders watching the token learn the lock is gone"
    );
    wait_until(
        WAIT,
        "dropped lock released long before its ttl",
        || async { holders(&urls, "job") == 0 },
    )
    .await;
}

/// Every URL form a user configures: a unix socket, a password, a user and password, a db.
#[tokio::test]
async fn t35_unix_sockets_passwords_users_and_databases() {
    use quorumlock::testkit::{RedisServer, ServerOptions};
    init_tracing();
    let options = ServerOptions::new().password("s3cret").unix_socket();
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start(&options).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let urls = [
        servers[0].unix_url().unwrap(),
        format!("redis://:s3cret@127.0.0.1:{}/3", servers[1].port()),
        format!("redis://default:s3cret@127.0.0.1:{}/0", servers[2].port()),
    ];
    let locks = Redlock::builder(&urls)
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    assert!(
        locks.node_names().iter().all(|n| !n.contains("s3cret")),
        "passwords are redacted"
    );
    warm(&locks).await;
    let lock = locks
        .try_acquire("job", TTL)
        .await
        .expect("acquire on all three forms");
    // (An extension re-sets the key on a node the acquisition's quorum did not need.)
    wait_until(WAIT, "the key is in db 3 on node 1", || async {
        let mut conn = redis::Client::open(urls[1].as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let there = redis::cmd("EXISTS")
            .arg(lock_key("job"))
            .query::<bool>(&mut conn)
            .unwrap();
        if !there {
            let _ = lock.extend(TTL).await;
        }
        there
    })
    .await;
    lock.release().await.unwrap();

    // A wrong password is a per-node failure with the server's reason, not a hang or a panic.
    let wrong = [
        format!("redis://:nope@127.0.0.1:{}", servers[1].port()),
        format!("redis://:nope@127.0.0.1:{}", servers[2].port()),
        urls[0].clone(),
    ];
    let locks = Redlock::builder(&wrong)
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let err = locks.try_acquire("job", TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        failures
            .iter()
            .all(|f| matches!(f.cause, NodeError::Redis(_))),
        "{err}"
    );
    assert!(!err.to_string().contains("nope"), "{err}");
}

/// Someone runs `SCRIPT FLUSH` on a node: the next call falls back to `EVAL` and still works.
#[tokio::test]
async fn t36_a_flushed_script_cache_falls_back_to_eval() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = client(&cluster);
    locks
        .try_acquire("warm", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for url in &urls {
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    }
    let lock = locks.try_acquire("job", TTL).await.expect("EVAL fallback");
    lock.extend(TTL).await.expect("EVAL fallback");
    lock.release().await.expect("EVAL fallback");
    // The release returned at a quorum: gone from two of the three nodes now. The third node's
    // call can miss the round's deadline on a loaded box (its `NOSCRIPT` → `EVAL` fallback is a
    // new send, which a finished round does not make), and then the key expires there: gone
    // everywhere within the ttl. (Waiting only `WAIT`, equal to the ttl, failed in a suite run
    // beside benchmarks: `timed out after 10s waiting for: released everywhere`.)
    assert!(holders(&urls, "job") <= 1, "the release reached a quorum");
    wait_until(TTL + WAIT, "released everywhere", || async {
        holders(&urls, "job") == 0
    })
    .await;
}

/// What a node count that a quorum serves badly is told, once, when the client is built (no
/// I/O: the nodes need not exist): one node tolerates no failure, an even count no more
/// failures than one node fewer; an odd count of three or more says nothing.
#[test]
fn a_single_node_and_an_even_count_are_warned_about_at_build() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let warnings = |count: u16| {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish();
        let urls: Vec<String> = (0..count)
            .map(|i| format!("redis://127.0.0.1:{}", 1 + i))
            .collect();
        tracing::subscriber::with_default(subscriber, || {
            Redlock::builder(urls)
                .build()
                .expect("a valid configuration");
        });
        let text = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf-8");
        text.lines().map(str::to_owned).collect::<Vec<_>>()
    };
    let one = warnings(1);
    assert_eq!(one.len(), 1, "{one:?}");
    assert!(one[0].contains("one node is no quorum"), "{one:?}");
    for even in [2, 4] {
        let lines = warnings(even);
        assert_eq!(lines.len(), 1, "{even} nodes: {lines:?}");
        assert!(lines[0].contains("prefer an odd count"), "{lines:?}");
    }
    for odd in [3, 5] {
        assert_eq!(warnings(odd), Vec::<String>::new(), "{odd} nodes");
    }
}
