//! Finding 5 of `docs/verification.md` (a token repeats when an empty restart lands inside
//! another client's round), as a fixed history replayed step by step: each step must be one the
//! model offers where it is taken. The whole-space two-client liveness run with a crash found it
//! after minutes; this replays its shape in milliseconds, with and without the fix (the repair
//! reads its sources only once the restarted node's hold-out is over).

use stateright::Model;

use super::timeline::timeline;
use super::{Action, Config, Mutants, Redlock, State};

const TICK: Action = Action::Tick { stall: 0 };

/// A replayed history: each state with the step taken from it (the last with none).
type Steps = Vec<(State, Option<Action>)>;

/// The replayed history's configuration: two clients with two attempts each, one crash
/// restarting empty, no extensions, the restart guard on.
fn config(repair_before_hold_out_ends: bool) -> Config {
    Config {
        crashes: 1,
        data_restarts: false,
        extensions: 0,
        mutants: Mutants {
            repair_before_hold_out_ends,
            ..Mutants::default()
        },
        ..Config::base()
    }
}

/// Finding 5's history, with `c0`'s repair of `n0` taken early (before `c1`'s raise lands, inside
/// the hold-out: only the mutant offers it) or once the hold-out is over (the fix).
fn history(repair_early: bool) -> Vec<Action> {
    let d = |c, n| Action::Deliver { c, n };
    let repair = Action::Repair { c: 0, n: 0 };
    let mut h = vec![
        Action::Start(0),
        d(0, 0), // t=0 n0 -> 1
        TICK,
        d(0, 1), // t=1 n1 -> 1: c0 granted token 1 (its ACQUIRE to n2 stays queued)
        TICK,
        TICK, // t=3 c0#0 expires on n0; c0's lock no longer valid
        Action::Start(1),
        d(1, 1), // n1: held by c0#0
        d(1, 0), // n0 -> 2 (a yes given before the restart)
        Action::Crash(0),
        Action::Restart { n: 0, empty: true },
        Action::Release(0), // c0 reconnects to n0: restart seen, hold-out and repair
        TICK,
        d(1, 2), // t=4 n2 -> 1: quorum {n0 (2), n2 (1)}: token 2, raise n2
    ];
    if repair_early {
        h.push(repair); // reads n1 (1) and n2 (1): n0 0 -> 1
    }
    h.extend([
        d(1, 2), // RAISE_FENCE lands on n2 (2): c1 granted token 2
        TICK,
        TICK, // t=6 c0's hold-out of n0 is over
    ]);
    if !repair_early {
        h.push(repair); // reads n1 (1) and n2 (2): n0 0 -> 2
    }
    // t=6 c0's second attempt: n0 -> 2 and n1 -> 2 after the early repair (token 2 again);
    // n0 -> 3 and n1 -> 2 after the late one, then n1 raised to 3.
    h.extend([Action::Start(0), d(0, 0), d(0, 1)]);
    if !repair_early {
        h.push(d(0, 1));
    }
    h
}

/// Replays `steps` from the initial state: the path, or the first step the model does not
/// offer where it is taken.
fn replay(m: &Redlock, steps: &[Action]) -> Result<Steps, (usize, Action)> {
    let mut s = m.init_states().remove(0);
    let mut path = Vec::new();
    for (i, &a) in steps.iter().enumerate() {
        let mut enabled = Vec::new();
        m.actions(&s, &mut enabled);
        if !enabled.contains(&a) {
            return Err((i, a));
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

fn last(path: &[(State, Option<Action>)]) -> &State {
    &path.last().expect("a path has a state").0
}

/// The mutant (the repair reads its sources as soon as the restart is seen) repeats token 2:
/// the fencing property fails on finding 5's history.
#[test]
fn mutant_repair_before_hold_out_ends_is_caught() {
    let m = Redlock::new(config(true));
    let path = replay(&m, &history(true)).expect("every step offered under the mutant");
    println!("finding 5 under the mutant:\n{}", timeline(&m, &path));
    let end = last(&path);
    assert!(
        end.flags.token_not_increasing,
        "the mutant's history should repeat a token"
    );
    assert_eq!(end.max_token, 2);
}

/// With the fix the early repair is not a step (the node is still held out), and the same
/// history with the repair at the hold-out's end restores the raised counter: tokens 1, 2, 3.
#[test]
fn a_repair_waits_for_the_hold_out_so_the_token_is_not_repeated() {
    let m = Redlock::new(config(false));
    let early = history(true);
    let (i, a) = replay(&m, &early).expect_err("the early repair must not be offered");
    assert_eq!(a, Action::Repair { c: 0, n: 0 });
    assert_eq!(
        i,
        early.iter().position(|s| *s == a).expect("in the history")
    );
    let path = replay(&m, &history(false)).expect("every step offered with the fix");
    println!("finding 5's history with the fix:\n{}", timeline(&m, &path));
    let end = last(&path);
    assert!(!end.flags.token_not_increasing);
    assert_eq!(end.max_token, 3);
}
