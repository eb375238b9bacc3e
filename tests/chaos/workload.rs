//! A client using the lock for real: acquire, write to the fenced resource a few times (each
//! write preceded by a validity check, then some "work"), sometimes extend, release; again and
//! again. Every call is recorded. The same loop runs as a task of the test or in a child process.

use std::ops::RangeInclusive;
use std::time::Duration;

use quorumlock::{Error, Lock, Redlock, RestartGuard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
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
        held.lock.keep_alive();
    }
    let (writes, max_work) = if long {
        (rng.random_range(3..=6), LONG_WORK)
    } else {
        (rng.random_range(spec.writes.clone()), spec.work)
    };
    for n in 0..writes {
        if n > 0 && !keep_alive && rng.random_bool(0.25) {
            held.extend(spec.ttl, rec).await;
        }
        let work = if spec.once {
            max_work
        } else {
            max_work.mul_f64(rng.random())
        };
        if held.lock.is_lost() || held.lock.validity() < work + WRITE_MARGIN {
            break;
        }
        rec.checked(held.session, Mono::now());
        tokio::time::sleep(work).await;
        if spec.recheck && (held.lock.is_lost() || held.lock.validity() < WRITE_MARGIN) {
            break;
        }
        held.write(resource, rec).await;
    }
    let _ = held.release(rec).await;
}

/// A critical section in progress, recording what is done under it. The random clients use it,
/// and the scripted cases drive it step by step.
pub struct Held {
    pub lock: Lock,
    pub session: SessionId,
    pub token: u64,
    pub acquired: Mono,
    pub client: usize,
}

impl Held {
    /// Wraps a lock just acquired: a new session begins now.
    pub fn new(lock: Lock, client: usize, rec: &Recorder) -> Held {
        let held = Held {
            session: rec.session(),
            token: lock.token().get(),
            acquired: Mono::now(),
            client,
            lock,
        };
        rec.acquired(
            held.session,
            held.token,
            held.acquired,
            Mono::of(held.lock.deadline()),
        );
        held
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
        let r = self.lock.extend(ttl).await;
        self.op(rec, OpKind::Extend, start, outcome(&r));
    }

    /// Writes to the resource with this session's token; whether fencing accepted it.
    pub async fn write(&self, resource: &Resource, rec: &Recorder) -> bool {
        let start = Mono::now();
        let accepted = resource.write(rec, self.session, self.token).await;
        self.op(rec, OpKind::Write, start, "ok");
        accepted
    }

    /// Releases, and the section goes into the history.
    pub async fn release(self, rec: &Recorder) -> Result<(), Error> {
        let released = Mono::now();
        let deadline = self.lock.deadline();
        let r = self.lock.release().await;
        rec.op(Op {
            client: self.client,
            kind: OpKind::Release,
            start: released,
            end: Mono::now(),
            bound: call_bound(),
            outcome: outcome(&r),
        });
        rec.section(Section {
            session: self.session,
            client: self.client,
            token: self.token,
            acquired: self.acquired,
            valid_until: Mono::of(deadline),
            released: Some(released),
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
