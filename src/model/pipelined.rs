//! The pipelined acquire (`AcquireMode::Pipelined`: `SET NX PX GET` then `INCR`, two steps at
//! the node) checked like the script: every property in the bounded profile, its mutant, and
//! both clients' whole cycle in the deep profile.

use super::checks::*;
use super::deep::assert_cycle;
use super::{AcquireMode, Config, Mutants};

/// The base configuration with the pipelined acquire.
fn piped() -> Config {
    Config {
        acquire: AcquireMode::Pipelined,
        ..Config::base()
    }
}

// ---- bounded profile ---------------------------------------------------------------------------

/// Delays, reordering and timeouts, two attempts and an extension per client: other clients'
/// commands, the key's expiry and round deadlines land between a node's `SET` and its `INCR`.
#[test]
fn pipelined_delays_and_timeouts() {
    let r = assert_safe_to("pipelined delays", piped(), env("DEPTH", 11).into());
    // (Two pipelined acquisitions take 15 steps: the deep profile's cycle run reaches them.)
    assert!(
        r.found.contains_key(ONE_CYCLE),
        "never reached acquire, extend, release"
    );
}

/// A node crash between a `SET` and its `INCR` (restarting empty or with its data), guard on.
#[test]
fn pipelined_crash_and_restart() {
    let cfg = Config {
        crashes: 1,
        ..piped()
    };
    assert_safe_to("pipelined crash", cfg, env("DEPTH", 10).into());
}

/// A broken connection: the `INCR` lost behind an applied `SET`, or its reply lost.
#[test]
fn pipelined_lost_messages() {
    let cfg = Config {
        disconnects: 1,
        ..piped()
    };
    assert_safe_to("pipelined loss", cfg, env("DEPTH", 10).into());
}

/// A client clock that runs slow within the drift bound.
#[test]
fn pipelined_clock_drift_within_the_bound() {
    let cfg = Config {
        stalls: 1,
        ..piped()
    };
    assert_safe_to("pipelined drift", cfg, env("DEPTH", 10).into());
}

/// `Held` only when the refusals alone forbid a quorum (the library's `Tally`).
#[test]
fn pipelined_held_only_when_the_refusals_alone_forbid_a_quorum() {
    let r = run_to(
        "pipelined held",
        piped(),
        &[HELD],
        Some(env("DEPTH", 9).into()),
    );
    assert_safe(&r, &[HELD]);
}

/// A split vote is contention, not `Held` (the `SET`'s `GET` names the holder).
#[test]
fn pipelined_no_held_on_a_split_vote() {
    split_vote(env("DEPTH", 10).into());
}

/// As [`pipelined_no_held_on_a_split_vote`], two steps deeper.
#[test]
#[ignore = "deep profile"]
fn deep_pipelined_no_held_on_a_split_vote() {
    split_vote(env("DEPTH", 12).into());
}

fn split_vote(depth: usize) {
    let cfg = Config {
        disconnects: 1,
        extensions: 0,
        ..piped()
    };
    let r = run_to("pipelined split", cfg, &[SPLIT], Some(depth));
    assert_safe(&r, &[SPLIT]);
}

/// A lone client is granted the lock within 1 s of the faults (a crash) stopping.
#[test]
fn pipelined_liveness_a_lone_client_acquires_after_faults_stop() {
    let cfg = Config {
        crashes: 1,
        acquire: AcquireMode::Pipelined,
        ..live(1, 1)
    };
    assert_live("pipelined liveness, one client", cfg);
}

/// The mutant: a node whose `SET` was ours but whose `INCR` reply is missing counted as a yes at
/// the token. Its counter may never have been raised (the `INCR` was lost with the connection),
/// so fewer than a quorum stand at the token and a later holder draws a smaller one.
/// Found by the whole-space run only (a breadth-first run needs 15 steps, beyond its cap):
/// 26 s in the `model` profile, so in the deep profile.
#[test]
#[ignore = "deep profile"]
fn mutant_missing_incr_counted_is_caught() {
    let cfg = Config {
        attempts: 1,
        extensions: 0,
        mutants: Mutants {
            missing_incr_counted: true,
            ..Mutants::default()
        },
        ..piped()
    };
    let (r, _) = run_full("mutant missing INCR", cfg, &[FENCE]);
    let steps = assert_found(&r, FENCE);
    println!("[mutant missing INCR] `{FENCE}` fails in {steps} steps");
}

// ---- deep profile ------------------------------------------------------------------------------

/// Both clients acquire (pipelined), extend and release, with delays and pauses, every history.
#[test]
#[ignore = "deep profile"]
fn deep_cycle_pipelined_delays_and_pauses() {
    let cfg = Config {
        attempts: 1,
        extensions: 1,
        ..piped()
    };
    assert_cycle("cycle (pipelined): delays, pauses", cfg);
}
