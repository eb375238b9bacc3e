//! `rediss://` nodes end to end: real `redis-server` processes listening for TLS, with
//! certificates from a private CA made for the test.

mod support;

use std::time::Duration;

use quorumlock::testkit::{RedisServer, ServerOptions};
use quorumlock::{Error, Redlock};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use support::*;

const TTL: Duration = Duration::from_secs(30);

/// A private CA with a server certificate for 127.0.0.1 and a client certificate, as PEM files.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    client_cert: String,
    client_key: String,
}

/// Certificate parameters with their own common name (rcgen's default name is the same for
/// every certificate, which makes OpenSSL take a leaf for a self-signed one).
fn params(name: &str, alt_names: &[&str]) -> CertificateParams {
    let alt_names = alt_names
        .iter()
        .map(|n| (*n).to_owned())
        .collect::<Vec<_>>();
    let mut params = CertificateParams::new(alt_names).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params
}

impl Pki {
    fn new() -> Pki {
        let mut ca_params = params("quorumlock test CA", &[]);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server = params("redis test server", &["127.0.0.1", "localhost"])
            .signed_by(&server_key, &ca)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let client = params("quorumlock test client", &["client.test"])
            .signed_by(&client_key, &ca)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("server.crt"), server.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), server_key.serialize_pem()).unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
        Pki {
            dir,
            ca: ca.pem(),
            client_cert: client.pem(),
            client_key: client_key.serialize_pem(),
        }
    }

    fn servers(&self, n: usize, require_client_cert: bool) -> Vec<RedisServer> {
        init_tracing();
        let d = self.dir.path();
        let options = ServerOptions::new().tls(
            d.join("server.crt"),
            d.join("server.key"),
            d.join("ca.crt"),
            require_client_cert,
        );
        (0..n)
            .map(|_| RedisServer::start(&options).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    }
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
    let servers = pki.servers(3, false);
    let locks = Redlock::builder(tls_urls(&servers))
        .node_timeout(NODE_TIMEOUT)
        .tls_root_certificate(pki.ca.as_bytes())
        .build()
        .unwrap();
    assert!(
        locks
            .node_names()
            .iter()
            .all(|n| n.starts_with("rediss://"))
    );
    let lock = locks
        .try_acquire("job", TTL)
        .await
        .expect("acquire over TLS");
    let plain: Vec<String> = servers.iter().map(RedisServer::url).collect();
    spread(&lock, &plain).await;
    lock.release().await.expect("release over TLS");

    let untrusting = Redlock::builder(tls_urls(&servers))
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let err = untrusting.try_acquire("job", TTL).await.unwrap_err();
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
    let servers = pki.servers(3, true);
    let builder = || {
        Redlock::builder(tls_urls(&servers))
            .node_timeout(NODE_TIMEOUT)
            .tls_root_certificate(pki.ca.as_bytes())
    };
    let anonymous = builder().build().unwrap();
    let err = anonymous.try_acquire("job", TTL).await.unwrap_err();
    assert!(err.is_no_quorum(), "{err}");

    let locks = builder()
        .tls_client_certificate(pki.client_cert.as_bytes(), pki.client_key.as_bytes())
        .build()
        .unwrap();
    let lock = locks
        .try_acquire("job", TTL)
        .await
        .expect("acquire with a client certificate");
    lock.release().await.expect("release");
}
