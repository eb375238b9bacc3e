//! Campaigns: a lone candidate leads and is read from a quorum, a bounded campaign gives up,
//! one leader at a time among five candidates, a split vote retried after a short pause, and
//! stepping down when a quorum of nodes dies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use crate::{
    election, probe_notice, query, record_gone_everywhere, standby, standing_by, subscribed,
    value_of, won,
};
use quorumlock::{Election, FencingToken, Health};
use tokio::time::Instant;

/// A lone candidate leads at once; a quorum read names it with its token; the leader record is
/// built from the term's own lock value; resign empties the election and removes the record.
#[tokio::test]
async fn t10_campaign_leads_and_leader_is_read_from_a_quorum() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let a = election(&cluster, "e10", "alpha", Duration::from_secs(5));
    assert_eq!(a.leader().await.unwrap(), None, "nobody leads yet");

    let leadership = lead(&a).await;
    assert!(leadership.token().get() >= 1);
    assert!(!leadership.is_lost());
    assert!(a.is_leading());

    let observer = election(&cluster, "e10", "observer", Duration::from_secs(5));
    let leader = observer.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.candidate.as_deref(), Some("alpha"));
    assert_eq!(leader.token, leadership.token());
    assert!(leader.expires_in > Duration::from_secs(3), "{leader:?}");

    // The record is "<our lock value> <token> <id>" wherever it was written (a quorum at least).
    let record = "quorumlock:{e10}:leader";
    let mut written = 0;
    for u in &urls {
        if let Some(r) = value_of(u, record).await {
            let value = value_of(u, &lock_key("e10")).await.expect("our lock value");
            assert_eq!(r, format!("{value} {} alpha", leadership.token()));
            written += 1;
        }
    }
    assert!(written >= 3, "record on {written} nodes");

    leadership.resign().await.expect("resign");
    assert!(!a.is_leading());
    assert_eq!(observer.leader().await.unwrap(), None);
    record_gone_everywhere(&urls, "e10").await;
}

/// A bounded campaign against a live leader gives up with "held" after its wait, not before,
/// and not much after: the wait is a hard bound even while a status read is slow (two paused
/// nodes make every read wait the 5 s node timeout; the campaign still ends at 200 ms).
#[tokio::test]
async fn t11_bounded_campaign_gives_up_with_held() {
    let mut cluster = cluster(5);
    // A is connected to every node before it campaigns, so its lock stands on all five (a call
    // still connecting when the round wins is given up): the live nodes below refuse at once.
    let a_locks = client(&cluster);
    warm(&a_locks).await;
    let a = Election::builder(a_locks, "e11")
        .ttl(Duration::from_secs(5))
        .candidate("a")
        .build()
        .unwrap();
    let b = election(&cluster, "e11", "b", Duration::from_secs(5));
    let leadership = a.campaign().await.unwrap();
    let wait = Duration::from_millis(700);
    let start = Instant::now();
    let err = b.campaign_timeout(wait).await.unwrap_err();
    assert!(err.is_held(), "{err}");
    assert!(start.elapsed() >= wait);
    // Not much after: a campaign that overran its wait would wake next at its 5 s ttl. The
    // bound sits well between (a loaded box can delay a timer and a round by hundreds of ms).
    assert!(
        start.elapsed() < wait + Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );

    let slow_locks = builder(&cluster)
        .node_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    warm(&slow_locks).await;
    let slow = Election::builder(slow_locks, "e11")
        .candidate("slow")
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    cluster.pause(3).unwrap();
    cluster.pause(4).unwrap();
    let wait = Duration::from_millis(200);
    let start = Instant::now();
    // The attempt is refused by the three live nodes at once; the status read that follows
    // would wait 5 s for the paused two.
    let err = slow.campaign_timeout(wait).await.unwrap_err();
    let took = start.elapsed();
    cluster.resume(3).unwrap();
    cluster.resume(4).unwrap();
    assert!(err.is_held(), "{err}");
    // A campaign that waited for the status read would take the 5 s node timeout; the bound
    // sits well between that and the 200 ms asked (a loaded box delays timers and rounds).
    assert!(
        took < Duration::from_millis(2500),
        "a 200 ms campaign took {took:?}"
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
///
/// Every term ends with a resign (explicit or by drop), so every handover is notified: the
/// gaps between terms stay far below the poll interval, even though several standbys retry at
/// once after each notice and may split the nodes between them (a split must lead to a short
/// retry, not to a poll-interval wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_one_leader_among_five_candidates_at_any_time() {
    const TERMS: usize = 60;
    let cluster = cluster(5);
    let urls = cluster.urls();
    let ttl = Duration::from_secs(3);
    let terms = Arc::new(Mutex::new(Vec::<Term>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let e = election(&cluster, "e20", &format!("c{i}"), ttl);
        let (terms, done) = (Arc::clone(&terms), Arc::clone(&done));
        tasks.push(tokio::spawn(serve_terms(e, i, terms, done, TERMS)));
    }
    // Handovers count from the moment every candidate is subscribed on every node (before,
    // a standby may miss a notice and rightly wait for its poll).
    subscribed(&urls, "e20", 5).await;
    let subscribed_at = Instant::now();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(90), t)
            .await
            .expect("candidates finish")
            .expect("no candidate panicked");
    }
    let mut terms = std::mem::take(&mut *terms.lock().unwrap());
    terms.sort_by_key(|t| t.start);
    assert!(terms.len() >= TERMS);
    assert_terms_never_overlap(&terms);
    assert_handovers_were_notified(&terms, subscribed_at, ttl, TERMS);
}

/// Candidate `c{i}`: campaigns, leads for a random moment, records its term, then resigns
/// (or drops its guard), until `terms` holds `goal` terms.
async fn serve_terms(
    e: Election,
    i: usize,
    terms: Arc<Mutex<Vec<Term>>>,
    done: Arc<AtomicBool>,
    goal: usize,
) {
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
            terms.push(Term {
                candidate: i,
                token,
                start,
                end,
            });
            if terms.len() >= goal {
                done.store(true, Ordering::SeqCst);
            }
        }
        if (token.get() + i as u64).is_multiple_of(3) {
            drop(leadership); // resigns in the background
        } else {
            leadership.resign().await.expect("resign");
        }
    }
}

/// The terms, sorted by start, never overlap, their tokens strictly grow, and more than one
/// candidate led.
fn assert_terms_never_overlap(terms: &[Term]) {
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
}

/// Every handover after `subscribed_at` (at least `goal / 2` of them) followed a resign
/// notice: the gaps stay far below the shortest poll wait of a `ttl` election.
fn assert_handovers_were_notified(
    terms: &[Term],
    subscribed_at: Instant,
    ttl: Duration,
    goal: usize,
) {
    let mut gaps: Vec<Duration> = terms
        .windows(2)
        .filter(|p| p[0].end >= subscribed_at)
        .map(|p| p[1].start - p[0].end)
        .collect();
    gaps.sort();
    assert!(gaps.len() >= goal / 2, "{} handovers measured", gaps.len());
    let p90 = gaps[gaps.len() * 9 / 10];
    let max = gaps[gaps.len() - 1];
    let poll_min = ttl / 4 * 3 / 4; // the shortest poll wait: ttl / 4 - 25 %
    tracing::info!(n = gaps.len(), median = ?gaps[gaps.len() / 2], ?p90, ?max, ?poll_min, "handover gaps");
    println!(
        "handover gaps (ttl {ttl:?}): n={} median {:?} p90 {p90:?} max {max:?}",
        gaps.len(),
        gaps[gaps.len() / 2]
    );
    assert!(
        p90 < poll_min / 3,
        "resign handovers too slow: p90 {p90:?}, max {max:?}; poll {poll_min:?} (gaps {gaps:?})"
    );
    assert!(
        max < poll_min,
        "a resign handover waited for a poll: max {max:?} (gaps {gaps:?})"
    );
}

/// A split vote is no leader: when the standby's attempt after a resign notice is refused
/// but no value stands on a quorum (competitors that retried at the same moment took some
/// nodes each), it retries after the short contention pause, not after its poll interval.
/// Here the split is staged by hand: the competitors' keys appear on three nodes right before
/// the notice, and go (as their failed attempts are undone) once the standby stands by again.
#[tokio::test]
async fn t21_split_vote_retries_after_a_short_pause() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    // Three times the wait: neither a poll nor an expiry comes within the wait.
    let ttl = 3 * WAIT;
    // A plain lock: no notices; its keys stand for the ended term's.
    client(&cluster).acquire("e21", ttl).await.unwrap().forget();
    let b = standby(client(&cluster), "e21", ttl, ttl);
    let standby = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    subscribed(&urls, "e21", 1).await;
    standing_by(&b, 1).await;

    // The term ends; two competitors split three nodes between them.
    let key = lock_key("e21");
    for (i, u) in urls.iter().enumerate() {
        let cmd = match i {
            0 | 1 => redis::cmd("SET")
                .arg(&key)
                .arg("x")
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .clone(),
            2 => redis::cmd("SET")
                .arg(&key)
                .arg("y")
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .clone(),
            _ => redis::cmd("DEL").arg(&key).clone(),
        };
        let _: redis::Value = query(u, &cmd).await;
    }
    let stood = b.standing_by_count();
    probe_notice(&urls[0], "e21", 1).await;
    // Refused (two of five), status read: no holder; the standby waits again.
    standing_by(&b, stood + 1).await;
    assert!(!standby.is_finished());
    for u in &urls[..3] {
        let _: i64 = query(u, redis::cmd("DEL").arg(&key)).await;
    }
    // The poll would come after 30 s; the contention pause is milliseconds: a takeover within
    // the wait was the retry after the split vote.
    let next = won(standby, WAIT).await;
    next.resign().await.unwrap();
}

/// Two of five nodes down: the leader keeps leading past two ttls. Three down: its lost signal
/// fires within a ttl, nobody leads while they are down (a standby keeps failing, a quorum read
/// errs), and once they are back a standby leads again.
#[tokio::test]
async fn t40_survives_two_nodes_down_steps_down_with_three() {
    let mut cluster = cluster(5);
    let ttl = Duration::from_secs(3);
    let a = election(&cluster, "e40", "a", ttl);
    let b = election(&cluster, "e40", "b", ttl);
    let leadership = a.campaign().await.unwrap();
    // A campaign returns once a quorum holds the term; the other nodes get the key from the
    // next extension. "Survives two nodes down" needs it on the three that stay up: wait for
    // every node, so the kills below cannot leave a surviving node free for the standby.
    let urls = cluster.urls();
    wait_until(WAIT, "the leader's term on every node", || async {
        holders(&urls, "e40") == urls.len()
    })
    .await;
    let standby = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });

    tracing::info!("--- two nodes down: still leading");
    cluster.kill(3).unwrap();
    cluster.kill(4).unwrap();
    let lost = tokio::time::timeout(ttl * 2, leadership.lost()).await;
    assert!(
        lost.is_err(),
        "lost with a quorum alive: {:?}",
        leadership.lost_reason()
    );
    assert!(a.is_leading());
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
    // At the deadline the lease's validity gives (a timer): the slack covers a loaded box.
    assert!(
        t0.elapsed() <= ttl + Duration::from_secs(3),
        "stepped down after {:?} (ttl {ttl:?})",
        t0.elapsed()
    );
    assert!(!a.is_leading());
    assert!(matches!(a.health().await, Health::Unknown { .. }));
    let err = b.leader().await.unwrap_err();
    assert!(err.is_no_quorum(), "{err}");
    drop(leadership);

    tracing::info!("--- nobody leads while a quorum is down");
    let held_off = tokio::time::timeout(ttl, async {
        loop {
            if standby.is_finished() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(held_off.is_err(), "nobody may lead without a quorum");

    tracing::info!("--- nodes back: a standby leads again");
    for i in [2, 3, 4] {
        cluster.restart(i).unwrap();
    }
    // Restarted nodes count again once the largest ttl has passed (the restart guard).
    let next = won(standby, ttl + WAIT).await;
    assert_eq!(next.candidate(), "b");
    next.resign().await.unwrap();
}

/// A campaign and a resign with one node hung: the leader record, the "elected" notice and the
/// resignation go to every node, but neither call waits for the hung node once a quorum has
/// answered (its call goes on in the background). The candidate is connected to every node
/// when node 4 hangs, and its node timeout, 30 s, is three times the test's bound: a call that
/// waited for node 4 would hold the campaign (or the resign) up for 30 s. Before the fix:
/// `a campaign with a node hung took the node timeout: Elapsed(())`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t81_a_hung_node_holds_up_neither_campaign_nor_resign() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = builder(&cluster).node_timeout(WAIT * 3).build().unwrap();
    warm(&locks).await;
    let e = Election::builder(locks, "e81")
        .ttl(TTL)
        .candidate("a")
        .build()
        .unwrap();
    cluster.pause(4).unwrap();
    let leadership = tokio::time::timeout(WAIT, e.campaign())
        .await
        .expect("a campaign with a node hung took the node timeout")
        .unwrap();
    let mut written = 0;
    for u in &urls[..4] {
        if value_of(u, "quorumlock:{e81}:leader").await.is_some() {
            written += 1;
        }
    }
    assert!(written >= 3, "record on {written} healthy nodes");
    tokio::time::timeout(WAIT, leadership.resign())
        .await
        .expect("a resign with a node hung took the node timeout")
        .unwrap();
    cluster.resume(4).unwrap();
    // The hung node's calls went on in the background, in order on its connection: once it
    // answers, a record written there is deleted by the resignation that followed it.
    record_gone_everywhere(&urls, "e81").await;
}
