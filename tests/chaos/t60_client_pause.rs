//! A client process frozen (SIGSTOP) while it holds the lock, past its ttl: the GC-pause
//! post-mortem, replayed with a real process and a real heartbeat.

use std::time::Duration;

use quorumlock::testkit::{RedisServer, ServerOptions};

use crate::checker::check;
use crate::child::{ChildClient, ChildSpec, Event};
use crate::history::{Fault, History, Mono, Recorder, SessionId, Write};
use crate::resource::{DATA_KEY, Resource};
use crate::support::cluster;
use crate::workload::{ClientSpec, Held};

/// The child acquires (ttl 2 s, keep-alive on), checks its validity, and is frozen during the
/// 1.2 s of "work" before its write, until its lock has expired and the test's client has taken
/// the lock and written. Then the child wakes and writes, believing it still holds the lock.
///
/// Expected: no overlap of critical sections (the new holder acquires only after the child's
/// validity ended: the lock did its job), the child's write is reported past its validity, and
/// fencing rejects it: the resource keeps the new holder's value. The heartbeat did not help:
/// it was frozen too. But the lock's "lost" signal did its part: the child reports it fired
/// after the freeze and no later than its stale write returned (the moment the child could
/// have checked), so a client that watched it would have known. Liveness: the new holder
/// acquires within ttl + 2 s of the freeze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_wakes_up_and_its_stale_write_is_rejected() {
    let nodes = cluster(3);
    let urls = nodes.urls();
    let store = tokio::task::spawn_blocking(|| RedisServer::start(&ServerOptions::new()))
        .await
        .unwrap()
        .expect("resource redis");
    let rec = Recorder::new();
    let resource = Resource::redis(&store.url()).await;
    let ttl = Duration::from_secs(2);

    let mut child = spawn_one_write_child(&urls, ttl, &store.url(), &rec);
    let (child_session, child_token) = match child
        .wait_for(Duration::from_secs(20), "its acquisition", |e| {
            matches!(e, Event::Acquired { .. })
        })
        .await
    {
        Event::Acquired { session, token, .. } => (session, token),
        _ => unreachable!(),
    };
    child
        .wait_for(Duration::from_secs(5), "its validity check", |e| {
            matches!(e, Event::Checked { .. })
        })
        .await;
    tracing::info!("--- the child checked its validity; freeze it before it writes");
    child.pause();
    let frozen = Mono::now();

    let locks = ClientSpec::new(0, urls, ttl, 0).locks();
    let b = Held::acquire(&locks, 0, ttl, Duration::from_secs(5), &rec)
        .await
        .expect("the frozen child's keys expire");
    let took_over = b.acquired.since(frozen);
    assert!(b.token > child_token, "{} > {child_token}", b.token);
    assert!(b.write(&resource, &rec).await);
    let b_session = b.session;
    b.release(&rec).await.unwrap();
    child.resume();
    rec.fault(Fault {
        what: "SIGSTOP the child client".into(),
        start: frozen,
        healed: Mono::now(),
        ..Fault::default()
    });
    child.stop(Duration::from_secs(10)).await;

    let h = rec.snapshot();
    let r = check(&h, Duration::from_secs(5));
    let child_writes: Vec<_> = h.writes.iter().filter(|w| w.token == child_token).collect();
    assert_eq!(child_writes.len(), 1, "{h:?}");
    assert!(
        !child_writes[0].accepted,
        "the stale write was rejected: {h:?}"
    );
    assert!(r.overlaps.is_empty(), "{r:?}");
    assert_eq!(r.past_validity.len(), 1, "{r:?}");
    assert_eq!((r.stale_rejected, r.caught), (1, 1), "{r:?}");
    assert!(
        r.uncaught.is_empty() && r.token_regressions.is_empty() && r.hung.is_empty(),
        "{r:?}"
    );
    assert!(
        took_over <= ttl + Duration::from_secs(2),
        "took over after {took_over:?}"
    );
    assert_lost_signal_fired_in_time(&h, child_session, frozen, child_writes[0]);
    assert!(h.incidents.is_empty() && h.malformed.is_empty(), "{h:?}");
    let value = resource_value(&store.url()).await;
    assert_eq!(
        value, b_session,
        "the resource holds the new holder's write"
    );
}

/// A child client (number 1) that acquires once with keep-alive, checks its validity, works
/// 1.2 s and writes once.
fn spawn_one_write_child(
    urls: &[String],
    ttl: Duration,
    store_url: &str,
    rec: &Recorder,
) -> ChildClient {
    let mut spec = ClientSpec::new(1, urls.to_vec(), ttl, 0);
    spec.once = true;
    spec.writes = 1..=1;
    spec.work = Duration::from_millis(1200);
    ChildClient::spawn(
        &ChildSpec {
            client: spec,
            resource_url: store_url.to_owned(),
            first_session: 1_000_000,
        },
        rec.clone(),
    )
}

/// The post-mortem's question: had the lost signal fired by the time the child could check?
/// Once, after the freeze, after the child's deadline, and no later than its `stale` write
/// returned.
fn assert_lost_signal_fired_in_time(
    h: &History,
    child_session: SessionId,
    frozen: Mono,
    stale: &Write,
) {
    let lost: Vec<_> = h
        .lost
        .iter()
        .filter(|l| l.session == child_session)
        .collect();
    assert_eq!(
        lost.len(),
        1,
        "the child reports its lost signal once: {h:?}"
    );
    let lost_at = lost[0].at;
    assert!(
        lost_at > frozen,
        "the signal fired after the freeze, not before: {lost_at:?} vs {frozen:?}"
    );
    assert!(
        lost_at <= stale.end,
        "the signal had fired by the time the stale write returned: lost at {lost_at:?}, \
         write {:?}..{:?}",
        stale.start,
        stale.end
    );
    let child_section = h
        .sections
        .iter()
        .find(|s| s.session == child_session)
        .expect("the child's section");
    assert!(
        child_section.valid_until <= lost_at,
        "the child's deadline ({:?}) had passed when the signal fired ({lost_at:?})",
        child_section.valid_until
    );
    let ms = |a: Mono, b: Mono| (i128::from(a.0) - i128::from(b.0)) as f64 / 1e6;
    println!(
        "lost signal at {:+.2} ms from the stale write's start; the write returned {:.2} ms later",
        ms(lost_at, stale.start),
        ms(stale.end, lost_at)
    );
}

/// The value the resource holds.
async fn resource_value(store_url: &str) -> u64 {
    let mut conn = redis::Client::open(store_url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&crate::support::direct_config())
        .await
        .unwrap();
    redis::cmd("GET")
        .arg(DATA_KEY)
        .query_async(&mut conn)
        .await
        .unwrap()
}
