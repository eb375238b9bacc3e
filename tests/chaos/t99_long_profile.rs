//! The long profile: every fault kind in turn, for as long as asked, ending with a summary table.
//!
//! ```text
//! QUORUMLOCK_CHAOS_SECS=600 cargo test --features testkit --test chaos -- --ignored --nocapture long_profile
//! ```
//!
//! The time is split evenly between the faults; each fault's share is cut into runs of about
//! 30 s (plus the waits for recovery after each heal), each on a fresh cluster with its own
//! seed: run `n` of row `i` uses `first + 1000 i + n`, where `first` is printed
//! (`QUORUMLOCK_CHAOS_SEED` sets it). `QUORUMLOCK_CHAOS_ONLY=<text>` keeps the rows whose name
//! contains `<text>` (same seeds and run length), to replay one.
//!
//! The faults the lock is meant to survive must show no violation at all (token regressions
//! excepted where restarts lose counters, as the row says); for the others the table shows what
//! broke and whether fencing caught it. Every row must stay live: nothing hung, no starved
//! fault (see `checker.rs`), the lock acquired again within the bound after every heal, and no
//! harness trouble.

use std::time::Duration;

use quorumlock::RestartGuard;

use crate::nemesis::FaultKind::{self, ClockJump};
use crate::runner::{Outcome, Scenario, run, table_header, table_row};
use crate::t80_mixed::SURVIVABLE;

/// What a row of the table may show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// No violation of any kind (token regressions excepted where the scenario loses counters,
    /// see [`Scenario::loses_counters`]; the row's text says so).
    Safe,
    /// Violations possible, every one caught by fencing; the lock stays available through
    /// minority faults and comes back after every heal.
    Caught,
    /// Violations possible, and fencing cannot catch all of them (equal tokens); nothing may
    /// hang and the lock must come back.
    Unsafe,
}

/// A scenario, what its row may show, and the row's text.
type Row = (Scenario, Expect, &'static str);

/// The table's rows, in order (a row's index picks its seeds).
fn rows() -> Vec<Row> {
    let mut rows = restart_rows();
    rows.extend(other_fault_rows());
    rows
}

/// No fault, then nodes killed and restarted: minority or majority, at once or after the
/// ttl, empty or from AOF, with the restart guard on or off.
fn restart_rows() -> Vec<Row> {
    use FaultKind::*;
    vec![
        (Scenario::new("none", &[]), Expect::Safe, "no violation"),
        (
            Scenario::new(
                "kill minority, restart after > ttl (guard off)",
                &[KillMinorityDelayed],
            )
            .guard(RestartGuard::Off),
            Expect::Safe,
            "no overlap; tokens may regress (guard off: nothing restores lost counters)",
        ),
        (
            Scenario::new("kill minority, restart at once (guard on)", &[KillMinority]),
            Expect::Safe,
            "no violation",
        ),
        (
            Scenario::new(
                "kill majority, restart at once, AOF always (guard off)",
                &[KillMajority],
            )
            .aof()
            .guard(RestartGuard::Off),
            Expect::Safe,
            "no violation",
        ),
        (
            Scenario::new(
                "kill majority, restart empty at once (guard off)",
                &[KillMajority],
            )
            .guard(RestartGuard::Off),
            Expect::Unsafe,
            "overlaps and token regressions; equal tokens escape fencing",
        ),
        (
            Scenario::new(
                "kill majority, restart empty at once (guard on)",
                &[KillMajority],
            ),
            Expect::Safe,
            "no overlap; tokens may regress (a wiped majority is restored from the clean minority, best effort)",
        ),
        (
            Scenario::new(
                "kill majority, restart at once, AOF always (guard on)",
                &[KillMajority],
            )
            .aof(),
            Expect::Safe,
            "no violation",
        ),
    ]
}

/// Pauses, network faults, clock jumps, a paused client, stale keys, and all the survivable
/// faults mixed.
fn other_fault_rows() -> Vec<Row> {
    use FaultKind::*;
    vec![
        (
            Scenario::new("SIGSTOP nodes", &[PauseNodes]),
            Expect::Safe,
            "no violation",
        ),
        (
            Scenario::new("latency", &[Latency]),
            Expect::Safe,
            "no violation",
        ),
        (
            Scenario::new("blackhole", &[Blackhole]),
            Expect::Safe,
            "no violation",
        ),
        (
            Scenario::new("connection resets", &[Reset]),
            Expect::Safe,
            "no violation",
        ),
        (
            Scenario::new("per-client partitions", &[ClientPartition]),
            Expect::Safe,
            "no violation",
        ),
        (
            Scenario::new("clock jump under a bare majority", &[ClockJump]),
            Expect::Caught,
            "jumps hit bare-majority holders; overlaps possible, caught by fencing",
        ),
        (
            Scenario {
                clients: 2,
                ..Scenario::new("SIGSTOP the holder (child process)", &[PauseClient])
            },
            Expect::Caught,
            "late writes past validity, rejected",
        ),
        (
            Scenario {
                clients: 1,
                ..Scenario::new("stale keys among paused nodes (one client)", &[StaleKeys])
            },
            Expect::Safe,
            "no violation; never told `held` (refusals alone cannot rule out a quorum)",
        ),
        (
            Scenario::new("all survivable, mixed", SURVIVABLE),
            Expect::Safe,
            "no violation",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long profile: run with --ignored; QUORUMLOCK_CHAOS_SECS sets its length (default 600)"]
async fn long_profile() {
    let total = Duration::from_secs(
        std::env::var("QUORUMLOCK_CHAOS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600),
    );
    let first = crate::runner::seed(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs()),
    );
    let only = std::env::var("QUORUMLOCK_CHAOS_ONLY").unwrap_or_default();
    let rows = rows();
    let share = total / rows.len() as u32;
    let runs_per_row = (share.as_secs() / 30).max(1) as u32;
    let run_len = share / runs_per_row;
    println!(
        "long profile: {total:?} over {} faults, {runs_per_row} run(s) of ~{run_len:?} each; first seed {first}",
        rows.len()
    );
    let mut table = vec![table_header()];
    let mut failures = Vec::new();
    for (i, (scn, expect, expected)) in rows.iter().enumerate() {
        if !scn.name.contains(&only) {
            continue;
        }
        let mut outcomes: Vec<Outcome> = Vec::new();
        for n in 0..runs_per_row {
            // Row i, run n: seed first + 1000 i + n, whatever rows are filtered out.
            let out = run(
                scn,
                first.wrapping_add(1000 * i as u64 + u64::from(n)),
                run_len,
            )
            .await;
            let r = &out.report;
            println!(
                "  {} seed {}: {} sections, {} violations ({} uncaught), {} stale rejected, worst gap {:?}, {:?}",
                out.name,
                out.seed,
                r.sections,
                r.violations(),
                r.uncaught.len(),
                r.stale_rejected,
                r.worst_gap,
                out.elapsed
            );
            let must_live = !r.hung.is_empty()
                || !r.slow_recoveries.is_empty()
                || !r.starved.is_empty()
                || r.harness_trouble() > 0;
            let bad = match expect {
                Expect::Safe => out.unexpected_violations() > 0,
                Expect::Caught => {
                    must_live
                        || !r.uncaught.is_empty()
                        || !r.token_regressions.is_empty()
                        // A run that claims to test clock jumps must have made one that hit.
                        || (scn.faults.contains(&ClockJump) && r.jumps_fired == 0)
                }
                Expect::Unsafe => must_live,
            };
            if bad || r.violations() > 0 {
                println!("{}", out.explain());
            }
            if bad {
                failures.push(format!("{} seed {}", out.name, out.seed));
            }
            outcomes.push(out);
        }
        let row = table_row(scn.name, expected, &outcomes);
        println!("{row}");
        table.push(row);
    }
    println!("\n{}\n", table.join("\n"));
    assert!(failures.is_empty(), "unexpected results: {failures:?}");
}
