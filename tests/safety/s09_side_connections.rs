//! Item 9: every connection the crate opens to a node (the lock's own, which also carries the
//! election's records and the scheduler's markers since issue 14, and the election's pub/sub
//! subscriptions) is made by one path with the client's TLS and TCP settings. Here the TCP
//! part: each of them has keepalive armed, so a silently dead peer breaks it (TLS is pinned in
//! `tests/deployments/tls.rs`, t12 and t13).

use std::collections::HashSet;
use std::time::Duration;

use quorumlock::{Election, Outcome, RunOnce};

use crate::support::*;

/// The client side of every established TCP connection from this host to one of `ports`:
/// `(remote port, timer kind)` from `/proc/net/tcp{,6}` (timer 2: keepalive armed).
fn client_sockets(ports: &HashSet<u16>) -> Vec<(u16, u8)> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(timer)) =
                (fields.get(2), fields.get(3), fields.get(5))
            else {
                continue;
            };
            let port = remote
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            let kind = timer
                .split_once(':')
                .and_then(|(t, _)| u8::from_str_radix(t, 16).ok());
            if let (Some(port), Some(kind)) = (port, kind)
                && *state == "01"
                && ports.contains(&port)
            {
                found.push((port, kind));
            }
        }
    }
    found
}

/// The side connections of an election and a run-once job (commands and pub/sub) carry the
/// lock client's TCP keepalive, like its own node connections. Before the fix they were opened
/// from the bare URL: no keepalive, no user timeout.
#[tokio::test]
async fn side_connections_carry_the_clients_tcp_keepalive() {
    if std::fs::metadata("/proc/net/tcp").is_err() {
        eprintln!("no /proc/net/tcp on this platform: nothing to check");
        return;
    }
    let cluster = cluster(3);
    let ports: HashSet<u16> = (0..3).map(|i| cluster.get(i).unwrap().port()).collect();
    let locks = client(&cluster);
    let job = RunOnce::builder(locks.clone(), "s09-job")
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let outcome = job.run(1, |ctx| async move { ctx.token() }).await.unwrap();
    assert!(matches!(outcome, Outcome::Ran { .. }), "{outcome:?}");
    let election = Election::builder(locks, "s09-e")
        .ttl(Duration::from_secs(5))
        .candidate("a")
        .build()
        .unwrap();
    let leadership = lead(&election).await;
    // The lock's 3 connections (which the job's markers and the election's records share:
    // there are no side connections since issue 14) and the election's 3 subscriptions; each
    // with its keepalive timer armed once idle (a connection with data in flight shows its
    // retransmit timer for a moment).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let sockets = client_sockets(&ports);
        if sockets.len() == 6 && sockets.iter().all(|&(_, kind)| kind == 2) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "every connection to the nodes has TCP keepalive armed: (port, timer) {sockets:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    leadership.resign().await.unwrap();
}
