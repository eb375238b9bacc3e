//! Running one workload for one implementation: sequential or concurrent workers, bounded by an
//! operation count and a wall-clock budget, on tokio tasks (async clients) or OS threads
//! (blocking clients). A worker that is still stuck after the budget plus a grace period is
//! reported as hung and left behind (its thread is kept to be joined later).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use crate::clients::{Client, Fail};

/// How long past its budget a workload may run before its stuck workers count as hung.
const GRACE: Duration = Duration::from_secs(3);

/// What each worker does in a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Acquire a distinct key and leave it to expire.
    Acquire,
    /// Acquire a distinct key and release it.
    AcquireRelease,
    /// Extend one held lock.
    Extend,
    /// Try to acquire the one shared key (one attempt), release at once when it was won; after
    /// a refused attempt, pause a random 0–2 ms (Redlock's random retry delay, the same for
    /// every implementation; without it, naive clients livelock on split votes).
    Contended,
    /// The same, but quorumlock *waits* for the key (`acquire_timeout`: woken by the release
    /// notice); the other implementations poll as in `Contended` (the polling floor).
    ContendedWait,
}

/// One workload run.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) op: Op,
    pub(crate) tasks: usize,
    /// Operations per worker at most.
    pub(crate) max_ops: u64,
    pub(crate) budget: Duration,
    /// Key prefix, unique per implementation and scenario.
    pub(crate) prefix: String,
    /// Lock names each worker cycles through (`None`: a new name for every operation).
    pub(crate) names: Option<u64>,
}

/// What one worker did.
#[derive(Debug, Default, Clone)]
pub(crate) struct WorkerOut {
    /// Latency of each successful operation.
    pub(crate) lat: Vec<Duration>,
    pub(crate) ok: u64,
    /// Attempts that found the lock held.
    pub(crate) busy: u64,
    pub(crate) err: u64,
    pub(crate) first_err: Option<String>,
    /// One-key scenarios: from the start of the previous holder's release to this acquisition.
    pub(crate) handover: Vec<Duration>,
}

/// What a workload run did.
#[derive(Debug, Default)]
pub(crate) struct RunOut {
    pub(crate) workers: Vec<WorkerOut>,
    pub(crate) elapsed: Duration,
    /// Workers still blocked after the budget and the grace period.
    pub(crate) hung: usize,
    /// CPU time of this process (the client under test) during the run.
    pub(crate) client_cpu: Duration,
    /// CPU time of the redis-server processes during the run.
    pub(crate) server_cpu: Duration,
}

/// User + system CPU time of a process, from `/proc/PID/stat` (clock ticks of 10 ms).
pub(crate) fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after_comm
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    Duration::from_millis(fields.iter().sum::<u64>() * 10)
}

fn servers_cpu(pids: &[u32]) -> Duration {
    pids.iter().map(|p| cpu_time(&p.to_string())).sum()
}

/// Runs `spec` for `client`; blocking clients' stuck threads are pushed to `stragglers`.
pub(crate) fn run(
    rt: &Runtime,
    client: &Arc<Client>,
    spec: &Spec,
    servers: &[u32],
    stragglers: &mut Vec<JoinHandle<()>>,
) -> RunOut {
    if let Some(node) = client.node() {
        let pid = node.pid().to_string();
        let (client_cpu, server_cpu) = (cpu_time(&pid), servers_cpu(servers));
        let start = Instant::now();
        let out = node.run(spec);
        return RunOut {
            hung: if out.is_some() { 0 } else { spec.tasks },
            elapsed: out.as_ref().map_or_else(|| start.elapsed(), |o| o.elapsed),
            workers: out.map(|o| o.workers).unwrap_or_default(),
            client_cpu: cpu_time(&pid).saturating_sub(client_cpu),
            server_cpu: servers_cpu(servers).saturating_sub(server_cpu),
        };
    }
    let (client_cpu, server_cpu) = (cpu_time("self"), servers_cpu(servers));
    let stop = Arc::new(AtomicBool::new(false));
    let released = Arc::new(Released::default());
    let outs: Vec<Arc<Mutex<WorkerOut>>> = (0..spec.tasks).map(|_| Arc::default()).collect();
    let start = Instant::now();
    let deadline = start + spec.budget;
    let hung;
    if client.blocking() {
        let handles: Vec<JoinHandle<()>> = outs
            .iter()
            .enumerate()
            .map(|(t, out)| {
                let (client, out, stop, spec, released) = (
                    Arc::clone(client),
                    Arc::clone(out),
                    Arc::clone(&stop),
                    spec.clone(),
                    Arc::clone(&released),
                );
                std::thread::spawn(move || {
                    futures::executor::block_on(worker(
                        client, spec, t, deadline, stop, out, released,
                    ));
                })
            })
            .collect();
        while handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline + GRACE {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        let (done, stuck): (Vec<_>, Vec<_>) = handles.into_iter().partition(|h| h.is_finished());
        hung = stuck.len();
        for h in done {
            let _ = h.join();
        }
        stragglers.extend(stuck);
    } else {
        hung = rt.block_on(async {
            let handles: Vec<_> = outs
                .iter()
                .enumerate()
                .map(|(t, out)| {
                    tokio::spawn(worker(
                        Arc::clone(client),
                        spec.clone(),
                        t,
                        deadline,
                        Arc::clone(&stop),
                        Arc::clone(out),
                        Arc::clone(&released),
                    ))
                })
                .collect();
            let mut hung = 0;
            for h in handles {
                let left = (deadline + GRACE).saturating_duration_since(Instant::now());
                if tokio::time::timeout(left, h).await.is_err() {
                    hung += 1;
                }
            }
            stop.store(true, Ordering::Relaxed);
            hung
        });
    }
    let elapsed = start.elapsed();
    let workers = outs
        .iter()
        .map(|o| o.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .collect();
    RunOut {
        workers,
        elapsed,
        hung,
        client_cpu: cpu_time("self").saturating_sub(client_cpu),
        server_cpu: servers_cpu(servers).saturating_sub(server_cpu),
    }
}

/// When the last release of the one key started, for the handover times.
#[derive(Debug)]
pub(crate) struct Released {
    epoch: Instant,
    /// Nanoseconds after `epoch`; 0: none yet.
    at: std::sync::atomic::AtomicU64,
}

impl Default for Released {
    fn default() -> Self {
        Released {
            epoch: Instant::now(),
            at: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Released {
    fn mark(&self) {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        self.at.store(ns.max(1), Ordering::SeqCst);
    }

    /// Time since the last release started, if one did.
    fn since(&self) -> Option<Duration> {
        let at = self.at.load(Ordering::SeqCst);
        let now = self.epoch.elapsed().as_nanos() as u64;
        (at > 0 && now > at).then(|| Duration::from_nanos(now - at))
    }
}

#[allow(clippy::too_many_arguments)]
async fn worker(
    client: Arc<Client>,
    spec: Spec,
    task: usize,
    deadline: Instant,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<WorkerOut>>,
    released: Arc<Released>,
) {
    let one_key = matches!(spec.op, Op::Contended | Op::ContendedWait);
    let mut held = None;
    if spec.op == Op::Extend {
        match client
            .acquire(&format!("{}:{task}:held", spec.prefix))
            .await
        {
            Ok(h) => held = Some(h),
            Err(f) => {
                record(&out, Duration::ZERO, Err(f));
                return;
            }
        }
    }
    let mut i = 0;
    while i < spec.max_ops && Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let key = match (spec.op, spec.names) {
            (Op::Contended | Op::ContendedWait, _) => spec.prefix.clone(),
            (_, Some(names)) => format!("{}:{task}:{}", spec.prefix, i % names),
            (_, None) => format!("{}:{task}:{i}", spec.prefix),
        };
        let t = Instant::now();
        let result = match spec.op {
            Op::Acquire => client.acquire(&key).await.map(Client::forget),
            Op::AcquireRelease => match client.acquire(&key).await {
                Ok(h) => released_ok(client.release(h).await),
                Err(f) => Err(f),
            },
            Op::Contended | Op::ContendedWait => {
                let got = if spec.op == Op::ContendedWait {
                    client.acquire_waiting(&key).await
                } else {
                    client.acquire(&key).await
                };
                match got {
                    Ok(h) => {
                        if let Some(d) = released.since() {
                            lock(&out).handover.push(d);
                        }
                        released.mark();
                        released_ok(client.release(h).await)
                    }
                    Err(f) => Err(f),
                }
            }
            Op::Extend => match held.as_mut() {
                Some(h) => extended(client.extend(h).await),
                None => Err(Fail::Error("no lock to extend".to_owned())),
            },
        };
        let refused = matches!(result, Err(Fail::Busy));
        record(&out, t.elapsed(), result);
        i += 1;
        if one_key && refused {
            let pause = Duration::from_micros(rand::random_range(0..2_000));
            if client.blocking() {
                std::thread::sleep(pause);
            } else {
                tokio::time::sleep(pause).await;
            }
        }
    }
    if let Some(h) = held {
        client.release(h).await;
    }
}

fn lock(out: &Mutex<WorkerOut>) -> std::sync::MutexGuard<'_, WorkerOut> {
    out.lock().unwrap_or_else(|e| e.into_inner())
}

fn released_ok(ok: bool) -> Result<(), Fail> {
    ok.then_some(())
        .ok_or_else(|| Fail::Error("release failed".to_owned()))
}

fn extended(ok: bool) -> Result<(), Fail> {
    ok.then_some(())
        .ok_or_else(|| Fail::Error("extend failed".to_owned()))
}

fn record(out: &Mutex<WorkerOut>, took: Duration, result: Result<(), Fail>) {
    let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
    match result {
        Ok(()) => {
            out.ok += 1;
            out.lat.push(took);
        }
        Err(Fail::Busy) => out.busy += 1,
        Err(Fail::Error(e)) => {
            out.err += 1;
            out.first_err.get_or_insert(e);
        }
    }
}
