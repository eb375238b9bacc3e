//! A node that cannot run the library's scripts is known before it votes: with `EVAL`,
//! `EVALSHA` and `SCRIPT` renamed away (`rename-command`) its connect fails naming the missing
//! command, so it counts toward no quorum (a plain `SET NX` acquisition would be granted there
//! and lost at the first extension). With only `EVALSHA` renamed the node takes its scripts as
//! `EVAL` with their body, as under an ACL that refuses `EVALSHA`.

use std::time::Duration;

use quorumlock::Redlock;
use quorumlock::testkit::{LocalCluster, ServerOptions};

use crate::support::{NODE_TIMEOUT, TTL, init_tracing};

fn renamed(commands: &[&str]) -> LocalCluster {
    let options = commands.iter().fold(ServerOptions::new(), |o, c| {
        o.config_line(&format!("rename-command {c} \"\""))
    });
    LocalCluster::start_with(3, &options).unwrap_or_else(|e| panic!("{e}"))
}

fn client(cluster: &LocalCluster, fencing: bool) -> Redlock {
    Redlock::builder(cluster.urls())
        .fencing(fencing)
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .expect("valid config")
}

/// No scripts at all: no acquisition, not even without fencing (a plain `SET NX`), and the
/// error names the missing command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_scripts_counts_as_failed_naming_the_command() {
    init_tracing();
    let cluster = renamed(&["EVAL", "EVALSHA", "SCRIPT"]);
    let locks = client(&cluster, false);
    match locks.try_acquire("scripts", TTL).await {
        Ok(lock) => panic!(
            "granted (token {}) on nodes that cannot run the extension's script",
            lock.token()
        ),
        Err(e) => {
            let text = e.to_string();
            assert!(e.is_no_quorum(), "{text}");
            assert!(
                text.contains("does not serve EVAL"),
                "the error names the command: {text}"
            );
        }
    }
}

/// `EVALSHA` renamed: the scripts go as `EVAL`, and the lock is extended and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_evalsha_the_scripts_go_as_eval() {
    init_tracing();
    let cluster = renamed(&["EVALSHA"]);
    let locks = client(&cluster, true);
    let lock = locks.try_acquire("scripts", TTL).await.expect("acquire");
    lock.extend(TTL)
        .await
        .expect("the extension's script goes as EVAL");
    lock.release().await.expect("release");
}
