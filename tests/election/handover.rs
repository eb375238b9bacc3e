//! Handovers: after a resign (notified, well under the ttl), after a crash (a killed child
//! process: about one ttl), by polling when no notification comes, and what an observer sees
//! after a crash.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;
use crate::{election, standby, standing_by, subscribed, won};
use futures::StreamExt;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Election, Observation, Redlock};
use tokio::time::Instant;

/// Resign hands over at once: the standby polls only every ~ttl and the term had ~ttl left, so
/// only the resign notification can explain a takeover within the wait (a third of the ttl).
/// The resign comes only once the standby provably waits (its attempt was refused and its
/// status read is done).
#[tokio::test]
async fn t30_resign_hands_over_well_under_the_ttl() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    // A ttl and poll interval three times the wait: only the resign notice can explain a
    // takeover within the wait.
    let ttl = 3 * WAIT;
    let a = election(&cluster, "e30", "a", ttl);
    let b = standby(client(&cluster), "e30", ttl, ttl);
    let leader = a.campaign().await.unwrap();
    let standby = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    subscribed(&urls, "e30", 2).await;
    standing_by(&b, 1).await;
    assert!(!standby.is_finished(), "b must still be a standby");

    let a_token = leader.token();
    leader.resign().await.unwrap();
    // A poll, or the end of the term, would come after the 30 s ttl: a takeover within the wait
    // was notified.
    let next = won(standby, WAIT).await;
    assert!(next.token() > a_token);
    assert_eq!(next.candidate(), "b");
    next.resign().await.unwrap();
}

const CHILD_ENV: &str = "QUORUMLOCK_TEST_ELECTION_CHILD";

/// Not a test by itself: the leader process of `t31` and `t51`, which start this test binary
/// with the election in the environment and kill it. Without the variable it returns at once.
#[tokio::test]
async fn zz_child_leader_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, ';');
    let (name, ttl_ms, urls) = (
        parts.next().expect("name"),
        parts.next().expect("ttl"),
        parts.next().expect("urls"),
    );
    let locks = Redlock::builder(urls.split(','))
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let e = Election::builder(locks, name)
        .ttl(Duration::from_millis(ttl_ms.parse().unwrap()))
        .candidate("child")
        .build()
        .unwrap();
    let leadership = e.campaign().await.unwrap();
    println!("LEADING {}", leadership.token());
    // Killed long before this ends.
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(leadership);
}

/// Kills its child process on drop, so a failed test leaves nothing behind.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a leader for election `name` in a child process; returns it once it leads, with its
/// token.
async fn child_leader(cluster: &LocalCluster, name: &str, ttl: Duration) -> (ChildGuard, u64) {
    let spec = format!("{name};{};{}", ttl.as_millis(), cluster.urls().join(","));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "handover::zz_child_leader_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the leader process");
    let stdout = child.stdout.take().unwrap();
    let child = ChildGuard(child);
    let token = tokio::time::timeout(
        WAIT * 3,
        tokio::task::spawn_blocking(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .find_map(|l| {
                    l.split_once("LEADING ")
                        .map(|(_, t)| t.trim().parse::<u64>().unwrap())
                })
        }),
    )
    .await
    .expect("the child leads")
    .unwrap()
    .expect("the child printed its token");
    (child, token)
}

/// When a quorum of nodes will no longer hold the key, judged from a status read: the
/// quorum-th shortest remaining ttl (an absent key counts as gone).
async fn expiry_after(locks: &Redlock, name: &str) -> Instant {
    let read = Instant::now();
    let status = locks.status(name).await.unwrap();
    let mut left: Vec<Duration> = status
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok())
        .map(|s| match s.value {
            Some(_) => s.ttl.unwrap_or(Duration::MAX),
            None => Duration::ZERO,
        })
        .collect();
    assert!(left.len() >= status.quorum, "a quorum answered");
    left.sort();
    read + left[status.quorum - 1]
}

/// A crashed leader (a child process killed with SIGKILL: no release, no notification) is
/// replaced once its lease expires: about one ttl, within ttl + one poll interval, and never
/// before a quorum of nodes let its key expire (the standby must not take over a live lease).
#[tokio::test]
async fn t31_crash_handover_takes_about_the_ttl() {
    let cluster = cluster(5);
    let ttl = Duration::from_secs(2);
    let (mut child, child_token) = child_leader(&cluster, "e31", ttl).await;

    let standby = election(&cluster, "e31", "parent", ttl);
    let campaign = tokio::spawn({
        let standby = standby.clone();
        async move { standby.campaign().await }
    });
    standing_by(&standby, 1).await;
    assert!(!campaign.is_finished(), "the child still leads");

    // Read just before the kill: the child cannot have shortened its lease since (only
    // extended it), so no standby can win before this.
    let earliest = expiry_after(&client(&cluster), "e31").await;
    child.0.kill().unwrap();
    let t0 = Instant::now();
    let next = won(campaign, ttl + WAIT).await;
    let won_at = Instant::now();
    let handover = won_at - t0;
    let poll = ttl / 4;
    assert!(
        won_at + Duration::from_millis(50) >= earliest,
        "took over {:?} before a quorum let the lease expire",
        earliest - won_at
    );
    // About one ttl; the slack of 3 s covers a loaded box's delays, and is still short of
    // the next ttl a standby that missed the expiry would wait.
    assert!(
        handover <= ttl + poll + Duration::from_secs(3),
        "crash handover took {handover:?} (ttl {ttl:?})"
    );
    assert!(next.token().get() > child_token);
    next.resign().await.unwrap();
}

/// When no notification arrives (the lock was released by a plain client that publishes
/// nothing), the standby still takes over within about one poll interval, long before the
/// ttl it last saw would have run out.
#[tokio::test]
async fn t32_standby_polls_when_no_notification_comes() {
    let cluster = cluster(5);
    // Three times the wait: a takeover within the wait was not the expiry of this lock.
    let ttl = 3 * WAIT;
    let silent = client(&cluster).acquire("e32", ttl).await.unwrap();
    let b = standby(client(&cluster), "e32", ttl, Duration::from_millis(300));
    let standby = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    standing_by(&b, 1).await;
    assert!(!standby.is_finished());

    silent.release().await.unwrap();
    // One 300 ms poll interval, where the ttl it last saw would make it 30 s: a takeover within
    // the wait was the poll.
    let next = won(standby, WAIT).await;
    next.resign().await.unwrap();
}

/// After the leader crashes (a child process killed: no resign, no notice) the observe stream
/// reports the vacancy once its lease expired on a quorum, and not before.
#[tokio::test]
async fn t51_observe_reports_vacant_after_a_crash() {
    let cluster = cluster(5);
    let ttl = Duration::from_secs(2);
    let (mut child, child_token) = child_leader(&cluster, "e51", ttl).await;
    let watcher = election(&cluster, "e51", "watcher", ttl);
    let mut changes = Box::pin(watcher.observe());
    let first = tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("an observation")
        .expect("the stream does not end");
    match first {
        Observation::Leader(l) => {
            assert_eq!(l.candidate.as_deref(), Some("child"));
            assert_eq!(l.token.get(), child_token);
        }
        other => panic!("{other:?}"),
    }

    let earliest = expiry_after(&client(&cluster), "e51").await;
    child.0.kill().unwrap();
    let t0 = Instant::now();
    let change = tokio::time::timeout(ttl + WAIT, changes.next())
        .await
        .expect("the vacancy is observed")
        .expect("the stream does not end");
    let seen_at = Instant::now();
    assert!(matches!(change, Observation::Vacant), "{change:?}");
    assert!(
        seen_at + Duration::from_millis(50) >= earliest,
        "vacant {:?} before a quorum let the lease expire",
        earliest - seen_at
    );
    let poll = ttl / 4;
    assert!(
        seen_at - t0 <= ttl + poll + Duration::from_secs(1),
        "vacancy seen {:?} after the crash (ttl {ttl:?})",
        seen_at - t0
    );
}
