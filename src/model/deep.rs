//! The deep profile (`--ignored`; run it in the optimised `model` profile, see
//! `docs/verification.md`): both clients' whole acquire → extend → release cycle over every
//! history with one fault profile at a time, the two-client liveness check, and deeper
//! breadth-first runs.

use super::Config;
use super::checks::*;

// ---- liveness with contention ----------------------------------------------------------------

/// Two clients (contention), delays and pauses before the faults stop (`CRASH=1` adds a
/// crash): once they stop, users release what they hold and a client is granted the
/// (released) lock within 9 s. Deep profile: the two-client quiet phases are large.
#[test]
#[ignore = "deep profile"]
fn liveness_a_released_lock_is_granted_again() {
    let cfg = Config {
        crashes: env("CRASH", 0),
        ..live(2, env("LIVE_W", 9))
    };
    assert_live("liveness, two clients", cfg);
}

// ---- deep profile (--ignored) ----------------------------------------------------------------

fn deep(label: &str, cfg: Config, depth: usize) {
    let r = run_to(label, cfg, &[], Some(depth));
    assert_safe(&r, &SAFETY);
    println!(
        "[{label}] coverage: {:?}",
        [BOTH, ONE_CYCLE, CYCLE, REPAIRED]
            .iter()
            .filter(|p| r.found.contains_key(*p))
            .collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "deep profile"]
fn deep_delays_and_timeouts() {
    deep("deep delays", Config::base(), env("DEPTH", 14).into());
}

#[test]
#[ignore = "deep profile"]
fn deep_crash_and_restart() {
    let cfg = Config {
        crashes: 1,
        ..Config::base()
    };
    deep("deep crash", cfg, env("DEPTH", 12).into());
}

#[test]
#[ignore = "deep profile"]
fn deep_drift_and_loss() {
    let cfg = Config {
        stalls: 1,
        disconnects: 1,
        ..Config::base()
    };
    deep("deep drift+loss", cfg, env("DEPTH", 11).into());
}

/// Every fault at once, depth-first over as many states as the cap allows (not exhaustive).
#[test]
#[ignore = "deep profile"]
fn deep_all_faults_depth_first() {
    let cfg = Config {
        crashes: 1,
        disconnects: 1,
        stalls: 1,
        ..Config::base()
    };
    let r = run("deep all faults (DFS, capped)", cfg, &[]);
    assert_safe(&r, &SAFETY);
}

#[test]
#[ignore = "deep profile"]
fn deep_five_nodes() {
    let cfg = Config {
        nodes: 5,
        crashes: 1,
        ..Config::base()
    };
    deep("deep 5 nodes", cfg, env("DEPTH", 10).into());
}

#[test]
#[ignore = "exploration helper: MODEL_STATE_CAP, DEPTH, ATT, EXT, CRASH, DISC, STALL, EVICT"]
fn explore() {
    let cfg = Config {
        crashes: env("CRASH", 0),
        disconnects: env("DISC", 0),
        evictions: env("EVICT", 0),
        stalls: env("STALL", 0),
        attempts: env("ATT", 2),
        extensions: env("EXT", 1),
        ..Config::base()
    };
    let depth = std::env::var("DEPTH").ok().and_then(|v| v.parse().ok());
    let r = if std::env::var("FULL").is_ok() {
        run_full("explore (full, symmetric)", cfg, &[]).0
    } else {
        run_to("explore", cfg, &[], depth)
    };
    assert_safe(&r, &SAFETY);
}

// ---- both clients' whole cycle, every history ------------------------------------------------

/// The cycle runs: 3 nodes × 2 clients, one attempt and one extension each. Delays (any queued
/// call waits any number of ticks, in any order across connections) and pauses (every client
/// step is optional at every tick) are always on; `faults` adds one fault profile.
fn cycle(faults: Config) -> Config {
    Config {
        attempts: 1,
        extensions: 1,
        ..faults
    }
}

/// Explores every history of `cfg` (depth-first, symmetry-reduced, no depth bound), asserts the
/// safety properties held on all of them, that the run was complete, and that a history where
/// both clients acquired, extended and released was reached.
pub(super) fn assert_cycle(label: &str, cfg: Config) {
    let (r, complete) = run_full(label, cfg, &[]);
    assert_safe(&r, &SAFETY);
    assert!(
        complete,
        "[{label}] stopped at the state cap or the timeout: not every history was checked"
    );
    let trace = r.found.get(CYCLE).unwrap_or_else(|| {
        panic!("[{label}] no history where both clients acquired, extended and released")
    });
    println!("[{label}] a history with both cycles:\n{trace}");
}

/// Both clients acquire, extend and release, with delays and pauses only.
#[test]
#[ignore = "deep profile"]
fn deep_cycle_delays_and_pauses() {
    assert_cycle("cycle: delays, pauses", cycle(Config::base()));
}

/// The same with one node crash (restarting with its data or empty), under the restart guard.
#[test]
#[ignore = "deep profile"]
fn deep_cycle_with_a_crash() {
    let cfg = Config {
        crashes: 1,
        ..Config::base()
    };
    assert_cycle("cycle: delays, pauses, 1 crash", cycle(cfg));
}

/// The same with one broken connection (queued calls lost, or a reply lost after the apply).
#[test]
#[ignore = "deep profile"]
fn deep_cycle_with_a_broken_connection() {
    let cfg = Config {
        disconnects: 1,
        ..Config::base()
    };
    assert_cycle("cycle: delays, pauses, 1 broken connection", cycle(cfg));
}

/// The same with one stalled second of a client clock (within the drift bound).
#[test]
#[ignore = "deep profile"]
fn deep_cycle_with_a_stalled_second() {
    let cfg = Config {
        stalls: 1,
        ..Config::base()
    };
    assert_cycle("cycle: delays, pauses, 1 stalled second", cycle(cfg));
}

/// The crash run split by the kind of restart: with one crash per history, every history
/// restarts its node with its data or empty (or not at all), so these two runs together cover
/// exactly the histories of `deep_cycle_with_a_crash`.
#[test]
#[ignore = "deep profile"]
fn deep_cycle_with_a_crash_restarting_with_data() {
    let cfg = Config {
        crashes: 1,
        empty_restarts: false,
        ..Config::base()
    };
    assert_cycle(
        "cycle: delays, pauses, 1 crash, restart with data",
        cycle(cfg),
    );
}

/// The other half of `deep_cycle_with_a_crash`: the node restarts empty.
#[test]
#[ignore = "deep profile"]
fn deep_cycle_with_a_crash_restarting_empty() {
    let cfg = Config {
        crashes: 1,
        data_restarts: false,
        ..Config::base()
    };
    assert_cycle("cycle: delays, pauses, 1 crash, restart empty", cycle(cfg));
}

/// A witness for the crash runs: a history where a node crashed (and restarted, with its data
/// or empty: `RESTART=data|empty`) and both clients acquired, extended and released (the
/// depth-first run stops at the first one and prints it).
#[test]
#[ignore = "deep profile"]
fn deep_cycle_with_a_crash_witness() {
    let kind = std::env::var("RESTART").unwrap_or_default();
    let cfg = Config {
        crashes: 1,
        empty_restarts: kind != "data",
        data_restarts: kind != "empty",
        ..Config::base()
    };
    let (r, _) = run_full("cycle with a crash: witness", cycle(cfg), &[CYCLE_CRASH]);
    assert_safe(&r, &SAFETY);
    let trace = r
        .found
        .get(CYCLE_CRASH)
        .expect("no history with a crash where both clients acquired, extended and released");
    println!("a history with a crash and both cycles:\n{trace}");
}
