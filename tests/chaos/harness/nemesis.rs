//! The nemesis: the faults, injected one at a time, healed, and each recorded in the history.
//! `draw.rs` draws them from a seeded random generator.
//!
//! The schedule (which fault, on which nodes and links, for how long, with which pauses between)
//! depends only on the seed, so a seed replays the same schedule. Timing on a shared machine
//! does not replay exactly: what the clients were doing when a fault hit can differ.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::testkit::LocalCluster;

use crate::child::ChildClient;
use crate::history::{ClockJump as ClockJumpRecord, Fault as FaultRecord, Mono, Recorder};
use crate::proxy::ProxyNet;

/// The kinds of fault a scenario lets the nemesis draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGKILL 1..=minority nodes, keep them down for 1.2..2 ttl, restart them empty.
    KillMinorityDelayed,
    /// SIGKILL 1..=minority nodes and restart them at once (empty without AOF).
    KillMinority,
    /// SIGKILL a majority and restart it at once (empty without AOF).
    KillMajority,
    /// SIGSTOP 1..=quorum nodes for 0.2..2 ttl, then SIGCONT.
    PauseNodes,
    /// Exactly a quorum reachable for 2..4 ttl: a minority of nodes (`n - quorum`) SIGSTOPped,
    /// the clients contending on what is left (issue 16: no starvation there).
    QuorumOnly,
    /// 20..250 ms added each way on random links for 0.5..2 ttl.
    Latency,
    /// Bytes stop flowing on whole nodes or random links for 0.2..2 ttl.
    Blackhole,
    /// Every connection to 1..=n nodes reset (RST), 1..=3 times.
    Reset,
    /// Each client sees its own set of nodes (usually a majority, not the same one).
    ClientPartition,
    /// One client is cut from a minority; a node of the bare majority it still sees has its
    /// clock jump forward by 1..2 ttl (simulated, see `jump_clock`), as soon as that client
    /// holds the lock there (or at half time).
    ClockJump,
    /// SIGSTOP the child client for 0.3..2.5 ttl.
    PauseClient,
    /// A foreign owner's key (a crashed holder's) on 1..=minority nodes and just enough other
    /// nodes SIGSTOPped that no quorum is possible, for 2.5..4 ttl: refusals mixed with
    /// failures, neither alone enough to rule a quorum out. Every acquisition during it must fail
    /// as `NoQuorum`, never `Held` (issue 12 item 6).
    StaleKeys,
}

/// One fault, drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    Kill {
        nodes: Vec<usize>,
        down: Duration,
    },
    PauseNodes {
        nodes: Vec<usize>,
        hold: Duration,
    },
    Latency {
        links: Vec<(usize, usize)>,
        delay: Duration,
        hold: Duration,
    },
    Blackhole {
        links: Vec<(usize, usize)>,
        hold: Duration,
    },
    Reset {
        nodes: Vec<usize>,
        times: u32,
        every: Duration,
    },
    Partition {
        views: Vec<Vec<usize>>,
        hold: Duration,
    },
    ClockJump {
        client: usize,
        cut: Vec<usize>,
        node: usize,
        jump: Duration,
        hold: Duration,
    },
    PauseClient {
        hold: Duration,
    },
    StaleKeys {
        stale: Vec<usize>,
        paused: Vec<usize>,
        hold: Duration,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill { nodes, down } => {
                write!(f, "kill nodes {nodes:?}, restart after {down:?}")
            }
            Fault::PauseNodes { nodes, hold } => write!(f, "SIGSTOP nodes {nodes:?} for {hold:?}"),
            Fault::Latency { links, delay, hold } => {
                write!(
                    f,
                    "+{delay:?} on (client, node) links {links:?} for {hold:?}"
                )
            }
            Fault::Blackhole { links, hold } => {
                write!(f, "blackhole (client, node) links {links:?} for {hold:?}")
            }
            Fault::Reset {
                nodes,
                times,
                every,
            } => write!(
                f,
                "reset connections to nodes {nodes:?} {times}x every {every:?}"
            ),
            Fault::Partition { views, hold } => {
                write!(f, "client views {views:?} for {hold:?}")
            }
            Fault::ClockJump {
                client,
                cut,
                node,
                jump,
                hold,
            } => write!(
                f,
                "client {client} cut from {cut:?}; node {node} clock +{jump:?} midway; {hold:?}"
            ),
            Fault::PauseClient { hold } => write!(f, "SIGSTOP the child client for {hold:?}"),
            Fault::StaleKeys {
                stale,
                paused,
                hold,
            } => write!(
                f,
                "foreign key on nodes {stale:?}, SIGSTOP nodes {paused:?}, for {hold:?}"
            ),
        }
    }
}

impl Fault {
    /// How far into the fault the lock must be acquirable again, if at all: the nodes some
    /// client cannot use (`cut`: killed, paused, or behind a faulted link).
    ///
    /// - Every client keeps a majority, and all of them together lose at most a minority
    ///   (kills and pauses of a minority, link faults on the same minority for everyone, a
    ///   clock jump's cut): a holder's leftover keys sit on that minority only, so the others
    ///   can acquire at once. `Some(0)`.
    /// - Some client keeps a majority, but the clients lose different nodes (per-client
    ///   partitions, random links): a holder cut from a majority cannot release there, and its
    ///   keys may block the rest until they expire. `Some(ttl)`.
    /// - No client keeps a majority, or the fault is instantaneous (resets) or freezes a holder
    ///   (a paused client keeps the lock until it expires): `None`.
    pub fn available_after(&self, nodes: usize, clients: usize, ttl: Duration) -> Option<Duration> {
        let quorum = nodes / 2 + 1;
        let cut: Vec<Vec<usize>> = match self {
            Fault::Kill { nodes: ks, down } if !down.is_zero() => vec![ks.clone(); clients],
            Fault::PauseNodes { nodes: ps, .. } => vec![ps.clone(); clients],
            Fault::Latency { links, .. } | Fault::Blackhole { links, .. } => (0..clients)
                .map(|c| {
                    links
                        .iter()
                        .filter(|&&(lc, _)| lc == c)
                        .map(|&(_, n)| n)
                        .collect()
                })
                .collect(),
            Fault::Partition { views, .. } => views
                .iter()
                .map(|v| (0..nodes).filter(|n| !v.contains(n)).collect())
                .collect(),
            Fault::ClockJump { client, cut, .. } => (0..clients)
                .map(|c| {
                    if c == *client {
                        cut.clone()
                    } else {
                        Vec::new()
                    }
                })
                .collect(),
            Fault::Kill { .. }
            | Fault::Reset { .. }
            | Fault::PauseClient { .. }
            | Fault::StaleKeys { .. } => return None,
        };
        let mut union: Vec<usize> = cut.iter().flatten().copied().collect();
        union.sort_unstable();
        union.dedup();
        if union.len() < quorum {
            Some(Duration::ZERO)
        } else if cut.iter().any(|c| c.len() < quorum) {
            Some(ttl)
        } else {
            None
        }
    }

    /// How long the fault lasts (nominally).
    pub fn hold(&self) -> Duration {
        match self {
            Fault::Kill { down, .. } => *down,
            Fault::Reset { times, every, .. } => *every * *times,
            Fault::PauseNodes { hold, .. }
            | Fault::Latency { hold, .. }
            | Fault::Blackhole { hold, .. }
            | Fault::Partition { hold, .. }
            | Fault::ClockJump { hold, .. }
            | Fault::PauseClient { hold }
            | Fault::StaleKeys { hold, .. } => *hold,
        }
    }
}

/// What the nemesis acts on.
pub struct Env {
    pub cluster: Arc<Mutex<LocalCluster>>,
    /// Direct node URLs (for the simulated clock jump).
    pub urls: Vec<String>,
    pub net: ProxyNet,
    pub child: Option<ChildClient>,
    /// Nodes persist with `appendfsync always`: a restart keeps their data.
    pub aof: bool,
    /// The clients' restart guard holds a restarted node out (for the max ttl, then until its
    /// counters are restored).
    pub guard_holds_out: bool,
    pub ttl: Duration,
    /// Until when nodes restarted by an earlier fault may still be held out.
    pub held_out_until: Mono,
}

/// How long after a restart's hold-out (the max ttl) a node may still be out: reconnecting and
/// restoring its counters.
const HOLD_OUT_MARGIN: Duration = Duration::from_secs(1);
/// How long the nemesis may take to reach a node directly (clock jumps).
const DIRECT_CONNECT: Duration = Duration::from_secs(2);
/// The foreign owner's value `StaleKeys` writes.
const STALE_VALUE: &str = "nemesis-stale-holder";
/// How often the targeted clock jump looks for a bare-majority holder.
const HOLDER_POLL: Duration = Duration::from_millis(15);

impl Env {
    async fn nodes(&self, what: impl FnOnce(&mut LocalCluster) + Send + 'static) {
        let cluster = Arc::clone(&self.cluster);
        tokio::task::spawn_blocking(move || what(&mut cluster.lock().unwrap()))
            .await
            .expect("cluster operation");
    }
}

/// Injects `fault`, waits, heals it, and records it. Returns when it healed.
pub async fn inject(env: &mut Env, fault: &Fault, rec: &Recorder) -> Mono {
    tracing::info!("--- nemesis: {fault}");
    let start = Mono::now();
    // Nodes still held out after an earlier restart count as lost too: no promise then.
    let available_after = fault
        .available_after(env.urls.len(), env.net.clients(), env.ttl)
        .filter(|_| start >= env.held_out_until);
    match fault {
        Fault::Kill { nodes, down } => kill_and_restart(env, nodes, *down).await,
        Fault::PauseNodes { nodes, hold } => {
            let ns = nodes.clone();
            env.nodes(move |c| ns.iter().for_each(|&n| c.pause(n).unwrap()))
                .await;
            tokio::time::sleep(*hold).await;
            let ns = nodes.clone();
            env.nodes(move |c| ns.iter().for_each(|&n| c.resume(n).unwrap()))
                .await;
        }
        Fault::Latency { links, delay, hold } => {
            for &(c, n) in links {
                env.net.link(c, n).set_latency(*delay);
            }
            tokio::time::sleep(*hold).await;
            env.net.heal();
        }
        Fault::Blackhole { links, hold } => {
            for &(c, n) in links {
                env.net.link(c, n).set_blackhole(true);
            }
            tokio::time::sleep(*hold).await;
            env.net.heal();
        }
        Fault::Reset {
            nodes,
            times,
            every,
        } => {
            for _ in 0..*times {
                for &n in nodes {
                    env.net.to_node(n).for_each(|p| p.reset());
                }
                tokio::time::sleep(*every).await;
            }
        }
        Fault::Partition { views, hold } => {
            for (c, view) in views.iter().enumerate() {
                env.net.partition(c, view);
            }
            tokio::time::sleep(*hold).await;
            env.net.heal();
        }
        Fault::ClockJump {
            client,
            cut,
            node,
            jump,
            hold,
        } => jump_a_clock(env, rec, *client, cut, *node, *jump, *hold).await,
        Fault::PauseClient { hold } => {
            let child = env.child.as_mut().expect("a child client to pause");
            child.pause();
            tokio::time::sleep(*hold).await;
            child.resume();
        }
        Fault::StaleKeys {
            stale,
            paused,
            hold,
        } => stale_keys(env, rec, stale, paused, *hold).await,
    }
    let healed = Mono::now();
    rec.fault(FaultRecord {
        what: fault.to_string(),
        start,
        healed,
        available_after,
    });
    healed
}

/// Kills `nodes`, waits `down`, restarts them (from AOF, or empty); the guard then holds them
/// out for a while.
async fn kill_and_restart(env: &mut Env, nodes: &[usize], down: Duration) {
    let ns = nodes.to_vec();
    env.nodes(move |c| ns.iter().for_each(|&n| c.kill(n).unwrap()))
        .await;
    tokio::time::sleep(down).await;
    let (ns, aof) = (nodes.to_vec(), env.aof);
    env.nodes(move |c| {
        for &n in &ns {
            if aof {
                c.restart(n)
            } else {
                c.restart_empty(n)
            }
            .unwrap_or_else(|e| panic!("restart node {n}: {e}"));
        }
    })
    .await;
    if env.guard_holds_out {
        env.held_out_until = Mono::now() + env.ttl + HOLD_OUT_MARGIN;
    }
}

/// Cuts `client` off the `cut` nodes, then steps `node`'s clock by `jump`: as soon as the cut
/// client holds the lock on its bare majority, or at half of `hold` anyway (the history says
/// which); heals at `hold`.
async fn jump_a_clock(
    env: &mut Env,
    rec: &Recorder,
    client: usize,
    cut: &[usize],
    node: usize,
    jump: Duration,
    hold: Duration,
) {
    for &n in cut {
        env.net.link(client, n).set_blackhole(true);
    }
    // Targeted: jump as soon as the cut client holds the lock on its bare majority (a
    // value on `node` that no cut node has), or at half time anyway; which one it was
    // goes into the history.
    let mut conns = connect_all(&env.urls).await;
    let holder = tokio::time::timeout(hold / 2, async {
        loop {
            if let Some(value) = bare_majority_holder(&mut conns, cut, node).await {
                return value;
            }
            tokio::time::sleep(HOLDER_POLL).await;
        }
    })
    .await
    .ok();
    let at = Mono::now();
    let (keys, hit_holder) = jump_clock(&env.urls[node], jump, holder.as_deref()).await;
    if holder.is_none() {
        tracing::info!(
            "nemesis: no bare-majority holder within {:?}; node {node} jumped anyway",
            hold / 2
        );
    }
    rec.clock_jump(ClockJumpRecord {
        node,
        at,
        targeted: holder.is_some(),
        hit_holder,
        keys,
    });
    tokio::time::sleep(hold / 2).await;
    env.net.heal();
}

/// A foreign value on the `stale` nodes and the `paused` ones stopped, for `hold`: together
/// (not apart) they put a quorum out of reach; then the foreign values are deleted.
async fn stale_keys(
    env: &mut Env,
    rec: &Recorder,
    stale: &[usize],
    paused: &[usize],
    hold: Duration,
) {
    let key = crate::support::lock_key(crate::workload::KEY);
    // Overwrites whatever is there: a holder's key on those nodes is lost, as after a
    // crash and a foreign write; the clients must cope either way.
    let mut set = redis::cmd("SET");
    set.arg(&key)
        .arg(STALE_VALUE)
        .arg("PX")
        .arg(hold.as_millis() as u64 + 1);
    for &n in stale {
        let mut conn = connect(&env.urls[n]).await;
        let _: () = tokio::time::timeout(DIRECT_CONNECT, set.query_async(&mut conn))
            .await
            .expect("nemesis: SET within the bound")
            .expect("nemesis: SET");
    }
    let ns = paused.to_vec();
    env.nodes(move |c| ns.iter().for_each(|&n| c.pause(n).unwrap()))
        .await;
    // An acquisition reports its last round, which takes at most a call bound: one
    // that ends a call bound after both are in place, and before the heal, made its
    // last round in the fault.
    let judged_from = Mono::now() + crate::workload::call_bound();
    tokio::time::sleep(hold).await;
    rec.held_impossible(judged_from, Mono::now());
    let ns = paused.to_vec();
    env.nodes(move |c| ns.iter().for_each(|&n| c.resume(n).unwrap()))
        .await;
    let script = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end",
    );
    let mut del = script.key(&key);
    del.arg(STALE_VALUE);
    for &n in stale {
        let mut conn = connect(&env.urls[n]).await;
        let _: () = tokio::time::timeout(DIRECT_CONNECT, del.invoke_async(&mut conn))
            .await
            .expect("nemesis: DEL within the bound")
            .expect("nemesis: DEL");
    }
}

/// The lock value on `node` if none of the `cut` nodes has it: a holder that could not reach
/// them and counts on `node` for its majority. `conns` are direct connections to every node.
async fn bare_majority_holder(
    conns: &mut [redis::aio::MultiplexedConnection],
    cut: &[usize],
    node: usize,
) -> Option<String> {
    let key = crate::support::lock_key(crate::workload::KEY);
    let mut get = redis::cmd("GET");
    get.arg(&key);
    let held = get
        .query_async::<Option<String>>(&mut conns[node])
        .await
        .ok()
        .flatten()?;
    for &n in cut {
        if get
            .query_async::<Option<String>>(&mut conns[n])
            .await
            .ok()
            .flatten()
            .as_ref()
            == Some(&held)
        {
            return None;
        }
    }
    Some(held)
}

/// A direct connection to a node, bounded by [`DIRECT_CONNECT`].
async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("node url");
    tokio::time::timeout(
        DIRECT_CONNECT,
        client.get_multiplexed_async_connection_with_config(&crate::support::direct_config()),
    )
    .await
    .unwrap_or_else(|_| panic!("nemesis: no connection to {url} within {DIRECT_CONNECT:?}"))
    .unwrap_or_else(|e| panic!("nemesis: connect to {url}: {e}"))
}

async fn connect_all(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
    futures::future::join_all(urls.iter().map(|u| connect(u))).await
}

/// A forward clock jump of `jump` on one node, simulated: every key's remaining time to live
/// there is cut by `jump` (deleted when less is left), which is what Redis does to keys when its
/// wall clock jumps, since it stores expiries as absolute wall-clock times. Returns how many
/// keys it cut, and whether the lock key held `holder` (when given) at the jump.
///
/// The server's own clock does not move, so no reading of its `TIME` shows the jump: the
/// chaos runs keep the case the client's clock-jump check cannot see. A real step
/// (libfaketime, with glibc's `libc_malloc_debug.so.0` preloaded first so that Debian's
/// jemalloc-linked `redis-server` starts under it) is `tests/safety/s17_clock_jump.rs`.
pub async fn jump_clock(url: &str, jump: Duration, holder: Option<&str>) -> (u64, bool) {
    let script = redis::Script::new(
        r"
local hit = 0
if ARGV[2] ~= '' and redis.call('GET', KEYS[1]) == ARGV[2] then hit = 1 end
local n = 0
local jump = tonumber(ARGV[1])
for _, k in ipairs(redis.call('KEYS', '*')) do
  local t = redis.call('PTTL', k)
  if t > 0 then
    if t <= jump then redis.call('DEL', k) else redis.call('PEXPIRE', k, t - jump) end
    n = n + 1
  end
end
return {n, hit}
",
    );
    let mut conn = connect(url).await;
    let mut call = script.key(crate::support::lock_key(crate::workload::KEY));
    call.arg(jump.as_millis() as u64).arg(holder.unwrap_or(""));
    let (n, hit): (u64, u64) = tokio::time::timeout(DIRECT_CONNECT, call.invoke_async(&mut conn))
        .await
        .unwrap_or_else(|_| {
            panic!("nemesis: clock jump script on {url} took over {DIRECT_CONNECT:?}")
        })
        .expect("clock jump script");
    (n, hit == 1)
}
