//! A client process frozen (SIGSTOP) while it holds the lock, past its ttl: the GC-pause
//! post-mortem, replayed with a real process and a real heartbeat.

use std::time::Duration;

use quorumlock::testkit::{RedisServer, ServerOptions};

use crate::checker::check;
use crate::child::{ChildClient, ChildSpec, Event};
use crate::history::{Fault, Mono, Recorder};
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
/// it was frozen too. Liveness: the new holder acquires within ttl + 2 s of the freeze.
#[tokio::test]
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

    let mut spec = ClientSpec::new(1, urls.clone(), ttl, 0);
    spec.once = true;
    spec.writes = 1..=1;
    spec.work = Duration::from_millis(1200);
    let mut child = ChildClient::spawn(
        &ChildSpec {
            client: spec,
            resource_url: store.url(),
            first_session: 1_000_000,
        },
        rec.clone(),
    );
    let child_token = match child
        .wait_for(Duration::from_secs(20), "its acquisition", |e| {
            matches!(e, Event::Acquired { .. })
        })
        .await
    {
        Event::Acquired { token, .. } => token,
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
    let mut conn = redis::Client::open(store.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let value: u64 = redis::cmd("GET")
        .arg(DATA_KEY)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        value, b_session,
        "the resource holds the new holder's write"
    );
}
