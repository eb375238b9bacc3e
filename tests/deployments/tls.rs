//! `rediss://` nodes end to end: real `redis-server` processes listening for TLS, with
//! certificates from a private CA made for the test.

use std::time::Duration;

use crate::pki::Pki;
use crate::support::*;
use quorumlock::testkit::RedisServer;
use quorumlock::{Election, Error, Outcome, Redlock, RunOnce, SkipReason};

/// Room for TLS handshakes (mutual ones included) on a busy machine: a debug build's handshake
/// can take longer than the plain tests' [`NODE_TIMEOUT`]. These tests pin certificates, not
/// speed.
const TLS_NODE_TIMEOUT: Duration = Duration::from_secs(2);
/// The same for connecting: a debug build's mutual handshake on a loaded 2-core box can take
/// longer than the default 1 s connect timeout.
const TLS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS servers signed by the test CA; with `require_client_cert`, mutual TLS.
fn servers(pki: &Pki, n: usize, require_client_cert: bool) -> Vec<RedisServer> {
    init_tracing();
    let options = pki.server_options(require_client_cert);
    (0..n)
        .map(|_| RedisServer::start(&options).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// A lock client for `servers` trusting the CA and presenting the client certificate.
fn client(pki: &Pki, servers: &[RedisServer]) -> Redlock {
    Redlock::builder(tls_urls(servers))
        .node_timeout(TLS_NODE_TIMEOUT)
        .connect_timeout(TLS_CONNECT_TIMEOUT)
        .tls_root_certificate(pki.pem("ca.crt").as_bytes())
        .tls_client_certificate(
            pki.pem("client.crt").as_bytes(),
            pki.pem("client.key").as_bytes(),
        )
        .build()
        .unwrap()
}

fn tls_urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(|s| s.tls_url().unwrap()).collect()
}

/// The lock works over TLS when the client trusts the private CA, and the key lands on the
/// server (read back over its plain port); without the CA every node fails with a certificate
/// error and the outcome is "too few nodes reachable", not a hang or a panic.
#[tokio::test]
async fn t10_rediss_nodes_signed_by_a_private_ca() {
    let pki = Pki::new();
    let servers = servers(&pki, 3, false);
    let locks = Redlock::builder(tls_urls(&servers))
        .node_timeout(TLS_NODE_TIMEOUT)
        .connect_timeout(TLS_CONNECT_TIMEOUT)
        .tls_root_certificate(pki.pem("ca.crt").as_bytes())
        .build()
        .unwrap();
    assert!(
        locks
            .node_names()
            .iter()
            .all(|n| n.starts_with("rediss://"))
    );
    let lock = locks
        .try_acquire("job", LONG_TTL)
        .await
        .expect("acquire over TLS");
    let plain: Vec<String> = servers.iter().map(RedisServer::url).collect();
    spread(&lock, &plain).await;
    lock.release().await.expect("release over TLS");

    let untrusting = Redlock::builder(tls_urls(&servers))
        .node_timeout(TLS_NODE_TIMEOUT)
        .connect_timeout(TLS_CONNECT_TIMEOUT)
        .build()
        .unwrap();
    let err = untrusting.try_acquire("job", LONG_TTL).await.unwrap_err();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err}")
    };
    // Two of three failed nodes decide it (the third may still be connecting).
    assert!(failures.len() >= 2, "{err}");
    assert!(
        failures
            .iter()
            .all(|f| f.cause.to_string().contains("certificate")),
        "{err}"
    );
}

/// Nodes that require client certificates (`tls-auth-clients yes`) accept a client that
/// presents one signed by their CA, and refuse one that does not.
#[tokio::test]
async fn t11_mutual_tls() {
    let pki = Pki::new();
    let servers = servers(&pki, 3, true);
    let builder = || {
        Redlock::builder(tls_urls(&servers))
            .node_timeout(TLS_NODE_TIMEOUT)
            .connect_timeout(TLS_CONNECT_TIMEOUT)
            .tls_root_certificate(pki.pem("ca.crt").as_bytes())
    };
    let anonymous = builder().build().unwrap();
    let err = anonymous.try_acquire("job", LONG_TTL).await.unwrap_err();
    assert!(err.is_no_quorum(), "{err}");

    let locks = builder()
        .tls_client_certificate(
            pki.pem("client.crt").as_bytes(),
            pki.pem("client.key").as_bytes(),
        )
        .build()
        .unwrap();
    let lock = locks
        .try_acquire("job", LONG_TTL)
        .await
        .expect("acquire with a client certificate");
    lock.release().await.expect("release");
}

/// The election's own connections (leader record, pub/sub announcements) use the lock
/// client's certificates: against mutual-TLS nodes signed by a private CA, a campaign leads and
/// writes its leader record on a quorum, and the leader is read back (issue 12, item 9).
#[tokio::test]
async fn t12_election_writes_its_leader_record_over_mutual_tls() {
    let pki = Pki::new();
    let servers = servers(&pki, 3, true);
    let locks = client(&pki, &servers);
    let plain: Vec<String> = servers.iter().map(RedisServer::url).collect();

    let election = Election::builder(locks.clone(), "tls-e")
        .ttl(LONG_TTL)
        .candidate("alpha")
        .build()
        .unwrap();
    let leadership = lead(&election).await;
    let record = "quorumlock:{tls-e}:leader";
    let written = plain
        .iter()
        .filter(|u| {
            redis::cmd("GET")
                .arg(record)
                .query::<Option<String>>(&mut conn(u))
                .expect("GET")
                .is_some()
        })
        .count();
    assert!(written >= 2, "leader record on {written} of 3 nodes");
    let leader = election.leader().await.expect("leader read over TLS");
    assert_eq!(
        leader.and_then(|l| l.candidate).as_deref(),
        Some("alpha"),
        "the leader read back over TLS"
    );
    leadership.resign().await.expect("resign over TLS");
}

/// A run-once job runs its tick over mutual TLS and marks it; the same tick is then skipped as
/// already run (the marker read back over TLS) (issue 12, item 9).
#[tokio::test]
async fn t13_run_once_ticks_over_mutual_tls() {
    let pki = Pki::new();
    let servers = servers(&pki, 3, true);
    let locks = client(&pki, &servers);
    let job = RunOnce::builder(locks, "tls-job")
        .ttl(LONG_TTL)
        .marker_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let outcome = job.run(1, |ctx| async move { ctx.token() }).await.unwrap();
    let Outcome::Ran { marked, .. } = &outcome else {
        panic!("the tick did not run over TLS: {outcome:?}")
    };
    assert!(*marked, "tick marker written over TLS: {outcome:?}");
    let again = job.run(1, |_| async { unreachable!() }).await.unwrap();
    assert!(
        matches!(again.skip_reason(), Some(SkipReason::AlreadyRan { .. })),
        "{again:?}"
    );
}
