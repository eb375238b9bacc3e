//! Item 10: a restarted node's fencing counters are restored even when the peers hold a large
//! keyspace. The repair reads each peer incrementally (the `SCAN` cursor survives a slow or
//! failed step), paced (one bounded page per peer per step, with a pause between steps), and
//! its raise pipeline survives a `SCRIPT FLUSH` on the restarted node (`NOSCRIPT`).

use std::time::Duration;

use crate::support::*;

/// Fencing counters on every node: `quorumlock:{k<i>}:fence = i + 1` for `i < KEYS`.
const KEYS: u64 = 200_000;
/// How long the repair may take here (it takes a few seconds; the old one never finished).
const REPAIR_WAIT: Duration = Duration::from_secs(40);

/// Creates the counters server-side, a Lua loop per batch (each batch blocks the node briefly).
fn fill_counters(url: &str) {
    let mut c = conn(url);
    let script = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do \
                  redis.call('SET', 'quorumlock:{k' .. i .. '}:fence', i + 1) end return 1";
    let batch = 20_000;
    for start in (0..KEYS).step_by(batch as usize) {
        let end = (start + batch).min(KEYS) - 1;
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(start)
            .arg(end)
            .query(&mut c)
            .expect("fill counters");
    }
}

/// How many of the counters are missing or below their value on one node.
fn counters_behind(url: &str) -> i64 {
    let script = "local n = 0 for i = 0, tonumber(ARGV[1]) - 1 do \
                  local v = tonumber(redis.call('GET', 'quorumlock:{k' .. i .. '}:fence') or '0') \
                  if v < i + 1 then n = n + 1 end end return n";
    redis::cmd("EVAL")
        .arg(script)
        .arg(0)
        .arg(KEYS)
        .query(&mut conn(url))
        .expect("check counters")
}

fn dbsize(url: &str) -> u64 {
    redis::cmd("DBSIZE").query(&mut conn(url)).expect("DBSIZE")
}

/// `cmdstat_<command>` calls on one node.
fn calls(url: &str, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn(url))
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A node restarted empty while its two peers hold 200k fencing counters each: with a connect
/// timeout of 50 ms (which bounds each step of a repair) the repair still completes, every
/// counter is restored, the node counts toward quorums again, the peers see a single paced pass
/// (not a full `SCAN` retried back to back), and a `SCRIPT FLUSH` on the restarted node before
/// the raise does not stop it. Before the fix the whole read of a peer had to fit in five
/// connect timeouts, and the node stayed `Repairing` for good.
#[tokio::test]
async fn repair_completes_on_a_large_keyspace_paced_and_after_script_flush() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    for u in &urls {
        fill_counters(u);
    }
    let locks = builder(&cluster)
        .max_ttl(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    warm(&locks).await;
    let scans_before = calls(&urls[1], "scan");

    cluster.restart_empty(0).unwrap();
    // The client reconnects to node 0 (loading its scripts), sees the restart and starts the
    // repair; the scripts are then flushed before anything is raised (the node is still empty:
    // reading the peers takes a while).
    wait_until(WAIT, "node 0 answers the client again", || async {
        locks
            .status("k0")
            .await
            .is_ok_and(|s| s.answered() == urls.len())
    })
    .await;
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut conn(&urls[0]))
        .expect("SCRIPT FLUSH");
    assert_eq!(
        dbsize(&urls[0]),
        0,
        "the repair raised counters before the script flush: the NOSCRIPT path is not exercised"
    );

    wait_until(REPAIR_WAIT, "node 0's counters restored", || async {
        let _ = locks.status("k0").await;
        dbsize(&urls[0]) >= KEYS
    })
    .await;
    assert_eq!(counters_behind(&urls[0]), 0, "every counter restored");

    // Node 0 counts again: with node 2 paused, a quorum needs it.
    cluster.pause(2).unwrap();
    wait_until(WAIT, "node 0 counts toward a quorum", || async {
        match locks.try_acquire("k7", Duration::from_secs(5)).await {
            Ok(lock) => {
                assert!(lock.token().get() > 8, "token {}", lock.token());
                lock.release().await.is_ok()
            }
            Err(_) => false,
        }
    })
    .await;
    cluster.resume(2).unwrap();

    // One paced pass over the peer: about KEYS / 1000 pages, not full scans back to back.
    let scans = calls(&urls[1], "scan") - scans_before;
    assert!(
        scans <= 3 * KEYS / 1000 + 100,
        "{scans} SCAN calls on a peer for {KEYS} keys"
    );
}
