//! Run-once tick markers across restarts, as their own small model (issue 26, item 3): a tick
//! runs at most once however nodes restart empty and come and go.
//!
//! Three nodes; two instances of one job, each of which has met every node before (warm
//! clients: a client that first meets a node after its empty restart cannot know, which
//! `docs/safety.md` states as a limit). An attempt at the tick is one step: the lock's mutual
//! exclusion (checked by the main model) serialises the instances, so an attempt reads the
//! marker from the nodes that are up, and either skips (a node answered with the marker), or
//! runs the tick and writes the marker on the nodes that are up (a quorum, or the tick was not
//! marked and may run again: that is the library's `RunPolicy` to choose, not a double run of
//! a marked tick), or finds it cannot tell (too few answers it can trust) and tries later.
//! Faults: a node restarts empty (its marker gone; every instance sees the restart on its next
//! call, by the run id) and a node goes down or comes back, each a bounded number of times.
//!
//! "Absent" is decided by the library's rule, `quorum::marker_absent`, over the answers from
//! nodes the instance has not seen lose their data. Checked: a marked tick never runs again;
//! coverage that a tick runs, that it is skipped as already run, and that a restart makes an
//! attempt unable to tell. The mutant `count_every_answer` puts the old rule back (every
//! "absent" answer counted): the checker finds the second run.

use stateright::{Checker, HasDiscoveries, Model, Property};

use crate::core::quorum;

/// Nodes in the model.
const N: usize = 3;
/// Instances of the job.
const I: usize = 2;
/// Faults at most (restarts and outages together).
const FAULTS: u8 = 3;

const ONCE: &str = "a marked tick never runs again";
const RAN: &str = "coverage: the tick ran";
const SKIPPED: &str = "coverage: an attempt found the marker";
const UNTOLD: &str = "coverage: an attempt could not tell";

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    marker: [bool; N],
    up: [bool; N],
    /// Whether instance `i` has seen node `n` lose its data (within the marker's expiry).
    seen_lost: [[bool; N]; I],
    /// Runs of the tick whose marker reached a quorum, and runs in all.
    marked_runs: u8,
    runs: u8,
    skipped: bool,
    untold: bool,
    faults: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    /// Instance `i` attempts the tick.
    Attempt(u8),
    /// Node `n` restarts without its data.
    RestartEmpty(u8),
    /// Node `n` goes down, or comes back.
    Toggle(u8),
}

#[derive(Clone, Copy, Debug, Default)]
struct Markers {
    /// Every "absent" answer counts, as before issue 26 (the bug).
    count_every_answer: bool,
}

impl Model for Markers {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            marker: [false; N],
            up: [true; N],
            seen_lost: [[false; N]; I],
            marked_runs: 0,
            runs: 0,
            skipped: false,
            untold: false,
            faults: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // Past a second run the checker has what it looks for.
        if s.runs > 1 {
            return;
        }
        for i in 0..I {
            actions.push(Action::Attempt(u8::try_from(i).unwrap_or(0)));
        }
        if s.faults < FAULTS {
            for n in 0..N {
                let n8 = u8::try_from(n).unwrap_or(0);
                actions.push(Action::RestartEmpty(n8));
                actions.push(Action::Toggle(n8));
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Attempt(i) => {
                let i = usize::from(i);
                let answered: Vec<usize> = (0..N).filter(|&n| s.up[n]).collect();
                if answered.iter().any(|&n| s.marker[n]) {
                    s.skipped = true;
                    return Some(s);
                }
                let clean = answered
                    .iter()
                    .filter(|&&n| self.count_every_answer || !s.seen_lost[i][n])
                    .count();
                if !quorum::marker_absent(clean, quorum::quorum(N)) {
                    s.untold = true;
                    return Some(s);
                }
                s.runs += 1;
                for &n in &answered {
                    s.marker[n] = true;
                }
                if answered.len() >= quorum::quorum(N) {
                    s.marked_runs += 1;
                }
            }
            Action::RestartEmpty(n) => {
                let n = usize::from(n);
                s.marker[n] = false;
                // Both instances had met the node: each sees the new run id on its next call.
                for seen in &mut s.seen_lost {
                    seen[n] = true;
                }
                s.faults += 1;
            }
            Action::Toggle(n) => {
                let n = usize::from(n);
                s.up[n] = !s.up[n];
                s.faults += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // A run after a run whose marker reached a quorum is a double run.
            Property::always(ONCE, |_, s: &State| !(s.marked_runs >= 1 && s.runs >= 2)),
            Property::sometimes(RAN, |_, s: &State| s.runs >= 1),
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
        "[markers] {} states, {} unique: a marked tick never ran again",
        checker.state_count(),
        checker.unique_state_count()
    );
}

#[test]
fn mutant_count_every_answer_is_caught() {
    let checker = Markers {
        count_every_answer: true,
    }
    .checker()
    .finish_when(HasDiscoveries::AnyOf([ONCE].into_iter().collect()))
    .spawn_bfs()
    .join();
    let path = checker
        .discovery(ONCE)
        .unwrap_or_else(|| panic!("the count-every-answer mutant was not caught"));
    let steps = path.into_actions();
    println!(
        "[markers, mutant count_every_answer] `{ONCE}` fails in {} steps: {steps:?}",
        steps.len()
    );
}
