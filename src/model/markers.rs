//! Run-once tick markers across restarts, as their own small model: a tick runs at most once
//! however nodes restart empty and come and go, and a tick that began after a loss was seen is
//! not held out by it.
//!
//! Three nodes; two instances of one job, each of which has met every node before (warm
//! clients: a client that first meets a node after its empty restart cannot know, which
//! `docs/safety.md` states as a limit). Two ticks, scheduled to start at times 0 and 2 of a
//! clock that advances to 3; a tick is attempted only once it began (the library waits for a
//! tick's start). An attempt at a tick is one step: the lock's mutual exclusion (checked by the
//! main model) serialises the instances, so an attempt reads the marker from the nodes that are
//! up, and either skips (a node answered with the marker), or runs the tick and writes the
//! marker on the nodes that are up (a quorum, or the tick was not marked and may run again:
//! that is the library's `RunPolicy` to choose, not a double run of a marked tick), or finds it
//! cannot tell (too few answers it can trust) and tries later. Faults: a node restarts empty
//! (its markers gone, a new run id: an instance sees the loss, at the time of its next attempt
//! that the node answers) and a node goes down or comes back, each a bounded number of times.
//!
//! "Absent" is decided by the library's rules, `quorum::marker_absent` over the answers it can
//! trust, and `quorum::loss_may_hide_marker`: a node's answer is not trusted when the instance
//! saw it lose its data no earlier than the tick's start. Checked: a marked tick never runs
//! again; a tick is never held out by losses seen before it began; coverage that a tick runs,
//! that one runs after a loss, that it is skipped as already run, and that a restart makes an
//! attempt unable to tell. Mutants: `count_every_answer` (every "absent" answer counts) and
//! `held_out_at_the_loss` (a loss seen at the tick's very start is trusted): the checker finds
//! the second run; `hold_out_every_tick` (every loss within the marker's expiry holds out every
//! tick): the checker finds a tick held out by a loss seen before it began.

use stateright::{Checker, HasDiscoveries, Model, Property};

use crate::core::quorum;

/// Nodes in the model.
const N: usize = 3;
/// Instances of the job.
const I: usize = 2;
/// Ticks, and when each is scheduled to start.
const K: usize = 2;
const START: [u8; K] = [0, 2];
/// The clock's last value.
const END: u8 = 3;
/// Faults at most (restarts and outages together).
const FAULTS: u8 = 3;

const ONCE: &str = "a marked tick never runs again";
const NOT_HELD: &str = "a tick is not held out by losses seen before it began";
const RAN: &str = "coverage: the tick ran";
const RAN_AFTER_LOSS: &str = "coverage: a tick ran after a loss was seen";
const SKIPPED: &str = "coverage: an attempt found the marker";
const UNTOLD: &str = "coverage: an attempt could not tell";

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    now: u8,
    marker: [[bool; N]; K],
    up: [bool; N],
    /// Each node's run (bumped by an empty restart), and the run each instance last saw.
    run: [u8; N],
    known: [[u8; N]; I],
    /// When instance `i` saw node `n` lose its data last (within the marker's expiry).
    seen_lost: [[Option<u8>; N]; I],
    /// Runs of each tick whose marker reached a quorum, and runs in all.
    marked_runs: [u8; K],
    runs: [u8; K],
    ran_after_loss: bool,
    held_wrongly: bool,
    skipped: bool,
    untold: bool,
    faults: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    /// Instance `i` attempts tick `k`.
    Attempt(u8, u8),
    /// Node `n` restarts without its data.
    RestartEmpty(u8),
    /// Node `n` goes down, or comes back.
    Toggle(u8),
    /// The clock advances.
    Advance,
}

#[derive(Clone, Copy, Debug, Default)]
struct Markers {
    /// Every "absent" answer counts (the rule before restarts were taken into account).
    count_every_answer: bool,
    /// A loss holds out every tick, whenever it began (the rule before ticks had a start).
    hold_out_every_tick: bool,
    /// A loss seen at the tick's very start is trusted (the boundary off by one).
    held_out_at_the_loss: bool,
}

impl Markers {
    /// Whether an answer from a node seen losing its data at `seen` may hide tick `k`'s marker.
    fn hides(&self, k: usize, seen: u8) -> bool {
        if self.hold_out_every_tick {
            true
        } else if self.held_out_at_the_loss {
            START[k] < seen
        } else {
            quorum::loss_may_hide_marker(Some(START[k]), seen)
        }
    }
}

fn u8_of(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(0)
}

impl Model for Markers {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            marker: [[false; N]; K],
            up: [true; N],
            run: [0; N],
            known: [[0; N]; I],
            seen_lost: [[None; N]; I],
            marked_runs: [0; K],
            runs: [0; K],
            ran_after_loss: false,
            held_wrongly: false,
            skipped: false,
            untold: false,
            faults: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // Past a second run of a tick, or a tick held out wrongly, the checker has what it
        // looks for.
        if s.runs.iter().any(|&r| r > 1) || s.held_wrongly {
            return;
        }
        for i in 0..I {
            for k in (0..K).filter(|&k| START[k] <= s.now) {
                actions.push(Action::Attempt(u8_of(i), u8_of(k)));
            }
        }
        if s.faults < FAULTS {
            for n in 0..N {
                actions.push(Action::RestartEmpty(u8_of(n)));
                actions.push(Action::Toggle(u8_of(n)));
            }
        }
        if s.now < END {
            actions.push(Action::Advance);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Attempt(i, k) => {
                let (i, k) = (usize::from(i), usize::from(k));
                let answered: Vec<usize> = (0..N).filter(|&n| s.up[n]).collect();
                // An answer from a new run of a node: the instance sees its loss now.
                for &n in &answered {
                    if s.known[i][n] != s.run[n] {
                        s.known[i][n] = s.run[n];
                        s.seen_lost[i][n] = Some(s.now);
                    }
                }
                if answered.iter().any(|&n| s.marker[k][n]) {
                    s.skipped = true;
                    return Some(s);
                }
                let clean = answered
                    .iter()
                    .filter(|&&n| {
                        self.count_every_answer
                            || s.seen_lost[i][n].is_none_or(|seen| !self.hides(k, seen))
                    })
                    .count();
                let quorum = quorum::quorum(N);
                if !quorum::marker_absent(clean, quorum) {
                    s.untold = true;
                    // Losses seen before the tick began cannot have taken its marker.
                    let before = answered
                        .iter()
                        .filter(|&&n| s.seen_lost[i][n].is_none_or(|seen| seen < START[k]))
                        .count();
                    s.held_wrongly |= before >= quorum;
                    return Some(s);
                }
                s.runs[k] += 1;
                s.ran_after_loss |= s.seen_lost[i].iter().any(Option::is_some);
                for &n in &answered {
                    s.marker[k][n] = true;
                }
                if answered.len() >= quorum {
                    s.marked_runs[k] += 1;
                }
            }
            Action::RestartEmpty(n) => {
                let n = usize::from(n);
                for marker in &mut s.marker {
                    marker[n] = false;
                }
                s.run[n] += 1;
                s.faults += 1;
            }
            Action::Toggle(n) => {
                let n = usize::from(n);
                s.up[n] = !s.up[n];
                s.faults += 1;
            }
            Action::Advance => s.now += 1,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // A run after a run whose marker reached a quorum is a double run.
            Property::always(ONCE, |_, s: &State| {
                (0..K).all(|k| !(s.marked_runs[k] >= 1 && s.runs[k] >= 2))
            }),
            Property::always(NOT_HELD, |_, s: &State| !s.held_wrongly),
            Property::sometimes(RAN, |_, s: &State| s.runs.iter().any(|&r| r >= 1)),
            Property::sometimes(RAN_AFTER_LOSS, |_, s: &State| s.ran_after_loss),
            Property::sometimes(SKIPPED, |_, s: &State| s.skipped),
            Property::sometimes(UNTOLD, |_, s: &State| s.untold),
        ]
    }
}

#[test]
fn a_marked_tick_never_runs_again_across_restarts() {
    let checker = Markers::default().checker().spawn_bfs().join();
    checker.assert_properties();
    println!(
        "[markers] {} states, {} unique: a marked tick never ran again, no tick was held out by an earlier loss",
        checker.state_count(),
        checker.unique_state_count()
    );
}

/// Checks `mutant` until `property` fails; panics if it never does.
fn caught(mutant: Markers, name: &str, property: &'static str) {
    let checker = mutant
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into_iter().collect()))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("the {name} mutant was not caught"));
    let steps = path.into_actions();
    println!(
        "[markers, mutant {name}] `{property}` fails in {} steps: {steps:?}",
        steps.len()
    );
}

#[test]
fn mutant_count_every_answer_is_caught() {
    let mutant = Markers {
        count_every_answer: true,
        ..Markers::default()
    };
    caught(mutant, "count_every_answer", ONCE);
}

#[test]
fn mutant_hold_out_every_tick_is_caught() {
    let mutant = Markers {
        hold_out_every_tick: true,
        ..Markers::default()
    };
    caught(mutant, "hold_out_every_tick", NOT_HELD);
}

#[test]
fn mutant_held_out_at_the_loss_is_caught() {
    let mutant = Markers {
        held_out_at_the_loss: true,
        ..Markers::default()
    };
    caught(mutant, "held_out_at_the_loss", ONCE);
}
