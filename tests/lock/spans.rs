//! Tracing spans against real servers: every operation has a span with its key, ttl, rounds and
//! outcome, and the work a call leaves to background tasks (keep-alive, the release of a
//! dropped guard) runs in the caller's span.
//!
//! Each test installs a recording subscriber for its own thread (`set_default`) and runs on the
//! current-thread runtime, so the subscriber sees the tasks the library spawns too.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use quorumlock::{Election, Outcome, RunOnce};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Instrument, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A closed span: its name, its fields (as recorded by the end), and the names of its
/// ancestors, nearest first.
#[derive(Debug, Clone)]
struct Closed {
    name: &'static str,
    fields: BTreeMap<&'static str, String>,
    ancestors: Vec<&'static str>,
}

impl Closed {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    fn under(&self, ancestor: &str) -> bool {
        self.ancestors.contains(&ancestor)
    }
}

/// A span's fields, kept in its extensions while it is open.
#[derive(Debug, Default)]
struct Fields(BTreeMap<&'static str, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

/// Records every span that closes.
#[derive(Debug, Clone, Default)]
struct Recorder {
    closed: Arc<Mutex<Vec<Closed>>>,
}

impl Recorder {
    /// The closed spans named `name` for key `key`.
    fn spans(&self, name: &str, key: &str) -> Vec<Closed> {
        self.closed
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.name == name && c.field("key") == Some(key))
            .cloned()
            .collect()
    }

    /// Waits (at most `WAIT`) until a closed span named `name` for `key` satisfies `pred`, and
    /// returns it.
    async fn closed(&self, name: &str, key: &str, pred: impl Fn(&Closed) -> bool) -> Closed {
        let found = |r: &Recorder| r.spans(name, key).into_iter().find(|c| pred(c));
        wait_until(WAIT, &format!("a closed {name} span for {key}"), || {
            let seen = found(self).is_some();
            async move { seen }
        })
        .await;
        found(self).expect("found above")
    }
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let fields = span
            .extensions_mut()
            .remove::<Fields>()
            .unwrap_or_default()
            .0;
        let ancestors = span.scope().skip(1).map(|s| s.name()).collect();
        self.closed.lock().unwrap().push(Closed {
            name: span.name(),
            fields,
            ancestors,
        });
    }
}

/// A span's `rounds`.
fn rounds(span: &Closed) -> u32 {
    span.field("rounds")
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no rounds: {span:?}"))
}

/// A recorder installed as this thread's subscriber until the guard drops.
fn record() -> (Recorder, tracing::subscriber::DefaultGuard) {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone());
    (recorder, tracing::subscriber::set_default(subscriber))
}

/// Acquire, extend and release each have a span with the key, the ttl and the outcome, inside
/// the caller's span.
#[tokio::test]
async fn sp1_acquire_extend_release_have_spans() {
    let (rec, _guard) = record();
    let cluster = cluster(3);
    let locks = client(&cluster);
    let caller = tracing::info_span!("test.caller");
    async {
        let lock = locks
            .acquire("sp1", Duration::from_secs(5))
            .await
            .expect("acquired");
        lock.extend(Duration::from_secs(4)).await.expect("extended");
        lock.release().await.expect("released");
    }
    .instrument(caller.clone())
    .await;

    let acquire = rec.closed("quorumlock.acquire", "sp1", |_| true).await;
    assert_eq!(acquire.field("ttl_ms"), Some("5000"), "{acquire:?}");
    assert_eq!(acquire.field("outcome"), Some("acquired"), "{acquire:?}");
    assert!(rounds(&acquire) >= 1, "{acquire:?}");
    assert!(acquire.field("token").is_some(), "{acquire:?}");
    assert_eq!(acquire.ancestors, ["test.caller"]);

    let extend = rec.closed("quorumlock.extend", "sp1", |_| true).await;
    assert_eq!(extend.field("ttl_ms"), Some("4000"), "{extend:?}");
    assert_eq!(extend.field("outcome"), Some("extended"), "{extend:?}");
    assert!(extend.field("validity_ms").is_some(), "{extend:?}");
    assert_eq!(extend.field("token"), acquire.field("token"));
    assert_eq!(extend.ancestors, ["test.caller"]);

    let release = rec.closed("quorumlock.release", "sp1", |_| true).await;
    assert_eq!(release.field("outcome"), Some("released"), "{release:?}");
    assert_eq!(release.field("token"), acquire.field("token"));
    assert_eq!(release.ancestors, ["test.caller"]);
}

/// A held lock's second acquisition says `held`, with the rounds it made; a cancelled one says
/// `cancelled`.
#[tokio::test]
async fn sp2_refused_and_cancelled_acquisitions() {
    let (rec, _guard) = record();
    let cluster = cluster(3);
    let locks = client(&cluster);
    let other = client(&cluster);
    // Held far longer than the test waits for anything.
    let lock = locks
        .acquire("sp2", Duration::from_secs(60))
        .await
        .expect("acquired");

    let err = other
        .try_acquire("sp2", Duration::from_secs(10))
        .await
        .expect_err("held");
    assert!(err.is_held(), "{err}");
    let refused = rec
        .closed("quorumlock.acquire", "sp2", |c| {
            c.field("outcome") == Some("held")
        })
        .await;
    assert_eq!(refused.field("rounds"), Some("1"), "{refused:?}");
    assert_eq!(refused.field("token"), None, "{refused:?}");

    // With retries: the default three, so four rounds in all.
    let err = other
        .acquire("sp2", Duration::from_secs(10))
        .await
        .expect_err("held");
    assert!(err.is_held(), "{err}");
    rec.closed("quorumlock.acquire", "sp2", |c| {
        c.field("outcome") == Some("held") && c.field("rounds") == Some("4")
    })
    .await;

    // A wait for the held lock, cut short long before the holder's ttl ends: dropped midway.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        other.acquire_timeout("sp2", Duration::from_secs(10), Duration::from_secs(60)),
    )
    .await;
    assert!(cancelled.is_err(), "the wait was cut short");
    rec.closed("quorumlock.acquire", "sp2", |c| {
        c.field("outcome") == Some("cancelled") && c.field("rounds").is_some()
    })
    .await;

    lock.release().await.expect("released");
    tokio::time::timeout(WAIT, other.flush())
        .await
        .expect("flushed");
}

/// A dropped guard's background release has a span of its own, a child of the span current
/// where the guard was dropped.
#[tokio::test]
async fn sp3_background_release_is_in_the_droppers_span() {
    let (rec, _guard) = record();
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let dropper = tracing::info_span!("test.dropper");
    let lock = locks
        .acquire("sp3", Duration::from_secs(10))
        .instrument(dropper.clone())
        .await
        .expect("acquired");
    let token = lock.token().get().to_string();
    dropper.in_scope(|| drop(lock));
    drop(dropper);

    let release = rec
        .closed("quorumlock.release", "sp3", |c| {
            c.field("background") == Some("true")
        })
        .await;
    assert!(release.under("test.dropper"), "{release:?}");
    assert_eq!(release.field("token"), Some(token.as_str()));
    wait_until(WAIT, "the key released on every node", || {
        let n = holders(&urls, "sp3");
        async move { n == 0 }
    })
    .await;
}

/// Keep-alive's extensions run in the span current where `keep_alive` was called, not in the
/// span current where the lock is later released.
#[tokio::test]
async fn sp4_keep_alive_extends_in_the_callers_span() {
    let (rec, _guard) = record();
    let cluster = cluster(3);
    let locks = client(&cluster);
    let lock = locks
        .acquire("sp4", Duration::from_millis(1500))
        .await
        .expect("acquired");
    let keeper = tracing::info_span!("test.keeper");
    keeper.in_scope(|| lock.keep_alive());
    // An extension (every ttl / 3) in a span of its own, under the keeper.
    let extend = rec
        .closed("quorumlock.extend", "sp4", |c| {
            c.field("outcome") == Some("extended")
        })
        .await;
    assert_eq!(extend.ancestors, ["test.keeper"]);
    assert_eq!(extend.field("ttl_ms"), Some("1500"), "{extend:?}");
    // Whatever the release says (a loaded box may have lost the lock meanwhile), its span is
    // a root: it was called outside any span, unlike the extensions.
    let _ = lock.release().await;
    let release = rec.closed("quorumlock.release", "sp4", |_| true).await;
    assert!(release.ancestors.is_empty(), "{release:?}");
}

/// A campaign and a run-once call have spans; the acquisitions they make are inside, and a
/// leader's keep-alive runs in the caller's span, not in the (ended) campaign's.
#[tokio::test]
async fn sp5_campaign_and_run_once_have_spans() {
    let (rec, _guard) = record();
    let cluster = cluster(3);
    let election = Election::builder(client(&cluster), "sp5-election")
        .ttl(Duration::from_millis(1500))
        .candidate("a")
        .build()
        .expect("valid election");
    let caller = tracing::info_span!("test.leader");
    let leadership = tokio::time::timeout(WAIT, election.campaign().instrument(caller.clone()))
        .await
        .expect("elected within the wait")
        .expect("elected");
    let campaign = rec
        .closed("quorumlock.campaign", "sp5-election", |_| true)
        .await;
    assert_eq!(campaign.field("outcome"), Some("elected"), "{campaign:?}");
    assert!(rounds(&campaign) >= 1, "{campaign:?}");
    assert_eq!(campaign.field("ttl_ms"), Some("1500"), "{campaign:?}");
    assert_eq!(
        campaign.field("token"),
        Some(leadership.token().get().to_string().as_str())
    );
    assert_eq!(campaign.ancestors, ["test.leader"]);
    let acquire = rec
        .closed("quorumlock.acquire", "sp5-election", |_| true)
        .await;
    assert_eq!(acquire.ancestors, ["quorumlock.campaign", "test.leader"]);
    rec.closed("quorumlock.extend", "sp5-election", |c| {
        c.ancestors == ["test.leader"] && c.field("outcome") == Some("extended")
    })
    .await;
    tokio::time::timeout(WAIT, leadership.resign())
        .await
        .expect("resigned within the wait")
        .expect("resigned");

    let job = RunOnce::builder(client(&cluster), "sp5-job")
        .ttl(Duration::from_secs(2))
        .marker_ttl(Duration::from_secs(60))
        .instance("a")
        .build()
        .expect("valid job");
    let ran = job
        .run(7, |_ctx| async { tracing::info!("working") })
        .await
        .expect("ran");
    assert!(ran.ran());
    let run = rec
        .closed("quorumlock.run_once", "sp5-job", |c| {
            c.field("outcome") == Some("ran")
        })
        .await;
    assert_eq!(run.field("tick"), Some("7"), "{run:?}");
    assert_eq!(run.field("ttl_ms"), Some("2000"), "{run:?}");
    assert!(run.field("token").is_some(), "{run:?}");
    for name in ["quorumlock.acquire", "quorumlock.release"] {
        let inner = rec.closed(name, "sp5-job", |_| true).await;
        assert_eq!(inner.ancestors, ["quorumlock.run_once"], "{inner:?}");
    }
    let again = job.run(7, |_ctx| async {}).await.expect("skipped");
    assert!(matches!(again, Outcome::Skipped { .. }), "{again:?}");
    rec.closed("quorumlock.run_once", "sp5-job", |c| {
        c.field("outcome") == Some("already_ran")
    })
    .await;
}
