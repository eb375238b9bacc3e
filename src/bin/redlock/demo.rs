//! `redlock demo`: five throwaway `redis-server` masters, a few workers contending for one key,
//! a node killed, the holder frozen, and the handover told with its fencing tokens and timing.
//!
//! The node is really killed (SIGKILL to its `redis-server` process). The workers are tasks in
//! this process, each with its own client (as if on its own host), so the holder's failure is
//! simulated, and the narration says so: the holder freezes (as in a long GC pause, or under
//! SIGSTOP), that is, it stops extending its lease and never releases, which to the lock is
//! what a crash is too: its keys stay until the ttl runs out, then the next worker gets a
//! greater token. The frozen worker later thaws and tries to write with its old token; the
//! store refuses it.

use std::fmt::Display;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use quorumlock::testkit::LocalCluster;
use quorumlock::{FenceGate, FencingToken, Lock, Redlock, StaleToken};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::child::{Signals, signal_exit_code};
use crate::report;
use crate::status::{render, seconds};

/// `redlock demo [--workers N]`
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// How many workers contend for the lock.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=8))]
    workers: u8,
}

const NODES: usize = 5;
/// The node the story kills.
const VICTIM: usize = 2;
const KEY: &str = "demo:nightly-report";
/// Short, so that the handover after the freeze takes about two seconds.
const TTL: Duration = Duration::from_secs(2);
/// How long a holder works before it releases.
const WORK: Duration = Duration::from_millis(1200);
/// How long a worker pauses after releasing, so that the others get their turn.
const REST: Duration = Duration::from_millis(300);
/// The gap between the workers' starts.
const STAGGER: Duration = Duration::from_millis(100);
const NODE_TIMEOUT: Duration = Duration::from_millis(250);
/// Upper bound for each step of the story (each normally takes one or two seconds).
const STEP_LIMIT: Duration = Duration::from_secs(10);
/// Upper bound for the whole story (it normally takes about ten seconds).
const STORY_LIMIT: Duration = Duration::from_secs(40);
const NAMES: [&str; 8] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
];

/// Runs the demo; 0 when the story ran to its end and every check held.
pub(crate) async fn demo(args: DemoArgs) -> u8 {
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            report(&format_args!("cannot install signal handlers: {e}"));
            return 1;
        }
    };
    let workers = usize::from(args.workers);
    out!(
        "redlock demo: {workers} workers contend for one lock held across {NODES} throwaway \
         redis-server masters.\nThe workers are tasks in this process, each with its own \
         client, as if on its own host."
    );
    let cluster = match LocalCluster::start(NODES) {
        Ok(c) => c,
        Err(e) => {
            report(&format_args!("the demo cannot start its cluster: {e}"));
            return 1;
        }
    };
    let mut story = match Story::new(cluster, workers) {
        Ok(s) => s,
        Err(e) => {
            report(&format_args!("the demo cannot build its clients: {e}"));
            return 1;
        }
    };
    let told = tokio::select! {
        r = tokio::time::timeout(STORY_LIMIT, story.tell()) => r.unwrap_or_else(|_| {
            Err(format!("the story took longer than {}", humantime::format_duration(STORY_LIMIT)))
        }),
        sig = signals.recv() => {
            story.stop().await;
            report(&format_args!("{sig} received; the demo stopped"));
            story.clean_up();
            return signal_exit_code(sig as i32);
        }
    };
    story.stop().await;
    let code = match told {
        Ok(()) => story.summary(),
        Err(why) => {
            report(&format_args!("the demo stopped early: {why}"));
            1
        }
    };
    story.clean_up();
    if code == 0 {
        out!(
            "Next: redlock run --nodes redis://host1:6379,redis://host2:6379,... KEY -- CMD \
             [ARGS...] (see docs/cli.md)"
        );
    }
    code
}

/// What the workers report to the narrator.
#[derive(Debug, Default)]
struct Progress {
    acquisitions: usize,
    last_holder: usize,
    tokens: Vec<u64>,
    handover: Option<Duration>,
    zombie: Option<Result<(), StaleToken>>,
}

/// State shared by the narrator and the workers.
#[derive(Debug)]
struct Shared {
    start: Instant,
    /// The protected resource: a store that refuses writes with a stale fencing token.
    store: FenceGate,
    progress: watch::Sender<Progress>,
    /// How many workers believe they hold the lock right now (never more than one).
    holding: AtomicUsize,
    overlaps: AtomicUsize,
    crashed_at: Mutex<Option<Instant>>,
}

impl Shared {
    fn say(&self, who: &str, what: impl Display) {
        out!(
            "[{:>6.2}s] {who:<8} {what}",
            self.start.elapsed().as_secs_f64()
        );
    }

    fn enter(&self) {
        if self.holding.fetch_add(1, Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self) {
        self.holding.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Story {
    cluster: LocalCluster,
    shared: Arc<Shared>,
    observer: Redlock,
    workers: JoinSet<()>,
    crash: Vec<CancellationToken>,
    stop: CancellationToken,
    wake: Arc<Notify>,
    killed_at: Option<Duration>,
    crashed: Option<usize>,
}

impl Story {
    fn new(cluster: LocalCluster, workers: usize) -> Result<Self, quorumlock::ConfigError> {
        let urls = cluster.urls();
        let client = || Redlock::builder(&urls).node_timeout(NODE_TIMEOUT).build();
        let shared = Arc::new(Shared {
            start: Instant::now(),
            store: FenceGate::new(),
            progress: watch::Sender::new(Progress::default()),
            holding: AtomicUsize::new(0),
            overlaps: AtomicUsize::new(0),
            crashed_at: Mutex::new(None),
        });
        let mut story = Story {
            observer: client()?,
            shared,
            workers: JoinSet::new(),
            crash: Vec::new(),
            stop: CancellationToken::new(),
            wake: Arc::new(Notify::new()),
            killed_at: None,
            crashed: None,
            cluster,
        };
        let s = &story.shared;
        s.say(
            "demo",
            format_args!(
                "started {NODES} redis-server processes; a lock needs a quorum of {}:",
                story.observer.quorum()
            ),
        );
        for (i, url) in urls.iter().enumerate() {
            out!("{:19}node {}  {url}", "", i + 1);
        }
        s.say(
            "demo",
            format_args!(
                "key {KEY:?}, ttl {}: a holder that stops extending loses the lock within {0}",
                humantime::format_duration(TTL)
            ),
        );
        for id in 0..workers {
            let crash = CancellationToken::new();
            story.crash.push(crash.clone());
            let worker = Worker {
                id,
                locks: client()?,
                shared: Arc::clone(&story.shared),
                crash,
                stop: story.stop.clone(),
                wake: Arc::clone(&story.wake),
            };
            story.workers.spawn(worker.run());
        }
        Ok(story)
    }

    /// The narrator: waits for the workers to reach each point, then acts.
    async fn tell(&mut self) -> Result<(), String> {
        let say = |what: &dyn Display| self.shared.say("demo", what);
        self.wait_for("three acquisitions", |p| p.acquisitions >= 3)
            .await?;

        let victim = self
            .cluster
            .get(VICTIM)
            .map(|s| s.url())
            .unwrap_or_default();
        self.cluster
            .kill(VICTIM)
            .map_err(|e| format!("cannot kill node {}: {e}", VICTIM + 1))?;
        self.killed_at = Some(self.shared.start.elapsed());
        say(&format_args!(
            ">>> killed node {} ({victim}) with SIGKILL: {} of {NODES} nodes left, still a quorum",
            VICTIM + 1,
            NODES - 1
        ));
        match self.observer.status(KEY).await {
            Ok(status) => out!("{}", indent(&render(&status)).trim_end()),
            Err(e) => say(&format_args!("status: {e}")),
        }

        let seen = self.progress(|p| p.acquisitions);
        self.wait_for("two more acquisitions", |p| p.acquisitions >= seen + 2)
            .await?;
        let seen = self.progress(|p| p.acquisitions);
        self.wait_for("a fresh holder", |p| p.acquisitions > seen)
            .await?;
        let holder = self.progress(|p| p.last_holder);
        self.crashed = Some(holder);
        say(&format_args!(
            ">>> freezing the holder, {} (simulated in this process, like a long GC pause): it \
             stops extending its lease and never releases, just as if it had crashed",
            NAMES[holder]
        ));
        self.crash[holder].cancel();

        self.wait_for("the handover", |p| p.handover.is_some())
            .await?;
        say(&format_args!(
            ">>> {} thaws, unaware that its lock expired, and writes with its old token",
            NAMES[holder]
        ));
        self.wake.notify_one();
        self.wait_for("the late write", |p| p.zombie.is_some())
            .await?;

        let seen = self.progress(|p| p.acquisitions);
        self.wait_for("one more turn", |p| p.acquisitions > seen)
            .await?;
        say(&">>> stopping the workers");
        Ok(())
    }

    fn progress<T>(&self, f: impl FnOnce(&Progress) -> T) -> T {
        f(&self.shared.progress.borrow())
    }

    async fn wait_for(
        &self,
        what: &str,
        done: impl FnMut(&Progress) -> bool,
    ) -> Result<(), String> {
        let mut rx = self.shared.progress.subscribe();
        match tokio::time::timeout(STEP_LIMIT, rx.wait_for(done)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(format!(
                "waited {} for {what}",
                humantime::format_duration(STEP_LIMIT)
            )),
        }
    }

    /// Stops the servers and removes their directories.
    fn clean_up(self) {
        drop(self.cluster);
        out!("Cleaned up: {NODES} redis-server processes stopped, their data directories removed.");
    }

    /// Stops every worker (a holder releases first), bounded.
    async fn stop(&mut self) {
        self.stop.cancel();
        let joined = tokio::time::timeout(STEP_LIMIT, async {
            while self.workers.join_next().await.is_some() {}
        })
        .await;
        if joined.is_err() {
            self.workers.abort_all();
        }
    }

    /// Prints what happened and checks it; 0 when every check held.
    fn summary(&self) -> u8 {
        let p = self.shared.progress.borrow();
        let overlaps = self.shared.overlaps.load(Ordering::SeqCst);
        let rising = p.tokens.windows(2).all(|w| w[0] < w[1]);
        let tokens = p
            .tokens
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" < ");
        out!();
        out!("What happened:");
        out!(
            "  {} acquisitions, fencing tokens {tokens}: {}",
            p.acquisitions,
            if rising {
                "each holder's token is greater than every earlier one"
            } else {
                "NOT strictly rising"
            }
        );
        out!(
            "  two holders at once: {}",
            if overlaps == 0 {
                "never".to_owned()
            } else {
                format!("{overlaps} times")
            }
        );
        if let Some(at) = self.killed_at {
            out!(
                "  node {} died at {}: the other {} nodes kept the lock working (quorum {})",
                VICTIM + 1,
                seconds(at),
                NODES - 1,
                self.observer.quorum()
            );
        }
        if let (Some(handover), Some(who)) = (p.handover, self.crashed) {
            out!(
                "  {} froze holding the lock; the next holder had it {} later \
                 (bounded by the {} ttl, as for a crashed holder; nobody had to clean up)",
                NAMES[who],
                seconds(handover),
                humantime::format_duration(TTL)
            );
        }
        let refused = matches!(p.zombie, Some(Err(_)));
        if let Some(verdict) = &p.zombie {
            out!(
                "  its late write was {}",
                match verdict {
                    Err(stale) => format!("refused by the store: {stale}"),
                    Ok(()) => "ACCEPTED: fencing failed".to_owned(),
                }
            );
        }
        if rising && overlaps == 0 && refused {
            0
        } else {
            report(&"the demo saw a safety violation (see above)");
            1
        }
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("{:10}{l}\n", "")).collect()
}

/// How a worker's turn with the lock ended.
enum Turn {
    Done,
    Stopped,
    Crashed,
    Lost,
}

struct Worker {
    id: usize,
    locks: Redlock,
    shared: Arc<Shared>,
    crash: CancellationToken,
    stop: CancellationToken,
    wake: Arc<Notify>,
}

impl Worker {
    fn say(&self, what: impl Display) {
        self.shared.say(NAMES[self.id], what);
    }

    async fn run(self) {
        // The workers start a moment apart, as processes on different hosts do.
        tokio::select! {
            () = tokio::time::sleep(STAGGER * u32::try_from(self.id).unwrap_or(0)) => {}
            () = self.stop.cancelled() => return,
        }
        let mut told_waiting = false;
        loop {
            let attempt = async {
                match self.locks.try_acquire(KEY, TTL).await {
                    Err(e) if e.is_held() => {
                        if !told_waiting {
                            self.say("waiting   the lock is held by another owner");
                            told_waiting = true;
                        }
                        self.locks.acquire_timeout(KEY, TTL, STEP_LIMIT).await
                    }
                    other => other,
                }
            };
            let acquired = tokio::select! {
                r = attempt => r,
                () = self.stop.cancelled() => return,
            };
            let lock = match acquired {
                Ok(lock) => lock,
                Err(e) if e.is_held() => continue,
                Err(e) => {
                    self.say(format_args!("cannot acquire: {e}"));
                    if !self.rest().await {
                        return;
                    }
                    continue;
                }
            };
            match self.hold(&lock).await {
                Turn::Done => {
                    self.shared.leave();
                    match lock.release().await {
                        Ok(()) => {
                            self.say(format_args!("released  after {} of work", seconds(WORK)))
                        }
                        Err(e) => self.say(format_args!("release failed: {e}")),
                    }
                }
                Turn::Stopped => {
                    self.shared.leave();
                    let _ = lock.release().await;
                    return;
                }
                Turn::Crashed => {
                    self.shared.leave();
                    *self
                        .shared
                        .crashed_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    let token = lock.token();
                    lock.forget();
                    self.say("frozen    no more extensions, no release: its keys stay until the ttl ends");
                    self.zombie(token).await;
                    return;
                }
                Turn::Lost => {
                    self.shared.leave();
                    self.say(format_args!(
                        "lost it   {}; stops working",
                        lock.lost_reason()
                            .map_or_else(|| "validity ran out".to_owned(), |r| r.to_string())
                    ));
                }
            }
            if !self.rest().await {
                return;
            }
        }
    }

    /// Works under the lock until done, stopped, crashed or lost.
    async fn hold(&self, lock: &Lock) -> Turn {
        lock.keep_alive();
        self.shared.enter();
        let token = lock.token();
        let handover = self
            .shared
            .crashed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .map(|at| at.elapsed());
        let mut line = format!(
            "acquired  token {token}, valid for {}",
            seconds(lock.validity())
        );
        if let Some(h) = handover {
            line.push_str(&format!("; handover {} after the freeze", seconds(h)));
        }
        // The work: a write to the store, stamped with the token.
        if let Err(stale) = self.shared.store.admit(token) {
            line.push_str(&format!("; its write was REFUSED: {stale}"));
        }
        self.say(line);
        self.shared.progress.send_modify(|p| {
            p.acquisitions += 1;
            p.last_holder = self.id;
            p.tokens.push(token.get());
            if handover.is_some() {
                p.handover = handover;
            }
        });
        tokio::select! {
            () = tokio::time::sleep(WORK) => Turn::Done,
            () = self.stop.cancelled() => Turn::Stopped,
            () = self.crash.cancelled() => Turn::Crashed,
            () = lock.lost() => Turn::Lost,
        }
    }

    /// After freezing: thaws when told and tries to write with the old token.
    async fn zombie(&self, token: FencingToken) {
        tokio::select! {
            () = self.wake.notified() => {}
            () = self.stop.cancelled() => return,
        }
        if self.stop.is_cancelled() {
            return;
        }
        let verdict = self.shared.store.admit(token);
        match &verdict {
            Err(stale) => self.say(format_args!("refused   {stale}")),
            Ok(()) => self.say(format_args!("ACCEPTED  its write with token {token}")),
        }
        self.shared
            .progress
            .send_modify(|p| p.zombie = Some(verdict));
    }

    /// Pauses between turns; false when the demo is stopping.
    async fn rest(&self) -> bool {
        tokio::select! {
            () = tokio::time::sleep(REST) => true,
            () = self.stop.cancelled() => false,
        }
    }
}
