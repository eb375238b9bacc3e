//! A private CA for TLS tests: a server certificate for 127.0.0.1 and a client certificate,
//! as PEM files in a temporary directory, and `redis-server` options that use them.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use quorumlock::testkit::ServerOptions;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub struct Pki {
    pub dir: tempfile::TempDir,
}

/// Certificate parameters with their own common name (rcgen's default name is the same for
/// every certificate, which makes OpenSSL take a leaf for a self-signed one).
fn params(name: &str, alt_names: &[&str]) -> CertificateParams {
    let alt_names = alt_names
        .iter()
        .map(|n| (*n).to_owned())
        .collect::<Vec<_>>();
    let mut params = CertificateParams::new(alt_names).expect("names");
    params.distinguished_name.push(DnType::CommonName, name);
    params
}

impl Pki {
    pub fn new() -> Pki {
        let mut ca_params = params("quorumlock test CA", &[]);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca =
            CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("CA");
        let server_key = KeyPair::generate().expect("key");
        let server = params("redis test server", &["127.0.0.1", "localhost"])
            .signed_by(&server_key, &ca)
            .expect("server certificate");
        let client_key = KeyPair::generate().expect("key");
        let client = params("quorumlock test client", &["client.test"])
            .signed_by(&client_key, &ca)
            .expect("client certificate");
        let dir = tempfile::tempdir().expect("temporary directory");
        let write = |name: &str, pem: String| {
            std::fs::write(dir.path().join(name), pem).expect("write a PEM file");
        };
        write("server.crt", server.pem());
        write("server.key", server_key.serialize_pem());
        write("ca.crt", ca.pem());
        write("client.crt", client.pem());
        write("client.key", client_key.serialize_pem());
        Pki { dir }
    }

    /// The path of one of the PEM files: `ca.crt`, `server.crt`, `server.key`, `client.crt`,
    /// `client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The text of one of the PEM files (see [`path`](Self::path)).
    pub fn pem(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).expect("read a PEM file")
    }

    /// Options for servers that also listen for TLS with the server certificate.
    pub fn server_options(&self, require_client_cert: bool) -> ServerOptions {
        ServerOptions::new().tls(
            self.path("server.crt"),
            self.path("server.key"),
            self.path("ca.crt"),
            require_client_cert,
        )
    }
}
