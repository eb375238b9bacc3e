//! Node faults: SIGKILL with delayed or immediate restarts, AOF persistence, SIGSTOP.
//!
//! Each case runs three clients against five nodes while the nemesis follows a seeded
//! schedule. Liveness everywhere: after each heal the lock is acquired again within
//! `3 x ttl + connect timeout + 4 s` (7.5 s with the 1 s ttl: 4 s of slack for a loaded box).

use quorumlock::RestartGuard;

use crate::nemesis::FaultKind;
use crate::runner::{SHORT, Scenario, expect_safe, run, seed};

/// Up to a minority (2 of 5) killed and kept down longer than the ttl, then restarted empty;
/// the client's restart guard is off, so the delay alone must keep the lock safe.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_minority_with_delayed_restart_keeps_exclusion() {
    let scn = Scenario::new("kill-minority-delayed", &[FaultKind::KillMinorityDelayed])
        .guard(RestartGuard::Off);
    expect_safe(scn, 30, SHORT).await;
}

/// Up to a minority killed and restarted empty at once; the client's default restart guard
/// (`Restarted`: a node whose run id changed is held out for the max ttl) does the waiting.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_minority_with_immediate_restart_is_held_out_by_the_restart_guard() {
    let scn = Scenario::new("kill-minority-immediate+guard", &[FaultKind::KillMinority]);
    expect_safe(scn, 31, SHORT).await;
}

/// A majority (3 of 5) killed and restarted at once, with `appendfsync always`: the nodes come
/// back with their keys and fencing counters; the restart guard is off.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no hung operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_majority_with_aof_always_keeps_exclusion() {
    let scn = Scenario::new("kill-majority-immediate+aof", &[FaultKind::KillMajority])
        .aof()
        .guard(RestartGuard::Off);
    expect_safe(scn, 32, SHORT).await;
}

/// Up to a majority of nodes SIGSTOPped (hung masters that accept connections and never
/// answer) for 0.2 to 2 ttl, then SIGCONT.
///
/// Expected: no overlap, strictly growing tokens, no write past validity, no operation hung
/// past its bound (the per-node timeout cuts every call short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_nodes_cost_availability_only() {
    let scn = Scenario::new("pause-nodes", &[FaultKind::PauseNodes]);
    expect_safe(scn, 33, SHORT).await;
}

/// Contention with exactly a quorum reachable (issue 16; `docs/chaos.md` finding 7 was a
/// livelock there): a minority of nodes SIGSTOPped for 2..4 ttl at a time, three clients
/// contending for the lock with `acquire_timeout`.
///
/// Expected: no violation, no fault window without an acquisition (the checker's `starved`,
/// part of `expect_safe`), and the lock kept changing hands while exactly a quorum was
/// reachable: more sections than clients. How evenly the clients shared it is printed, not
/// judged: even three fair contenders split 60 acquisitions with the fewest under a third of the
/// most in 0.3% of runs (a 1-in-10,000 bound is out of reach), so fairness is a benchmark
/// (`benches/fairness.rs`); `tests/waiting/turns.rs` w15 checks that no contender starves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_exactly_a_quorum_does_not_starve() {
    let scn = Scenario::new("quorum-only-contention", &[FaultKind::QuorumOnly]);
    let clients = scn.clients;
    let out = expect_safe(scn, 34, SHORT * 2).await;
    let h = &out.history;
    let mut won = vec![0usize; clients];
    for x in &h.sections {
        if x.client < clients
            && h.faults
                .iter()
                .any(|f| f.start <= x.acquired && x.acquired <= f.healed)
        {
            won[x.client] += 1;
        }
    }
    println!(
        "[chaos {}] sections per client with exactly a quorum: {won:?}",
        out.name
    );
    assert!(
        won.iter().sum::<usize>() > clients,
        "the lock barely changed hands with exactly a quorum reachable: {won:?}\n{}",
        out.explain()
    );
}

/// Refusals mixed with failures (issue 12 item 6): a foreign owner's key on a minority of nodes
/// and enough other nodes SIGSTOPped that no quorum is possible, the refusals alone too few to
/// rule one out. One client, so that no other contender's keys can add refusals.
///
/// Expected: every acquisition made during the fault fails as `NoQuorum`, never `Held` (an
/// outage that callers would skip quietly); no violation. Red before the fix: the rounds were
/// `Held` once `failed <= N - quorum`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_keys_among_failed_nodes_read_as_no_quorum_not_held() {
    let mut scn = Scenario::new("stale-keys+paused-nodes", &[FaultKind::StaleKeys]);
    scn.clients = 1;
    let out = run(&scn, seed(34), SHORT * 2).await;
    assert!(
        !out.report.held_judged.is_empty(),
        "no acquisition was made during a fault: the schedule tested nothing\n{}",
        out.explain()
    );
    println!(
        "[chaos {}] {} acquisitions judged during stale-key faults, {} misreported as held",
        scn.name,
        out.report.held_judged.len(),
        out.report.misreported_held.len()
    );
    out.assert_safe();
    out.assert_recovered();
}
