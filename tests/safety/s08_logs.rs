//! Pins issue 12 item 8: an outage is logged once, not once per round. With 3 of 5 nodes dead, a
//! held lock's keep-alive, a caller retrying acquisitions and a campaign emit a bounded number of
//! warnings (one per node going down, one per outage for each lock, caller and campaign), with
//! node failures Display-formatted; and `release()` after the lost signal reports `Lost`, as the
//! docs say, not `NoQuorum`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::{Election, Error};
use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use crate::support::{builder, cluster, spread, warm};

/// Every WARN event of the crate, rendered as `message field=value ...`.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Render(String);

impl Visit for Render {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

impl<S: Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() == Level::WARN && meta.target().starts_with("quorumlock") {
            let mut r = Render(String::new());
            event.record(&mut r);
            self.0.lock().unwrap().push(r.0);
        }
    }
}

/// Node-down warnings (one per dead node), one per lock (its keep-alive's outage and its loss),
/// one for the caller's acquisitions, one for the campaign: a handful, whatever the duration.
const MAX_WARNINGS: usize = 10;

#[tokio::test]
async fn a_three_of_five_outage_warns_once_per_lock_and_campaign() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let warnings = Warnings::default();
    // Current-thread runtime: every task of this test runs on this thread, under this layer.
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let locks = builder(&cluster).build().unwrap();
    warm(&locks).await;
    let lock = locks
        .try_acquire("held", Duration::from_secs(3))
        .await
        .unwrap();
    spread(&lock, &urls).await;
    lock.keep_alive();
    let election = Election::builder(locks.clone(), "seat")
        .ttl(Duration::from_secs(2))
        .candidate("c1")
        .build()
        .unwrap();
    for i in 0..3 {
        cluster.kill(i).unwrap();
    }
    let outage = Duration::from_secs(5);
    let end = Instant::now() + outage;
    let caller = async {
        while Instant::now() < end {
            let err = locks
                .acquire("job", Duration::from_secs(2))
                .await
                .unwrap_err();
            assert!(err.is_no_quorum(), "{err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let campaign = async {
        let err = election.campaign_timeout(outage).await.unwrap_err();
        assert!(err.is_no_quorum(), "{err}");
    };
    tokio::join!(caller, campaign);
    assert!(lock.is_lost(), "3 s lock cannot outlive a 5 s outage");
    drop(lock);

    let warnings = warnings.0.lock().unwrap().clone();
    assert!(
        warnings.len() <= MAX_WARNINGS,
        "{} warnings in a {outage:?} outage (at most {MAX_WARNINGS} expected):\n{}",
        warnings.len(),
        warnings.join("\n")
    );
    let debug_formatted: Vec<_> = warnings
        .iter()
        .filter(|w| w.contains("NodeFailure {") || w.contains("Timeout(") || w.contains("Refused("))
        .collect();
    assert!(
        debug_formatted.is_empty(),
        "failures logged in Debug form: {debug_formatted:#?}"
    );
}

#[tokio::test]
async fn release_after_the_lost_signal_reports_lost() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = builder(&cluster).build().unwrap();
    warm(&locks).await;
    let lock = locks
        .try_acquire("job", Duration::from_secs(2))
        .await
        .unwrap();
    spread(&lock, &urls).await;
    lock.keep_alive();
    for i in 0..3 {
        cluster.kill(i).unwrap();
    }
    tokio::time::timeout(Duration::from_secs(10), lock.lost())
        .await
        .expect("keep-alive gives up within the ttl");
    let err = lock.release().await.unwrap_err();
    assert!(
        matches!(err, Error::Lost { .. }),
        "release after lost() must say Lost: {err}"
    );
}
