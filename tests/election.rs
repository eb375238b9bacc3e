//! Leader election against real servers: one leader at a time among many candidates, handover
//! after resign (notified) and after a crash (a killed child process: about one ttl), the poll
//! fallback when no notification comes, stepping down when a quorum of nodes dies, the quorum
//! read of who leads, the observe stream and the health check.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Election, Error, FencingToken, Health, Leadership, Observation, Redlock};
use support::*;
use tokio::time::Instant;

fn election(cluster: &LocalCluster, name: &str, id: &str, ttl: Duration) -> Election {
    Election::builder(client(cluster), name)
        .ttl(ttl)
        .candidate(id)
        .build()
        .expect("valid election")
}

/// How many connections subscribe to `channel` on one node.
fn subscribers(url: &str, channel: &str) -> i64 {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(&mut conn)
        .expect("NUMSUB");
    n
}

fn channel(name: &str) -> String {
    format!("quorumlock:{{{name}}}:events")
}

/// Waits until `n` candidates are subscribed on every node, then lets their first attempt and
/// status read finish: the standby's wait is internal, there is no event to await.
async fn standbys_settled(urls: &[String], name: &str, n: i64) {
    wait_until(WAIT, "every candidate subscribed on every node", || async {
        urls.iter().all(|u| subscribers(u, &channel(name)) >= n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Waits for a spawned campaign to win, for at most `within`.
async fn won(
    campaign: tokio::task::JoinHandle<Result<Leadership, Error>>,
    within: Duration,
) -> Leadership {
    tokio::time::timeout(within, campaign)
        .await
        .expect("the standby leads within the wait")
        .expect("campaign task")
        .expect("campaign")
}

/// A lone candidate leads at once; a quorum read names it with its token; resign empties the
/// election and removes the leader record.
#[tokio::test]
async fn t10_campaign_leads_and_leader_is_read_from_a_quorum() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let a = election(&cluster, "e10", "alpha", Duration::from_secs(5));
    assert_eq!(a.leader().await.unwrap(), None, "nobody leads yet");

    let leadership = tokio::time::timeout(WAIT, a.campaign())
        .await
        .expect("leads within the wait")
        .expect("campaign");
    assert!(leadership.token().get() >= 1);
    assert!(!leadership.is_lost());
    assert!(a.is_leading());

    let observer = election(&cluster, "e10", "observer", Duration::from_secs(5));
    let leader = observer.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.candidate.as_deref(), Some("alpha"));
    assert_eq!(leader.token, leadership.token());
    assert!(leader.expires_in > Duration::from_secs(3), "{leader:?}");

    leadership.resign().await.expect("resign");
    assert!(!a.is_leading());
    assert_eq!(observer.leader().await.unwrap(), None);
    let record = "quorumlock:{e10}:leader";
    wait_until(WAIT, "leader record deleted everywhere", || async {
        urls.iter().all(|u| value_of(u, record).is_none())
    })
    .await;
}

fn value_of(url: &str, key: &str) -> Option<String> {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    redis::cmd("GET").arg(key).query(&mut conn).expect("GET")
}

/// A bounded campaign against a live leader gives up with "held" after its wait, not before.
#[tokio::test]
async fn t11_bounded_campaign_gives_up_with_held() {
    let cluster = cluster(5);
    let a = election(&cluster, "e11", "a", Duration::from_secs(5));
    let b = election(&cluster, "e11", "b", Duration::from_secs(5));
    let leadership = a.campaign().await.unwrap();
    let start = Instant::now();
    let err = b
        .campaign_timeout(Duration::from_millis(700))
        .await
        .unwrap_err();
    assert!(err.is_held(), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(700));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    leadership.resign().await.unwrap();
}

#[derive(Debug)]
struct Term {
    candidate: usize,
    token: FencingToken,
    start: Instant,
    end: Instant,
}

/// Invariant: never two leaders at once. Five candidates (each its own client) campaign,
/// lead for a random moment, then resign or drop their guard, many times over; the recorded
/// leadership intervals never overlap and tokens strictly increase from term to term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_one_leader_among_five_candidates_at_any_time() {
    const TERMS: usize = 25;
    let cluster = cluster(5);
    let terms = Arc::new(Mutex::new(Vec::<Term>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let e = election(&cluster, "e20", &format!("c{i}"), Duration::from_secs(3));
        let (terms, done) = (Arc::clone(&terms), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let Ok(leadership) = e.campaign_timeout(Duration::from_secs(1)).await else {
                    continue;
                };
                let start = Instant::now();
                let hold = Duration::from_millis(rand::random_range(5..60));
                tokio::select! {
                    _ = leadership.lost() => panic!("c{i} lost its term: {:?}", leadership.lost_reason()),
                    _ = tokio::time::sleep(hold) => {}
                }
                let end = Instant::now();
                let token = leadership.token();
                {
                    let mut terms = terms.lock().unwrap();
                    terms.push(Term { candidate: i, token, start, end });
                    if terms.len() >= TERMS {
                        done.store(true, Ordering::SeqCst);
                    }
                }
                if (token.get() + i as u64).is_multiple_of(3) {
                    drop(leadership); // resigns in the background
                } else {
                    leadership.resign().await.expect("resign");
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(90), t)
            .await
            .expect("candidates finish")
            .expect("no candidate panicked");
    }
    let mut terms = std::mem::take(&mut *terms.lock().unwrap());
    terms.sort_by_key(|t| t.start);
    assert!(terms.len() >= TERMS);
    for pair in terms.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.end <= b.start,
            "overlapping leaders: c{} {:?} and c{} {:?}",
            a.candidate,
            a,
            b.candidate,
            b
        );
        assert!(a.token < b.token, "tokens must grow: {a:?} then {b:?}");
    }
    let leaders: std::collections::HashSet<_> = terms.iter().map(|t| t.candidate).collect();
    assert!(leaders.len() >= 2, "leadership moved around: {leaders:?}");
    let mut gaps: Vec<Duration> = terms.windows(2).map(|p| p[1].start - p[0].end).collect();
    gaps.sort();
    tracing::info!(median = ?gaps[gaps.len() / 2], max = ?gaps[gaps.len() - 1], "handover gaps");
}

/// Resign hands over at once: the standby polls only every ~ttl and the term had ~ttl left, so
/// only the resign notification can explain a takeover within a second.
#[tokio::test]
async fn t30_resign_hands_over_well_under_the_ttl() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let ttl = Duration::from_secs(10);
    let a = election(&cluster, "e30", "a", ttl);
    let b = Election::builder(client(&cluster), "e30")
        .ttl(ttl)
        .candidate("b")
        .poll_interval(ttl)
        .build()
        .unwrap();
    let leader = a.campaign().await.unwrap();
    let standby = tokio::spawn(async move { b.campaign().await });
    standbys_settled(&urls, "e30", 2).await;
    assert!(!standby.is_finished(), "b must still be a standby");

    let t0 = Instant::now();
    let a_token = leader.token();
    leader.resign().await.unwrap();
    let next = won(standby, WAIT).await;
    let handover = t0.elapsed();
    assert!(
        handover < Duration::from_secs(1),
        "resign handover took {handover:?} (ttl {ttl:?})"
    );
    assert!(next.token() > a_token);
    assert_eq!(next.candidate(), "b");
    next.resign().await.unwrap();
}

const CHILD_ENV: &str = "QUORUMLOCK_TEST_ELECTION_CHILD";

/// Not a test by itself: the leader process of `t31`, which starts this test binary with the
/// cluster in the environment and kills it. Without the variable it returns at once.
#[tokio::test]
async fn zz_child_leader_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (ttl_ms, urls) = spec.split_once(';').expect("ttl;urls");
    let locks = Redlock::builder(urls.split(','))
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let e = Election::builder(locks, "e31")
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

/// A crashed leader (a child process killed with SIGKILL: no release, no notification) is
/// replaced once its lease expires: about one ttl, within ttl + one poll interval, and never
/// before a good part of the ttl (the standby must not take over a live lease).
#[tokio::test]
async fn t31_crash_handover_takes_about_the_ttl() {
    let cluster = cluster(5);
    let ttl = Duration::from_secs(2);
    let spec = format!("{};{}", ttl.as_millis(), cluster.urls().join(","));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "zz_child_leader_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the leader process");
    let stdout = child.stdout.take().unwrap();
    let mut child = ChildGuard(child);
    let child_token = tokio::time::timeout(
        WAIT,
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

    let standby = election(&cluster, "e31", "parent", ttl);
    let campaign = tokio::spawn(async move { standby.campaign().await });
    tokio::time::sleep(Duration::from_millis(300)).await; // a standby by now (no event to await)
    assert!(!campaign.is_finished(), "the child still leads");

    child.0.kill().unwrap();
    let t0 = Instant::now();
    let next = won(campaign, ttl + WAIT).await;
    let handover = t0.elapsed();
    let poll = ttl / 4;
    assert!(
        handover >= ttl / 2,
        "took over a live lease after {handover:?} (ttl {ttl:?})"
    );
    assert!(
        handover <= ttl + poll + Duration::from_millis(750),
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
    let ttl = Duration::from_secs(10);
    let silent = client(&cluster).acquire("e32", ttl).await.unwrap();
    let b = Election::builder(client(&cluster), "e32")
        .ttl(ttl)
        .candidate("b")
        .poll_interval(Duration::from_millis(300))
        .build()
        .unwrap();
    let standby = tokio::spawn(async move { b.campaign().await });
    standbys_settled(&cluster.urls(), "e32", 1).await;
    assert!(!standby.is_finished());

    let t0 = Instant::now();
    silent.release().await.unwrap();
    let next = won(standby, WAIT).await;
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "poll fallback took {:?}",
        t0.elapsed()
    );
    next.resign().await.unwrap();
}

/// Two of five nodes down: the leader keeps leading past several ttls. Three down: its lost
/// signal fires, nobody leads while they are down (a standby keeps failing, a quorum read
/// errs), and once they are back a standby leads again.
#[tokio::test]
async fn t40_survives_two_nodes_down_steps_down_with_three() {
    let mut cluster = cluster(5);
    let ttl = Duration::from_secs(1);
    let a = election(&cluster, "e40", "a", ttl);
    let b = election(&cluster, "e40", "b", ttl);
    let leadership = a.campaign().await.unwrap();
    let standby = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });

    tracing::info!("--- two nodes down: still leading");
    cluster.kill(3).unwrap();
    cluster.kill(4).unwrap();
    let lost = tokio::time::timeout(ttl * 3, leadership.lost()).await;
    assert!(
        lost.is_err(),
        "lost with a quorum alive: {:?}",
        leadership.lost_reason()
    );
    assert!(!standby.is_finished());
    assert_eq!(
        b.leader()
            .await
            .unwrap()
            .and_then(|l| l.candidate)
            .as_deref(),
        Some("a")
    );

    tracing::info!("--- a third node down: the leader steps down");
    cluster.kill(2).unwrap();
    let t0 = Instant::now();
    tokio::time::timeout(ttl + WAIT, leadership.lost())
        .await
        .expect("the lost signal fires");
    assert!(
        t0.elapsed() <= ttl + Duration::from_millis(500),
        "stepped down after {:?}",
        t0.elapsed()
    );
    assert!(!a.is_leading());
    assert!(matches!(a.health().await, Health::Unknown { .. }));
    let err = b.leader().await.unwrap_err();
    assert!(err.is_no_quorum(), "{err}");
    drop(leadership);

    tracing::info!("--- nobody leads while a quorum is down");
    tokio::time::sleep(ttl * 2).await;
    assert!(!standby.is_finished(), "nobody may lead without a quorum");

    tracing::info!("--- nodes back: a standby leads again");
    for i in [2, 3, 4] {
        cluster.restart(i).unwrap();
    }
    let next = won(standby, WAIT).await;
    assert_eq!(next.candidate(), "b");
    next.resign().await.unwrap();
}

/// The observe stream reports the state at subscription, each new term with its leader and
/// token, and a vacancy.
#[tokio::test]
async fn t50_observe_streams_leadership_changes() {
    let cluster = cluster(5);
    let ttl = Duration::from_secs(5);
    let watcher = election(&cluster, "e50", "watcher", ttl);
    let a = election(&cluster, "e50", "a", ttl);
    let b = election(&cluster, "e50", "b", ttl);
    let mut changes = Box::pin(watcher.observe());
    let mut next = async || {
        tokio::time::timeout(WAIT, changes.next())
            .await
            .expect("an observation within the wait")
            .expect("the stream does not end")
    };
    assert!(matches!(next().await, Observation::Vacant));

    let la = a.campaign().await.unwrap();
    let seen_a = loop {
        match next().await {
            Observation::Leader(l) if l.candidate.is_some() => break l,
            Observation::Leader(_) => {} // id not published yet
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(seen_a.candidate.as_deref(), Some("a"));
    assert_eq!(seen_a.token, la.token());

    let standby = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    la.resign().await.unwrap();
    let seen_b = loop {
        match next().await {
            Observation::Leader(l) if l.candidate.as_deref() == Some("b") => break l,
            Observation::Leader(_) | Observation::Vacant => {}
            other => panic!("{other:?}"),
        }
    };
    let lb = standby.await.unwrap().unwrap();
    assert_eq!(seen_b.token, lb.token());
    assert!(seen_b.token > seen_a.token);

    lb.resign().await.unwrap();
    assert!(matches!(next().await, Observation::Vacant));
}

/// The health check tells leader, standby and unknown apart.
#[tokio::test]
async fn t60_health_reports_leader_standby_unknown() {
    let mut cluster = cluster(5);
    let ttl = Duration::from_secs(1);
    let a = election(&cluster, "e60", "a", ttl);
    let b = election(&cluster, "e60", "b", ttl);
    assert!(matches!(b.health().await, Health::Standby { leader: None }));

    let leadership: Leadership = a.campaign().await.unwrap();
    let health = a.health().await;
    assert!(health.is_leader());
    assert_eq!(health.as_str(), "leader");
    match b.health().await {
        Health::Standby { leader: Some(l) } => {
            assert_eq!(l.candidate.as_deref(), Some("a"));
            assert_eq!(l.token, leadership.token());
        }
        other => panic!("{other:?}"),
    }

    for i in 0..3 {
        cluster.kill(i).unwrap();
    }
    match b.health().await {
        Health::Unknown {
            error: Error::NoQuorum { failures, .. },
        } => assert_eq!(failures.len(), 3),
        other => panic!("{other:?}"),
    }
    tokio::time::timeout(ttl + WAIT, leadership.lost())
        .await
        .expect("lost");
    assert_eq!(a.health().await.as_str(), "unknown");
}
