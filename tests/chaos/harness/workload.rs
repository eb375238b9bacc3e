//! A client using the lock for real: acquire, write to the fenced resource a few times (each
//! write preceded by a validity check, then some "work"), sometimes extend, release; again and
//! again. Every call is recorded. The same loop runs as a task of the test or in a child process.

use std::ops::RangeInclusive;
use std::time::Duration;

use quorumlock::{Error, Lock, Redlock, RestartGuard};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::history::{Mono, Op, OpKind, Recorder, Section, SessionId};
use crate::resource::Resource;
use crate::support::NODE_TIMEOUT;

/// The key every client fights over.
pub const KEY: &str = "chaos";
/// How long one `acquire_timeout` keeps trying.
pub const ACQUIRE_WAIT: Duration = Duration::from_secs(2);
/// Scheduling slack on a loaded 2-core box, added to every operation's nominal bound.
pub const SLACK: Duration = Duration::from_millis(1500);
/// Slack in the liveness bound (the lock is acquired again after a heal): a loaded 2-core box
/// can stretch a recovery that takes about 1 s when it is busy (`stress-ng --cpu 2`) further;
/// a lock that does not come back fails all the same.
pub const LIVENESS_SLACK: Duration = Duration::from_millis(4000);
/// How long a node connection may take (TCP, handshake, scripts).
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Validity a client wants left, beyond its planned work, before it writes.
pub const WRITE_MARGIN: Duration = Duration::from_millis(30);
/// Share of critical sections that are long: 3 to 6 writes, up to [`LONG_WORK`] before each.
pub const LONG_SECTIONS: f64 = 0.2;
/// The most work before a write in a long section.
pub const LONG_WORK: Duration = Duration::from_millis(150);

/// The longest an acquisition may take: `ACQUIRE_WAIT`, then one last round and a fence raise.
pub fn acquire_bound() -> Duration {
    ACQUIRE_WAIT + NODE_TIMEOUT * 2 + Duration::from_millis(25) + SLACK
}

/// The longest an extension, release or resource write may take.
pub fn call_bound() -> Duration {
    NODE_TIMEOUT + SLACK
}

#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub client: usize,
    pub urls: Vec<String>,
    pub ttl: Duration,
    pub guard: RestartGuard,
    /// Work between the validity check and each write: uniform in `[0, work]`.
    pub work: Duration,
    /// How many writes per critical section.
    pub writes: RangeInclusive<u32>,
    /// Extend automatically (every ttl/3) instead of now and then by hand.
    pub keep_alive: bool,
    /// Stop after one critical section.
    pub once: bool,
    /// Check validity again after the work, right before writing (a careful client). Without
    /// it, a pause during the work goes unnoticed: the GC-pause story the child client plays.
    pub recheck: bool,
    pub seed: u64,
}

impl ClientSpec {
    pub fn new(client: usize, urls: Vec<String>, ttl: Duration, seed: u64) -> ClientSpec {
        ClientSpec {
            client,
            urls,
            ttl,
            guard: RestartGuard::default(),
            work: Duration::from_millis(20),
            writes: 1..=4,
            keep_alive: false,
            once: false,
            recheck: true,
            seed,
        }
    }

    pub fn locks(&self) -> Redlock {
        Redlock::builder(&self.urls)
            .node_timeout(NODE_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
            .restart_guard(self.guard)
            .max_ttl(self.ttl)
            .build()
            .expect("valid config")
    }
}

pub fn outcome<T>(r: &Result<T, Error>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(Error::Held { .. }) => "held",
        Err(Error::NoQuorum { .. }) => "no_quorum",
        Err(Error::ValidityExpired { .. }) => "expired",
        Err(Error::Lost { .. }) => "lost",
        Err(_) => "error",
    }
}

/// Runs the client until `stop` (or after one section with `once`).
pub async fn run_client(
    spec: ClientSpec,
    resource: Resource,
    rec: Recorder,
    stop: CancellationToken,
) {
    let locks = spec.locks();
    let mut rng = StdRng::seed_from_u64(spec.seed);
    // Connect to every node before the faults start: the restart guard compares run ids with
    // the first one it saw.
    let _ = locks.status(KEY).await;
    while !stop.is_cancelled() {
        let start = Mono::now();
        let acquired = tokio::select! {
            r = locks.acquire_timeout(KEY, spec.ttl, ACQUIRE_WAIT) => r,
            _ = stop.cancelled() => break,
        };
        rec.op(Op {
            client: spec.client,
            kind: OpKind::Acquire,
            start,
            end: Mono::now(),
            bound: acquire_bound(),
            outcome: outcome(&acquired),
        });
        let Ok(lock) = acquired else {
            continue;
        };
        critical_section(&spec, &mut rng, lock, &resource, &rec).await;
        if spec.once {
            break;
        }
    }
}

async fn critical_section(
    spec: &ClientSpec,
    rng: &mut StdRng,
    lock: Lock,
    resource: &Resource,
    rec: &Recorder,
) {
    let held = Held::new(lock, spec.client, rec);
    // Now and then a long section, kept alive in the background: faults then hit a holder
    // that goes on working.
    let long = !spec.once && rng.random_bool(LONG_SECTIONS);
    let keep_alive = spec.keep_alive || long;
    if keep_alive {
        held.lock().keep_alive();
    }
    let (writes, max_work) = if long {
        (rng.random_range(3..=6), LONG_WORK)
    } else {
        (rng.random_range(spec.writes.clone()), spec.work)
    };
    let done = CancellationToken::new();
    let body = async {
        for n in 0..writes {
            if n > 0 && !keep_alive && rng.random_bool(0.25) {
                held.extend(spec.ttl, rec).await;
            }
            let work = if spec.once {
                max_work
            } else {
                max_work.mul_f64(rng.random())
            };
            held.observe(rec);
            if held.lock().is_lost() || held.lock().validity() < work + WRITE_MARGIN {
                break;
            }
            rec.checked(held.session, Mono::now());
            tokio::time::sleep(work).await;
            if spec.recheck && (held.lock().is_lost() || held.lock().validity() < WRITE_MARGIN) {
                break;
            }
            held.write(resource, rec).await;
        }
        done.cancel();
    };
    if keep_alive {
        // The background extensions move the deadline behind our back: report each move (a
        // killed child's section is rebuilt from the last one) and the moment the lost signal
        // fires. The library has no "extended" event, so the deadline is sampled.
        tokio::join!(body, held.watch(rec, &done));
    } else {
        body.await;
    }
    let _ = held.release(rec).await;
}

/// How often a kept-alive section's deadline is sampled for extensions.
const DEADLINE_SAMPLE: Duration = Duration::from_millis(10);

/// A critical section in progress, recording what is done under it. The random clients use it,
/// and the scripted cases drive it step by step.
///
/// The section is recorded as open when it begins; [`release`](Self::release) closes it. A
/// `Held` dropped without release (its task was aborted) closes it at that moment, with the
/// lock's deadline as it then stood: the client can no longer act, and the guard's drop
/// releases the lock in the background.
pub struct Held {
    lock: Option<Lock>,
    pub session: SessionId,
    pub token: u64,
    pub acquired: Mono,
    pub client: usize,
    rec: Recorder,
    /// The deadline last reported to the recorder.
    reported: std::sync::Mutex<Mono>,
}

impl Held {
    /// Wraps a lock just acquired: a new session begins now.
    pub fn new(lock: Lock, client: usize, rec: &Recorder) -> Held {
        let acquired = Mono::now();
        let until = Mono::of(lock.deadline());
        let held = Held {
            session: rec.session(),
            token: lock.token().get(),
            acquired,
            client,
            lock: Some(lock),
            rec: rec.clone(),
            reported: std::sync::Mutex::new(until),
        };
        rec.open(Section {
            session: held.session,
            client,
            token: held.token,
            acquired,
            valid_until: until,
            released: None,
        });
        held
    }

    /// The lock held.
    pub fn lock(&self) -> &Lock {
        self.lock.as_ref().expect("held until released")
    }

    /// Reports the deadline to the recorder if it moved since last reported.
    pub fn observe(&self, rec: &Recorder) {
        let until = Mono::of(self.lock().deadline());
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        // `Mono::of` converts with a fresh reading of both clocks: ignore sub-ms jitter.
        if until.0.abs_diff(reported.0) > 1_000_000 {
            *reported = until;
            rec.extended(self.session, until);
        }
    }

    /// Until `done`: reports every move of the deadline, and when the lost signal fires.
    async fn watch(&self, rec: &Recorder, done: &CancellationToken) {
        let lost = self.lock().lost();
        tokio::pin!(lost);
        let mut lost_seen = false;
        loop {
            tokio::select! {
                _ = done.cancelled() => break,
                () = &mut lost, if !lost_seen => {
                    lost_seen = true;
                    rec.lost(self.session, Mono::now());
                }
                () = tokio::time::sleep(DEADLINE_SAMPLE) => self.observe(rec),
            }
        }
    }

    /// `acquire_timeout(KEY, ttl, wait)`, recorded.
    pub async fn acquire(
        locks: &Redlock,
        client: usize,
        ttl: Duration,
        wait: Duration,
        rec: &Recorder,
    ) -> Result<Held, Error> {
        let start = Mono::now();
        let r = locks.acquire_timeout(KEY, ttl, wait).await;
        rec.op(Op {
            client,
            kind: OpKind::Acquire,
            start,
            end: Mono::now(),
            bound: wait + acquire_bound() - ACQUIRE_WAIT,
            outcome: outcome(&r),
        });
        Ok(Held::new(r?, client, rec))
    }

    /// Extends by hand, recorded.
    pub async fn extend(&self, ttl: Duration, rec: &Recorder) {
        let start = Mono::now();
        let r = self.lock().extend(ttl).await;
        self.op(rec, OpKind::Extend, start, outcome(&r));
        self.observe(rec);
    }

    /// Writes to the resource with this session's token; whether fencing accepted it.
    pub async fn write(&self, resource: &Resource, rec: &Recorder) -> bool {
        let start = Mono::now();
        let accepted = resource
            .write(rec, self.client, self.session, self.token)
            .await;
        self.op(rec, OpKind::Write, start, "ok");
        accepted
    }

    /// Releases, and the section goes into the history.
    pub async fn release(mut self, rec: &Recorder) -> Result<(), Error> {
        let lock = self.lock.take().expect("held until released");
        let released = Mono::now();
        let deadline = lock.deadline();
        // The section is closed before the call: if this task is aborted during the release,
        // the drop does not close it a second time.
        rec.section(Section {
            session: self.session,
            client: self.client,
            token: self.token,
            acquired: self.acquired,
            valid_until: Mono::of(deadline),
            released: Some(released),
        });
        let r = lock.release().await;
        rec.op(Op {
            client: self.client,
            kind: OpKind::Release,
            start: released,
            end: Mono::now(),
            bound: call_bound(),
            outcome: outcome(&r),
        });
        r
    }

    fn op(&self, rec: &Recorder, kind: OpKind, start: Mono, outcome: &'static str) {
        rec.op(Op {
            client: self.client,
            kind,
            start,
            end: Mono::now(),
            bound: call_bound(),
            outcome,
        });
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(lock) = &self.lock {
            self.rec.section(Section {
                session: self.session,
                client: self.client,
                token: self.token,
                acquired: self.acquired,
                valid_until: Mono::of(lock.deadline()),
                released: Some(Mono::now()),
            });
        }
    }
}
