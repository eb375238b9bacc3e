//! Promotions as fixed histories replayed step by step (as `repair_after_hold_out.rs` does): a
//! failover to a replica that missed the holder's write, under the mutant that trusts the
//! promoted replica's uptime (item 1) and with the fix (a promoted server counts as just
//! started). The breadth-first search reaches this history's depth only past its state cap.

use stateright::Model;

use super::timeline::timeline;
use super::{Action, Config, Mutants, Redlock, State};

const TICK: Action = Action::Tick { stall: 0 };

type Steps = Vec<(State, Option<Action>)>;

fn config(promoted_uptime_trusted: bool) -> Config {
    Config {
        promotions: 1,
        attempts: 2,
        extensions: 0,
        mutants: Mutants {
            promoted_uptime_trusted,
            ..Mutants::default()
        },
        ..Config::base()
    }
}

/// Replays `steps` from the initial state: the path, or the first step the model does not
/// offer where it is taken (with the steps it offers there).
fn replay(m: &Redlock, steps: &[Action]) -> Result<Steps, (usize, Action, Vec<Action>)> {
    let mut s = m.init_states().remove(0);
    let mut path = Vec::new();
    for (i, &a) in steps.iter().enumerate() {
        let mut enabled = Vec::new();
        m.actions(&s, &mut enabled);
        if !enabled.contains(&a) {
            return Err((i, a, enabled));
        }
        let next = m
            .next_state(&s, a)
            .expect("an offered step has a next state");
        path.push((s, Some(a)));
        s = next;
    }
    path.push((s, None));
    Ok(path)
}

/// c0 is granted the lock on n0 and n1 (its call to n2 stays queued); n0 fails over to a replica
/// without c0's key; c1's first attempt meets the promoted n0 (a new run id: repair, and a
/// hold-out for the max ttl unless its uptime is trusted) and fails; the repair runs; c1's second
/// attempt, one second later, is granted on n0 and n2 while c0's lock is still valid.
fn history() -> Vec<Action> {
    let d = |c, n| Action::Deliver { c, n };
    vec![
        Action::Start(0),
        d(0, 0),
        d(0, 1), // c0 granted token 1
        Action::Promote {
            n: 0,
            failback: false,
        },
        Action::Start(1), // n0 met again: a new run id; c1's call to it fails (repairing)
        d(1, 1),          // n1: held by c0
        d(1, 2),          // n2: yes
        Action::Repair { c: 1, n: 0 },
        TICK,
        Action::Start(1),
        d(1, 2), // the undo of c1's first attempt
        d(1, 2), // n2: yes
        d(1, 0), // n0: yes, c1 granted while c0's lock is valid
    ]
}

/// Replays `steps` on `m` (each must be offered where it is taken), prints the timeline under
/// `title`, and checks that it ends with both clients holding the lock.
fn assert_two_holders(m: &Redlock, steps: &[Action], title: &str) {
    let path = match replay(m, steps) {
        Ok(path) => path,
        Err((i, a, enabled)) => panic!("step {i} {a:?} not offered; offered: {enabled:?}"),
    };
    println!("{title}:\n{}", timeline(m, &path));
    let end = &path.last().expect("a path has a state").0;
    let valid = (0..2).filter(|&c| m.valid(end, c)).count();
    assert_eq!(valid, 2, "two clients hold the lock under the mutant");
}

#[test]
fn mutant_promoted_uptime_trusted_is_caught() {
    let m = Redlock::new(config(true));
    assert_two_holders(
        &m,
        &history(),
        "a failover whose replica's uptime is trusted",
    );
}

#[test]
fn a_promoted_replica_is_held_out_so_the_history_stops_at_its_repair() {
    let m = Redlock::new(config(false));
    let (i, a, _) = replay(&m, &history()).expect_err("the repair must wait for the hold-out");
    assert_eq!(a, Action::Repair { c: 1, n: 0 });
    assert_eq!(i, 7);
}

/// A standalone member under `appendfsync always` whose address moves to a promoted replica
/// (a failover: a new run id) that replicated the old master's durability marker but missed
/// c0's write: c1, which met the old master, meets the promoted one and, trusting the marker,
/// counts it at once: granted on n0 and n2 while c0's lock is valid.
fn durable_history() -> Vec<Action> {
    let d = |c, n| Action::Deliver { c, n };
    vec![
        Action::Start(0),
        d(0, 0),
        d(0, 1), // c0 granted token 1
        Action::Promote {
            n: 0,
            failback: false,
        },
        Action::Start(1), // n0 met again: a new run id, an old marker
        d(1, 1),          // n1: held by c0
        d(1, 2),          // n2: yes
        d(1, 0),          // n0: yes under the mutant (its call is never sent with the fix)
    ]
}

fn durable_config(promoted_marker_trusted: bool) -> Config {
    Config {
        durable: true,
        mutants: Mutants {
            promoted_marker_trusted,
            ..Mutants::default()
        },
        ..config(false)
    }
}

#[test]
fn mutant_promoted_marker_trusted_is_caught() {
    let m = Redlock::new(durable_config(true));
    assert_two_holders(
        &m,
        &durable_history(),
        "a promoted replica trusted for its replicated marker",
    );
}

#[test]
fn a_promoted_replica_is_not_trusted_for_its_replicated_marker() {
    let m = Redlock::new(durable_config(false));
    // The promoted n0 is held out and repairing: c1's call to it fails at once, so there is
    // nothing to deliver to n0, and c1 is not granted.
    let (i, a, _) = replay(&m, &durable_history()).expect_err("n0 must not be asked");
    assert_eq!(a, Action::Deliver { c: 1, n: 0 });
    assert_eq!(i, 7);
}
