//! Item 12d: under `RestartGuard::Strict` a young node is held out until the largest ttl in use
//! *when the node is asked* has passed since its start, not the largest known when the client
//! connected: a client that connected first (a `status()`, a short ttl) and acquires with a
//! longer ttl later still holds the node out for that longer ttl.

use quorumlock::RestartGuard;

use crate::support::{LONG_TTL, WAIT, builder, cluster, conn, holders, wait_until};

const KEY: &str = "strict";

fn uptime(url: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut conn(url))
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("uptime")
}

/// A lock with a 30 s ttl stands on nodes 0 and 1; nodes 0 and 2 then restart empty. A strict
/// client that connects (a status read, max ttl still the 1 s floor) once they are a few
/// seconds old, and then acquires with the 30 s ttl, must hold both out: today it had judged
/// them old enough at connect and acquires beside the valid lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_hold_out_uses_the_max_ttl_in_use_when_checked() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let holder = builder(&cluster).build().unwrap();
    cluster.kill(2).unwrap();
    let lock = holder
        .try_acquire(KEY, LONG_TTL)
        .await
        .expect("holder acquires");
    assert_eq!(
        holders(&urls[..2], KEY),
        2,
        "the lock stands on nodes 0 and 1"
    );
    cluster.restart_empty(0).unwrap();
    cluster.restart_empty(2).unwrap();
    // Old enough for the 1 s floor (the age counts from uptime - 1 s), far from 30 s.
    wait_until(WAIT, "restarted nodes report an uptime of 3 s", || async {
        uptime(&urls[0]) >= 3 && uptime(&urls[2]) >= 3
    })
    .await;
    let strict = builder(&cluster)
        .restart_guard(RestartGuard::Strict)
        .build()
        .unwrap();
    let status = strict.status(KEY).await.unwrap();
    assert_eq!(status.answered(), 3, "connected to every node: {status:?}");
    let second = strict.try_acquire(KEY, LONG_TTL).await;
    if let Ok(second) = &second {
        panic!(
            "a second holder acquired {KEY:?} beside a valid lock (tokens {} and {})",
            lock.token(),
            second.token()
        );
    }
    let e = second.err().unwrap().to_string();
    let names = strict.node_names();
    for i in [0, 2] {
        assert!(
            e.contains(&format!("{}: held out", names[i])),
            "node {i} is held out: {e}"
        );
    }
    lock.release().await.unwrap();
}
