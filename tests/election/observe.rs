//! Reading who leads: the observe stream, an observer without a candidate id, the health check,
//! and reads bounded by the node timeout.

use std::time::Duration;

use crate::support::*;
use crate::{election, standing_by};
use futures::StreamExt;
use quorumlock::{Election, Error, Health, Leadership, Observation};
use tokio::time::Instant;

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
    standing_by(&b, 1).await;
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

/// An observer needs no candidate id (issue 14): built from the election's builder, it reads
/// who leads and streams the changes, and never campaigns.
#[tokio::test]
async fn t52_an_observer_reads_and_streams_without_a_candidate_id() {
    let cluster = cluster(5);
    let ttl = Duration::from_secs(5);
    let observer = Election::builder(client(&cluster), "e52")
        .ttl(ttl)
        .observer()
        .expect("valid observer");
    assert_eq!(observer.name(), "e52");
    assert_eq!(observer.leader().await.unwrap(), None);
    let mut changes = Box::pin(observer.observe());
    let mut next = async || {
        tokio::time::timeout(WAIT, changes.next())
            .await
            .expect("an observation within the wait")
            .expect("the stream does not end")
    };
    assert!(matches!(next().await, Observation::Vacant));

    let a = election(&cluster, "e52", "a", ttl);
    let term = a.campaign().await.unwrap();
    let seen = loop {
        match next().await {
            Observation::Leader(l) if l.candidate.is_some() => break l,
            Observation::Leader(_) => {} // id not published yet
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(seen.candidate.as_deref(), Some("a"));
    assert_eq!(seen.token, term.token());
    let read = observer.leader().await.unwrap().expect("a leader");
    assert_eq!(read.candidate.as_deref(), Some("a"));
    // A candidate's own observer shares its subscriptions and reads the same.
    assert_eq!(
        a.observer().leader().await.unwrap().map(|l| l.token),
        Some(term.token())
    );
    term.resign().await.unwrap();
    assert!(matches!(next().await, Observation::Vacant));
}

/// The health check tells leader, standby and unknown apart.
#[tokio::test]
async fn t60_health_reports_leader_standby_unknown() {
    let mut cluster = cluster(5);
    let ttl = Duration::from_secs(2);
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

/// Quorum reads are bounded by the node timeout even when nodes accept connections but never
/// answer (paused): the record reads to them (on the lock's own connections since issue 14) are
/// given up at the node timeout, not the (here 10 s) connect timeout. The bound, node timeout
/// + 2.5 s, sits well between the two: a loaded box delays a round by hundreds of ms at most.
#[tokio::test]
async fn t80_reads_are_bounded_by_the_node_timeout() {
    let mut cluster = cluster(5);
    let ttl = Duration::from_secs(5);
    // A is connected to every node before it campaigns, so its term stands on all five (a call
    // still connecting when the round wins is given up, and the lock would stand on three
    // until the next extension spreads it: `leader()` could then find no quorum for it).
    let a_locks = client(&cluster);
    warm(&a_locks).await;
    let a = Election::builder(a_locks, "e80")
        .ttl(ttl)
        .candidate("a")
        .build()
        .unwrap();
    let leadership = a.campaign().await.unwrap();
    cluster.pause(3).unwrap();
    cluster.pause(4).unwrap();
    let locks = builder(&cluster)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let b = Election::builder(locks, "e80")
        .candidate("b")
        .ttl(ttl)
        .build()
        .unwrap();
    for round in 0..3 {
        let start = Instant::now();
        let leader = b.leader().await.expect("three nodes answer");
        let took = start.elapsed();
        assert_eq!(
            leader.and_then(|l| l.candidate).as_deref(),
            Some("a"),
            "round {round}"
        );
        assert!(
            took < NODE_TIMEOUT + Duration::from_millis(2500),
            "round {round}: leader() took {took:?}"
        );
        let start = Instant::now();
        assert!(matches!(
            b.health().await,
            Health::Standby { leader: Some(_) }
        ));
        assert!(
            start.elapsed() < NODE_TIMEOUT + Duration::from_millis(2500),
            "round {round}: health() took {:?}",
            start.elapsed()
        );
    }
    cluster.resume(3).unwrap();
    cluster.resume(4).unwrap();
    leadership.resign().await.unwrap();
}
