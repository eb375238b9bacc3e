//! The seeded schedule: which faults, with what parameters, after what pauses. The same seed
//! always draws the same schedule.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{RngExt, SeedableRng};

use crate::nemesis::{Fault, FaultKind};

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
        FaultKind::QuorumOnly => Fault::PauseNodes {
            nodes: some_of(rng, nodes, minority),
            hold: ttls(rng, ttl, 2.0, 4.0),
        },
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
        FaultKind::ClientPartition => draw_partition(rng, nodes, clients, ttl),
        FaultKind::ClockJump => draw_clock_jump(rng, nodes, clients, ttl),
        FaultKind::PauseClient => Fault::PauseClient {
            hold: ttls(rng, ttl, 0.3, 2.5),
        },
        FaultKind::StaleKeys => draw_stale_keys(rng, nodes, ttl),
    }
}

/// Each client sees its own view: most often a quorum or more of the nodes, else fewer.
fn draw_partition(rng: &mut StdRng, nodes: usize, clients: usize, ttl: Duration) -> Fault {
    let quorum = nodes / 2 + 1;
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

/// One client cut off a minority, and one of the other nodes' clocks jumping.
fn draw_clock_jump(rng: &mut StdRng, nodes: usize, clients: usize, ttl: Duration) -> Fault {
    let minority = nodes - (nodes / 2 + 1);
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

/// Stale foreign values and paused nodes that only together put a quorum out of reach.
fn draw_stale_keys(rng: &mut StdRng, nodes: usize, ttl: Duration) -> Fault {
    let minority = nodes - (nodes / 2 + 1);
    // s stale nodes (refusals alone never rule a quorum out), and just enough paused
    // ones among the others that a quorum is out of reach: s + p = minority + 1. The
    // failures alone do not rule it out either (p <= minority): only the two together
    // do, the case that read as `Held`.
    let mut order: Vec<usize> = (0..nodes).collect();
    order.shuffle(rng);
    let s = rng.random_range(1..=minority.max(1));
    let p = minority + 1 - s;
    let mut stale = order[..s].to_vec();
    let mut paused = order[s..s + p].to_vec();
    stale.sort_unstable();
    paused.sort_unstable();
    Fault::StaleKeys {
        stale,
        paused,
        hold: ttls(rng, ttl, 2.5, 4.0),
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
