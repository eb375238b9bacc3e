//! Leader election with handover, done with a real quorum.
//!
//! As one candidate among several (run it in two or three terminals against the same nodes,
//! then kill the leader with Ctrl-C, which resigns, or with `kill -9`, which does not):
//!
//! ```text
//! REDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example leader --features testkit
//! ```
//!
//! Without `REDLOCK_NODES` it starts its own local 5-node cluster and three candidate processes
//! (this same program), then alternately crashes the leader (SIGKILL) and asks it to resign
//! (SIGTERM), measures each handover, prints the figures next to the ttl and exits.
//!
//! Environment: `LEADER_ID` (candidate id), `LEADER_TTL_MS` (term ttl, default 3000),
//! `LEADER_ROUNDS` (handovers in the self-contained demo, default 4).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Election, Observation, Redlock};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let ttl = Duration::from_millis(env_or("LEADER_TTL_MS", 3000));
    match std::env::var("REDLOCK_NODES") {
        Ok(nodes) => candidate(&nodes, ttl).await,
        Err(_) => demo(ttl).await,
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One candidate: campaign, lead (printing a heartbeat) until the term is lost or a signal
/// arrives; SIGINT/SIGTERM resign at once and exit.
async fn candidate(nodes: &str, ttl: Duration) -> Result<(), Failure> {
    let locks = Redlock::builder(nodes.split(',')).build()?;
    let mut builder = Election::builder(locks, "leader-demo").ttl(ttl);
    if let Ok(id) = std::env::var("LEADER_ID") {
        builder = builder.candidate(id);
    }
    let election = builder.build()?;
    let id = election.candidate().to_owned();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;

    // Anyone can watch the election; here each candidate prints what it sees.
    let watcher = election.clone();
    let watch_id = id.clone();
    tokio::spawn(async move {
        let mut changes = Box::pin(watcher.observe());
        while let Some(change) = changes.next().await {
            match change {
                Observation::Leader(l) => println!(
                    "[{watch_id}] observed: {} leads since token {}",
                    l.candidate.as_deref().unwrap_or("?"),
                    l.token
                ),
                Observation::Vacant => println!("[{watch_id}] observed: nobody leads"),
                Observation::Unknown(e) => println!("[{watch_id}] observed: unknown ({e})"),
                _ => {}
            }
        }
    });

    loop {
        println!("[{id}] campaigning (standby)");
        let leadership = tokio::select! {
            l = election.campaign() => l?,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        println!("LEADING [{id}] with token {}", leadership.token());
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = leadership.lost() => {
                    println!("[{id}] lost leadership: {:?}", leadership.lost_reason());
                    break;
                }
                _ = term.recv() => {
                    leadership.resign().await?;
                    println!("[{id}] resigned");
                    return Ok(());
                }
                _ = int.recv() => {
                    leadership.resign().await?;
                    println!("[{id}] resigned");
                    return Ok(());
                }
                _ = beat.tick() => println!("[{id}] leading, writes stamped with token {}", leadership.token()),
            }
        }
    }
}

/// Kills every child on exit, so the demo never leaves processes behind.
struct Candidates {
    children: HashMap<usize, Child>,
    urls: String,
    ttl: Duration,
    lines: mpsc::UnboundedSender<(usize, String, Instant)>,
}

impl Candidates {
    fn spawn(&mut self, i: usize) -> Result<(), Failure> {
        let mut child = Command::new(std::env::current_exe()?)
            .env("REDLOCK_NODES", &self.urls)
            .env("LEADER_ID", format!("cand-{i}"))
            .env("LEADER_TTL_MS", self.ttl.as_millis().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = self.lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((i, line, Instant::now())).is_err() {
                    break;
                }
            }
        });
        self.children.insert(i, child);
        Ok(())
    }

    fn signal(&mut self, i: usize, sig: nix::sys::signal::Signal) -> Result<(), Failure> {
        let child = self.children.get(&i).ok_or("no such candidate")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
        nix::sys::signal::kill(pid, sig)?;
        Ok(())
    }

    fn reap(&mut self, i: usize) {
        if let Some(mut child) = self.children.remove(&i) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Candidates {
    fn drop(&mut self) {
        let all: Vec<usize> = self.children.keys().copied().collect();
        for i in all {
            self.reap(i);
        }
    }
}

/// Waits for the next "LEADING" line from any candidate, printing every line meanwhile.
async fn next_leader(
    lines: &mut mpsc::UnboundedReceiver<(usize, String, Instant)>,
    within: Duration,
) -> Result<(usize, Instant), Failure> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (i, line, at) = tokio::time::timeout_at(deadline, lines.recv())
            .await
            .map_err(|_| "no leader within the wait")?
            .ok_or("candidates gone")?;
        println!("  cand-{i} | {line}");
        if line.starts_with("LEADING ") {
            return Ok((i, at));
        }
    }
}

async fn demo(ttl: Duration) -> Result<(), Failure> {
    let rounds = env_or("LEADER_ROUNDS", 4);
    let cluster = LocalCluster::start(5)?;
    println!("started 5 local redis-server nodes; 3 candidates, term ttl {ttl:?}\n");
    let (tx, mut lines) = mpsc::unbounded_channel();
    let mut candidates = Candidates {
        children: HashMap::new(),
        urls: cluster.urls().join(","),
        ttl,
        lines: tx,
    };
    for i in 0..3 {
        candidates.spawn(i)?;
    }
    let wait = ttl * 3 + Duration::from_secs(10);
    let (mut leader, _) = next_leader(&mut lines, wait).await?;
    let (mut crash, mut resign) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Let the new leader settle (and the standbys go back to waiting) before the next blow,
        // which lands at a random point of the leader's extension cycle (every ttl / 3).
        let settle = Duration::from_secs(1) + (ttl / 3).mul_f64(rand::random::<f64>());
        tokio::time::sleep(settle).await;
        let crashing = round % 2 == 0;
        let sig = if crashing {
            println!("\n--- kill -9 cand-{leader} (crash: no release, no notification)");
            nix::sys::signal::Signal::SIGKILL
        } else {
            println!("\n--- kill -TERM cand-{leader} (resigns at once)");
            nix::sys::signal::Signal::SIGTERM
        };
        let sent = Instant::now();
        candidates.signal(leader, sig)?;
        let (next, at) = next_leader(&mut lines, wait).await?;
        let handover = at.duration_since(sent);
        println!("--- cand-{next} leads {handover:?} after the signal (ttl {ttl:?})");
        if crashing {
            crash.push(handover);
        } else {
            resign.push(handover);
        }
        candidates.reap(leader);
        candidates.spawn(leader)?; // back as a standby
        leader = next;
    }
    println!("\nhandover times with a {ttl:?} ttl (3 candidates, 5 local nodes):");
    summary("after resign (SIGTERM)", &mut resign);
    summary("after crash (SIGKILL)", &mut crash);
    Ok(())
}

fn summary(what: &str, times: &mut [Duration]) {
    if times.is_empty() {
        return;
    }
    times.sort();
    println!(
        "  {what:<24} n={} min {:?} median {:?} max {:?}",
        times.len(),
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
