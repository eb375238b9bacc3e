//! The node options that reach past plain `redis://`: `--tls-ca`, `--tls-cert`, `--tls-key`
//! (and their `REDLOCK_TLS_*` forms) against real TLS nodes, `--key-prefix` and `--compat`
//! (t120..).

use std::time::Duration;

use quorumlock::Redlock;
#[cfg(feature = "tls")]
use quorumlock::testkit::LocalCluster;

use crate::harness::*;
use crate::support::*;

/// A `redlock run` that holds KEY until `go` exists; returns the child and the `held` marker
/// path's directory.
fn holding(mut cmd: tokio::process::Command, dir: &tempfile::TempDir) -> tokio::process::Child {
    let held = file(dir, "held");
    let go = file(dir, "go");
    cmd = run_sh(
        cmd,
        &[],
        &format!(
            "echo \"$REDLOCK_TOKEN\" > {h}; {w}",
            h = path_str(&held),
            w = wait_for_file(&go)
        ),
    );
    cmd.spawn().expect("spawn redlock")
}

/// `--key-prefix P` (and `REDLOCK_KEY_PREFIX`): the lock written is `P:{KEY}`, nothing under
/// the default prefix; a prefix the library refuses is a usage error on one line.
#[tokio::test]
async fn t120_key_prefix_is_the_key_written() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let dir = scratch();
    let mut cmd = redlock(&cluster);
    cmd.arg("--key-prefix").arg("billing");
    let child = holding(cmd, &dir);
    let started = tokio::time::Instant::now();
    let token = line_in(&file(&dir, "held")).await;
    assert!(token.parse::<u64>().expect("a token") > 0, "{token}");
    let on = |key: &str| {
        urls.iter()
            .filter(|u| {
                redis::cmd("EXISTS")
                    .arg(key)
                    .query::<u32>(&mut conn(u))
                    .expect("EXISTS")
                    == 1
            })
            .count()
    };
    assert!(on(&format!("billing:{{{KEY}}}")) >= 2, "the prefixed key");
    assert_eq!(on(&lock_key(KEY)), 0, "nothing under the default prefix");
    std::fs::write(file(&dir, "go"), "").unwrap();
    let out = finish(child, started).await;
    assert_eq!(out.code(), 0, "{out:?}");

    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_KEY_PREFIX", "a:b");
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 64, "{out:?}");
    assert!(out.one_line_error().contains("key prefix"), "{out:?}");
}

/// `--compat` locks the plain KEY as other Redlock clients do: a library client in compat mode
/// on the same resource is refused while `redlock` holds it, and `redlock` exits 75 while the
/// library client holds it. `--compat` with a prefix, or for `elect`, is a usage error.
#[tokio::test]
async fn t121_compat_excludes_a_library_client_in_compat_mode() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let library = Redlock::builder(&urls)
        .node_timeout(NODE_TIMEOUT)
        .compat(true)
        .build()
        .unwrap();
    let dir = scratch();
    let mut cmd = redlock(&cluster);
    cmd.arg("--compat");
    let child = holding(cmd, &dir);
    let started = tokio::time::Instant::now();
    assert_eq!(line_in(&file(&dir, "held")).await, "0", "no fencing token");
    let plain = urls
        .iter()
        .filter(|u| {
            redis::cmd("EXISTS")
                .arg(KEY)
                .query::<u32>(&mut conn(u))
                .expect("EXISTS")
                == 1
        })
        .count();
    assert!(plain >= 2, "the plain key {KEY:?} on {plain} nodes");
    let err = library.try_acquire(KEY, Duration::from_secs(5)).await;
    assert!(
        matches!(&err, Err(e) if e.is_held()),
        "the library client must be refused: {err:?}"
    );
    std::fs::write(file(&dir, "go"), "").unwrap();
    let out = finish(child, started).await;
    assert_eq!(out.code(), 0, "{out:?}");

    let held = library
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .expect("free after redlock released");
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_COMPAT", "true");
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 75, "{out:?}");
    held.release().await.unwrap();

    let mut cmd = redlock(&cluster);
    cmd.args(["--compat", "--key-prefix", "p"]);
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 64, "{out:?}");
    assert!(out.one_line_error().contains("--compat"), "{out:?}");
    // REDLOCK_COMPAT=false is no compat mode: a prefix is fine then.
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_COMPAT", "false")
        .args(["--key-prefix", "p"]);
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let mut cmd = redlock(&cluster);
    cmd.args(["--compat", "elect", "e", "--", "true"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 64, "{out:?}");
    assert!(out.one_line_error().contains("--compat"), "{out:?}");
    let mut cmd = redlock(&cluster);
    cmd.args(["--compat", "run", "--once-per", "1h", KEY, "--", "true"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 64, "{out:?}");
    assert!(out.one_line_error().contains("fencing tokens"), "{out:?}");
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use crate::pki::Pki;

    /// Room for TLS handshakes on a busy machine (a debug build's handshake is slow).
    const TLS_NODE_TIMEOUT: &str = "2s";

    fn tls_nodes(pki: &Pki, require_client_cert: bool) -> (LocalCluster, String) {
        init_tracing();
        let cluster = LocalCluster::start_with(3, &pki.server_options(require_client_cert))
            .unwrap_or_else(|e| panic!("{e}"));
        let urls: Vec<String> = (0..3)
            .map(|i| cluster.get(i).unwrap().tls_url().unwrap())
            .collect();
        (cluster, urls.join(","))
    }

    fn over_tls(nodes: &str) -> tokio::process::Command {
        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off").args([
            "--nodes",
            nodes,
            "--node-timeout",
            TLS_NODE_TIMEOUT,
        ]);
        cmd
    }

    /// `redlock run --tls-ca FILE` against rediss:// nodes signed by a private CA: CMD runs
    /// under the lock (a token), the key is on the nodes (read over their plain port) and
    /// released after; without the CA every node fails its handshake: 69 naming the
    /// certificate.
    #[tokio::test]
    async fn t130_run_over_tls_with_a_private_ca() {
        let pki = Pki::new();
        let (cluster, nodes) = tls_nodes(&pki, false);
        let urls = cluster.urls();
        let dir = scratch();
        let mut cmd = over_tls(&nodes);
        cmd.arg("--tls-ca").arg(pki.path("ca.crt"));
        let child = holding(cmd, &dir);
        let started = tokio::time::Instant::now();
        let token = line_in(&file(&dir, "held")).await;
        assert!(token.parse::<u64>().expect("a token") > 0, "{token}");
        assert!(holders(&urls, KEY) >= 2, "the lock on the nodes");
        std::fs::write(file(&dir, "go"), "").unwrap();
        let out = finish(child, started).await;
        assert_eq!(out.code(), 0, "{out:?}");
        assert_eq!(holders(&urls, KEY), 0, "released over TLS");

        let out = output(run_sh(over_tls(&nodes), &[], "exit 0")).await;
        assert_eq!(out.code(), 69, "{out:?}");
        assert!(out.one_line_error().contains("certificate"), "{out:?}");
    }

    /// Mutual TLS (`tls-auth-clients yes`) with `REDLOCK_TLS_CA`, `REDLOCK_TLS_CERT` and
    /// `REDLOCK_TLS_KEY`; without the client certificate the nodes refuse (69).
    #[tokio::test]
    async fn t131_mutual_tls_from_the_environment() {
        let pki = Pki::new();
        let (_cluster, nodes) = tls_nodes(&pki, true);
        let mut cmd = over_tls(&nodes);
        cmd.env("REDLOCK_TLS_CA", pki.path("ca.crt"))
            .env("REDLOCK_TLS_CERT", pki.path("client.crt"))
            .env("REDLOCK_TLS_KEY", pki.path("client.key"));
        let out = output(run_sh(cmd, &[], r#"test "$REDLOCK_TOKEN" -gt 0"#)).await;
        assert_eq!(out.code(), 0, "{out:?}");

        let mut cmd = over_tls(&nodes);
        cmd.arg("--tls-ca").arg(pki.path("ca.crt"));
        let out = output(run_sh(cmd, &[], "exit 0")).await;
        assert_eq!(out.code(), 69, "{out:?}");
    }

    /// A file that cannot be read, or a certificate without its key: one line, exit 64, before
    /// any node is contacted.
    #[tokio::test]
    async fn t132_unreadable_tls_files_and_a_cert_without_key_are_usage_errors() {
        let pki = Pki::new();
        let dir = scratch();
        let missing = file(&dir, "missing.pem");
        let nodes = "rediss://127.0.0.1:1";
        let mut cmd = over_tls(nodes);
        cmd.arg("--tls-ca").arg(&missing);
        let out = output(run_sh(cmd, &[], "exit 0")).await;
        assert_eq!(out.code(), 64, "{out:?}");
        let line = out.one_line_error();
        assert!(
            line.contains("cannot read --tls-ca") && line.contains(path_str(&missing)),
            "{line}"
        );

        let mut cmd = over_tls(nodes);
        cmd.arg("--tls-cert").arg(pki.path("client.crt"));
        let out = output(run_sh(cmd, &[], "exit 0")).await;
        assert_eq!(out.code(), 64, "{out:?}");
        assert!(out.one_line_error().contains("--tls-key"), "{out:?}");

        let mut cmd = over_tls(nodes);
        cmd.arg("--tls-cert")
            .arg(pki.path("client.crt"))
            .arg("--tls-key")
            .arg(&missing);
        let out = output(run_sh(cmd, &[], "exit 0")).await;
        assert_eq!(out.code(), 64, "{out:?}");
        assert!(
            out.one_line_error().contains("cannot read --tls-key"),
            "{out:?}"
        );
    }
}
