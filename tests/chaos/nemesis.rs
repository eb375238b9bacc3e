//! The nemesis: draws faults from a seeded random generator, injects them one at a time,
//! heals them, and records each in the history.
//!
//! The schedule (which fault, on which nodes and links, for how long, with which pauses between)
//! depends only on the seed, so a seed replays the same schedule. Timing on a shared machine
//! does not replay exactly: what the clients were doing when a fault hit can differ.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use crate::child::ChildClient;
use crate::history::{Fault as FaultRecord, Mono, Recorder};
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
        }
    }
}

impl Fault {
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
            | Fault::PauseClient { hold } => *hold,
        }
    }
}

fn some_of(rng: &mut StdRng, n: usize, k: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    all.shuffle(rng);
    all.truncate(k);
    all.sort_unstable();
    all
}

fn ttls(rng: &mut StdRng, ttl: Duration, lo: f64, hi: f64) -> Duration {
    ttl.mul_f64(rng.random_range(lo..hi))
}

/// Draws one fault of `kind` for `nodes` nodes and `clients` in-process clients.
pub fn draw(
    kind: FaultKind,
    rng: &mut StdRng,
    nodes: usize,
    clients: usize,
    ttl: Duration,
) -> Fault {
    let quorum = nodes / 2 + 1;
    let minority = nodes - quorum;
    let all_links = |ns: &[usize]| -> Vec<(usize, usize)> {
        (0..clients)
            .flat_map(|c| ns.iter().map(move |&n| (c, n)))
            .collect()
    };
    match kind {
        FaultKind::KillMinorityDelayed | FaultKind::KillMinority => {
            let k = rng.random_range(1..=minority);
            let nodes = some_of(rng, nodes, k);
            let down = if kind == FaultKind::KillMinorityDelayed {
                ttls(rng, ttl, 1.2, 2.0)
            } else {
                Duration::ZERO
            };
            Fault::Kill { nodes, down }
        }
        FaultKind::KillMajority => Fault::Kill {
            nodes: some_of(rng, nodes, quorum),
            down: Duration::ZERO,
        },
        FaultKind::PauseNodes => {
            let k = rng.random_range(1..=quorum);
            Fault::PauseNodes {
                nodes: some_of(rng, nodes, k),
                hold: ttls(rng, ttl, 0.2, 2.0),
            }
        }
        FaultKind::Latency => {
            let k = rng.random_range(1..=nodes);
            let mut links = all_links(&some_of(rng, nodes, k));
            if rng.random_bool(0.5) {
                links.retain(|_| rng.random_bool(0.5));
            }
            Fault::Latency {
                links,
                delay: Duration::from_millis(rng.random_range(20..=250)),
                hold: ttls(rng, ttl, 0.5, 2.0),
            }
        }
        FaultKind::Blackhole => {
            let links = if rng.random_bool(0.5) {
                let k = rng.random_range(1..=quorum);
                all_links(&some_of(rng, nodes, k))
            } else {
                let mut l = all_links(&(0..nodes).collect::<Vec<_>>());
                l.retain(|_| rng.random_bool(0.3));
                l
            };
            Fault::Blackhole {
                links,
                hold: ttls(rng, ttl, 0.2, 2.0),
            }
        }
        FaultKind::Reset => {
            let k = rng.random_range(1..=nodes);
            Fault::Reset {
                nodes: some_of(rng, nodes, k),
                times: rng.random_range(1..=3),
                every: ttls(rng, ttl, 0.05, 0.5),
            }
        }
        FaultKind::ClientPartition => {
            let views = (0..clients)
                .map(|_| {
                    let k = if rng.random_bool(0.8) {
                        rng.random_range(quorum..=nodes)
                    } else {
                        rng.random_range(1..quorum)
                    };
                    some_of(rng, nodes, k)
                })
                .collect();
            Fault::Partition {
                views,
                hold: ttls(rng, ttl, 0.5, 2.5),
            }
        }
        FaultKind::ClockJump => {
            let client = rng.random_range(0..clients);
            let cut = some_of(rng, nodes, minority);
            let rest: Vec<usize> = (0..nodes).filter(|n| !cut.contains(n)).collect();
            Fault::ClockJump {
                client,
                node: *rest.choose(rng).expect("a majority is left"),
                cut,
                jump: ttls(rng, ttl, 1.0, 2.0),
                hold: ttls(rng, ttl, 1.0, 2.0),
            }
        }
        FaultKind::PauseClient => Fault::PauseClient {
            hold: ttls(rng, ttl, 0.3, 2.5),
        },
    }
}

/// The whole schedule for a run of about `duration`: (pause before, fault) pairs.
pub fn schedule(
    seed: u64,
    kinds: &[FaultKind],
    duration: Duration,
    nodes: usize,
    clients: usize,
    ttl: Duration,
) -> Vec<(Duration, Fault)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    let mut total = Duration::ZERO;
    while !kinds.is_empty() && total < duration {
        let gap = ttls(&mut rng, ttl, 0.3, 1.5);
        let kind = *kinds.choose(&mut rng).expect("at least one fault kind");
        let fault = draw(kind, &mut rng, nodes, clients, ttl);
        total += gap + fault.hold();
        plan.push((gap, fault));
    }
    plan
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
}

impl Env {
    async fn nodes(&self, what: impl FnOnce(&mut LocalCluster) + Send + 'static) {
        let cluster = Arc::clone(&self.cluster);
        tokio::task::spawn_blocking(move || what(&mut cluster.lock().unwrap()))
            .await
            .expect("cluster operation");
    }
}

/// Injects `fault`, waits, heals it, and records it.
pub async fn inject(env: &mut Env, fault: &Fault, rec: &Recorder) {
    tracing::info!("--- nemesis: {fault}");
    let start = Mono::now();
    match fault {
        Fault::Kill { nodes, down } => {
            let ns = nodes.clone();
            env.nodes(move |c| ns.iter().for_each(|&n| c.kill(n).unwrap()))
                .await;
            tokio::time::sleep(*down).await;
            let (ns, aof) = (nodes.clone(), env.aof);
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
        }
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
        } => {
            for &n in cut {
                env.net.link(*client, n).set_blackhole(true);
            }
            // Targeted: jump as soon as the cut client holds the lock on its bare majority (a
            // value on `node` that no cut node has), or at half time anyway.
            let mut conns = connect_all(&env.urls).await;
            let _ = tokio::time::timeout(*hold / 2, async {
                while !bare_majority_holder(&mut conns, cut, *node).await {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
            jump_clock(&env.urls[*node], *jump).await;
            tokio::time::sleep(*hold / 2).await;
            env.net.heal();
        }
        Fault::PauseClient { hold } => {
            let child = env.child.as_mut().expect("a child client to pause");
            child.pause();
            tokio::time::sleep(*hold).await;
            child.resume();
        }
    }
    rec.fault(FaultRecord {
        what: fault.to_string(),
        start,
        healed: Mono::now(),
    });
}

/// Whether `node` holds a lock value that none of the `cut` nodes has: a holder that could not
/// reach them and counts on `node` for its majority. `conns` are direct connections to every node.
async fn bare_majority_holder(
    conns: &mut [redis::aio::MultiplexedConnection],
    cut: &[usize],
    node: usize,
) -> bool {
    let key = crate::support::lock_key(crate::workload::KEY);
    let mut get = redis::cmd("GET");
    get.arg(&key);
    let Ok(Some(held)) = get.query_async::<Option<String>>(&mut conns[node]).await else {
        return false;
    };
    for &n in cut {
        if get
            .query_async::<Option<String>>(&mut conns[n])
            .await
            .ok()
            .flatten()
            == Some(held.clone())
        {
            return false;
        }
    }
    true
}

async fn connect_all(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut conns = Vec::with_capacity(urls.len());
    for url in urls {
        let client = redis::Client::open(url.as_str()).expect("node url");
        conns.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect to a node directly"),
        );
    }
    conns
}

/// A forward clock jump of `jump` on one node, simulated: every key's remaining time to live
/// there is cut by `jump` (deleted when less is left), which is what Redis does to keys when its
/// wall clock jumps, since it stores expiries as absolute wall-clock times.
///
/// Real clock jumps with libfaketime do not work here: Debian's `redis-server` is linked with
/// jemalloc, which libfaketime cannot initialise under (libfaketime issue #130); the server
/// hangs at start.
pub async fn jump_clock(url: &str, jump: Duration) -> u64 {
    let script = redis::Script::new(
        r"
local n = 0
local jump = tonumber(ARGV[1])
for _, k in ipairs(redis.call('KEYS', '*')) do
  local t = redis.call('PTTL', k)
  if t > 0 then
    if t <= jump then redis.call('DEL', k) else redis.call('PEXPIRE', k, t - jump) end
    n = n + 1
  end
end
return n
",
    );
    let client = redis::Client::open(url).expect("node url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the node for the clock jump");
    script
        .arg(jump.as_millis() as u64)
        .invoke_async(&mut conn)
        .await
        .expect("clock jump script")
}
