//! Waiting, as its own small model: a waiter's rounds between two changes of the key
//! it waits for (the holder's grant, release, expiry) are bounded.
//!
//! Three nodes; a holder whose key stands on a bare majority (nodes 0 and 1: node 2 missed its
//! acquisition, as a fresh client's often did); one waiting client. A waiter's round sets its
//! value where the key is absent and wins with a quorum; a round that does not win is undone
//! (its value deleted where it was set), and the undo announces itself to waiters only as the
//! library's rule says (`quorum::undo_announces`). The first refusal registers the waiter (the
//! waiters marker, from which on a release publishes a notice), which then reads the key as its
//! timer does. A registered waiter makes a round on a notice, or when its timer finds the key
//! free on a quorum (`timing::quorum_free_in` of the nodes' `PTTL`s: a timer that finds the key
//! still standing reads again instead of making a round). The holder may release (a notice
//! when the marker exists), let its key expire (no notice) or acquire again when a quorum is
//! free: each is a change of the key, bounded in number so that the model is finite.
//!
//! The waiter may also start behind a predecessor of its own client that won the lock and let
//! it go silently (forgotten, expired or lost: no release notice), after which the holder took
//! the key: its queue still waits for the predecessor's release (`handed`). Registered, it waits
//! for its turn: a notice of another release makes it read the key (`PTTL`) and take its turn
//! when a quorum is free; so does its timer.
//!
//! Checked: at most one round between two changes (after its first refusal the waiter waits for
//! a notice or for its read of the key to find it free, it makes no second round at once),
//! mutual exclusion, that the waiter can acquire (also behind a silent predecessor), and the
//! lower bound: a release notice that finds the key free on a quorum is followed by the
//! waiter's round within two of its own steps (a read, a round), its timer not counted. The
//! mutant `self_wake` (every undo announces itself) makes the waiter, woken by its own undo's
//! notice, make round after round while the holder's key stands on two nodes, and the checker
//! finds the second round. The mutant `keep_handed` waits for the silent predecessor's notice
//! only: the holder's release is announced and the waiter has no step to take but its timer.

use stateright::{Checker, HasDiscoveries, Model, Property};

use crate::core::{quorum, timing};

/// Nodes in the model.
const N: usize = 3;
/// Changes of the key the holder makes at most (release, expiry, acquisition).
const CHANGES: u8 = 3;
/// The bound checked: a waiter's rounds between two changes of the key.
const ROUNDS: u8 = 1;

const BOUNDED: &str = "a waiter's rounds between two changes of the key are bounded";
const MUTEX: &str = "mutual exclusion";
const ACQUIRED: &str = "coverage: the waiter acquired";
const AFTER_SILENT: &str =
    "coverage: the waiter acquired behind a predecessor that let go silently";
const WAKES: &str = "a release notice is followed by a round within two of the waiter's steps";
/// The waiter's own steps (its timer not counted) within which a release notice leads to a round.
const WAKE_STEPS: usize = 2;

/// What a node's lock key holds.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Key {
    Absent,
    Holder,
    Waiter,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Phase {
    /// About to make its first round.
    Round,
    /// Its round did not win: the undo is next, on the nodes where its value was set.
    Undo,
    /// Registered, waiting for a notice or its timer.
    Waiting,
    /// Registered, waiting for its turn: its predecessor's release (`handed`).
    Turn,
    Won,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    nodes: [Key; N],
    holder: bool,
    /// The waiters marker stands (the waiter registered).
    marker: bool,
    phase: Phase,
    /// Its queue waits for the release of the lock its predecessor won (which ended silently).
    handed: bool,
    /// It started behind such a predecessor.
    silent: bool,
    /// Release notices published since the waiter's round started (its epoch).
    notices: u8,
    /// The waiter's rounds since the key last changed (saturating above the bound).
    rounds: u8,
    changes: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    HolderReleases,
    HolderExpires,
    HolderAcquires,
    WaiterRound,
    WaiterUndo,
    /// A waiter waiting for its turn reads the key on a notice of another release.
    WaiterReads,
    /// Its timer: the key may be free on a quorum.
    WaiterTimer,
}

#[derive(Clone, Copy, Debug, Default)]
struct Waiting {
    /// Every undo announces itself (the undo runs the ordinary release script).
    self_wake: bool,
    /// Only the predecessor's own release notice (or the timer) ends the wait for the turn.
    keep_handed: bool,
}

fn count(s: &State, k: Key) -> usize {
    s.nodes.iter().filter(|&&n| n == k).count()
}

fn quorum_of_n() -> usize {
    quorum::quorum(N)
}

/// The waiter's timer: a round only once the key may be free on a quorum, as the library's
/// `Engine::holder_pause` reads it (a held key has seconds left, an absent one answers `-2`).
fn timer_allows_round(s: &State) -> bool {
    let pttls: Vec<Option<i64>> = s
        .nodes
        .iter()
        .map(|&k| Some(if k == Key::Absent { -2 } else { 1_000 }))
        .collect();
    timing::quorum_free_in(&pttls, quorum_of_n()).is_none_or(|d| d <= timing::HOLDER_READ_AGAIN)
}

/// A change of the key: the count of rounds starts again.
fn changed(s: &mut State) {
    s.rounds = 0;
    s.changes += 1;
}

impl Model for Waiting {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        [false, true]
            .into_iter()
            .map(|silent| State {
                nodes: [Key::Holder, Key::Holder, Key::Absent],
                holder: true,
                marker: false,
                phase: Phase::Round,
                handed: silent,
                silent,
                notices: 0,
                rounds: 0,
                changes: 0,
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.changes < CHANGES {
            if s.holder {
                actions.push(Action::HolderReleases);
                actions.push(Action::HolderExpires);
            } else if s.phase != Phase::Won && count(s, Key::Absent) >= quorum_of_n() {
                actions.push(Action::HolderAcquires);
            }
        }
        // Past the bound the checker has what it looks for: no need to go further.
        if s.rounds > ROUNDS {
            return;
        }
        match s.phase {
            Phase::Round => actions.push(Action::WaiterRound),
            Phase::Undo => actions.push(Action::WaiterUndo),
            Phase::Waiting if s.notices > 0 || timer_allows_round(s) => {
                actions.push(Action::WaiterRound);
            }
            Phase::Turn => {
                if s.notices > 0 && !self.keep_handed {
                    actions.push(Action::WaiterReads);
                }
                if timer_allows_round(s) {
                    actions.push(Action::WaiterTimer);
                }
            }
            Phase::Waiting | Phase::Won => {}
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::HolderReleases => {
                for k in &mut s.nodes {
                    if *k == Key::Holder {
                        *k = Key::Absent;
                    }
                }
                s.holder = false;
                if s.marker {
                    s.notices = s.notices.saturating_add(1).min(2);
                }
                changed(&mut s);
            }
            Action::HolderExpires => {
                for k in &mut s.nodes {
                    if *k == Key::Holder {
                        *k = Key::Absent;
                    }
                }
                s.holder = false;
                changed(&mut s);
            }
            Action::HolderAcquires => {
                for k in &mut s.nodes {
                    if *k == Key::Absent {
                        *k = Key::Holder;
                    }
                }
                s.holder = true;
                changed(&mut s);
            }
            Action::WaiterRound => {
                // The round reacts to notices after its start (its epoch).
                s.notices = 0;
                s.rounds = s.rounds.saturating_add(1);
                for k in &mut s.nodes {
                    if *k == Key::Absent {
                        *k = Key::Waiter;
                    }
                }
                s.phase = if count(&s, Key::Waiter) >= quorum_of_n() {
                    Phase::Won
                } else {
                    Phase::Undo
                };
            }
            Action::WaiterUndo => {
                for k in &mut s.nodes {
                    if *k == Key::Waiter {
                        *k = Key::Absent;
                    }
                }
                // The round did not win: its value never stood on a quorum.
                let announces = self.self_wake || quorum::undo_announces(false);
                if announces && s.marker {
                    s.notices = s.notices.saturating_add(1).min(2);
                }
                // The first refusal registers; then, as every later one, the waiter waits for a
                // notice or for its read of the key to find it free on a quorum (behind a
                // predecessor that let go silently, for its turn).
                let first = !s.marker;
                s.marker = true;
                s.phase = if first && s.handed {
                    Phase::Turn
                } else {
                    Phase::Waiting
                };
            }
            Action::WaiterReads => {
                // Notices after the read start a new one.
                s.notices = 0;
                if timer_allows_round(&s) {
                    s.handed = false;
                    s.phase = Phase::Round;
                }
            }
            Action::WaiterTimer => {
                s.handed = false;
                s.phase = Phase::Round;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(BOUNDED, |_, s: &State| s.rounds <= ROUNDS),
            Property::always(MUTEX, |_, s: &State| {
                !(s.phase == Phase::Won && count(s, Key::Holder) >= quorum_of_n())
            }),
            Property::sometimes(ACQUIRED, |_, s: &State| s.phase == Phase::Won),
            Property::sometimes(AFTER_SILENT, |_, s: &State| {
                s.silent && s.phase == Phase::Won
            }),
            Property::always(WAKES, |m: &Waiting, s: &State| {
                let woken = s.marker
                    && matches!(s.phase, Phase::Waiting | Phase::Turn)
                    && s.notices > 0
                    && timer_allows_round(s);
                !woken || m.round_within(s, WAKE_STEPS)
            }),
        ]
    }
}

impl Waiting {
    /// Whether the waiter's own steps, its timer not counted, lead to a round within `steps`.
    fn round_within(&self, s: &State, steps: usize) -> bool {
        if steps == 0 {
            return false;
        }
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.iter().any(|&a| match a {
            Action::WaiterRound => true,
            Action::WaiterReads | Action::WaiterUndo => self
                .next_state(s, a)
                .is_some_and(|next| self.round_within(&next, steps - 1)),
            _ => false,
        })
    }
}

#[test]
fn a_waiters_rounds_between_two_changes_of_the_key_are_bounded() {
    let checker = Waiting::default().checker().spawn_bfs().join();
    checker.assert_properties();
    println!(
        "[waiting] {} states, {} unique: rounds between two changes at most {ROUNDS}",
        checker.state_count(),
        checker.unique_state_count()
    );
}

#[test]
fn mutant_self_wake_is_caught() {
    let checker = Waiting {
        self_wake: true,
        ..Waiting::default()
    }
    .checker()
    .finish_when(HasDiscoveries::AnyOf([BOUNDED].into_iter().collect()))
    .spawn_bfs()
    .join();
    let path = checker
        .discovery(BOUNDED)
        .unwrap_or_else(|| panic!("the self-wake mutant was not caught"));
    let steps = path.into_actions();
    println!(
        "[waiting, mutant self_wake] `{BOUNDED}` fails in {} steps: {steps:?}",
        steps.len()
    );
}

#[test]
fn mutant_keep_handed_is_caught() {
    let checker = Waiting {
        keep_handed: true,
        ..Waiting::default()
    }
    .checker()
    .finish_when(HasDiscoveries::AnyOf([WAKES].into_iter().collect()))
    .spawn_bfs()
    .join();
    let path = checker
        .discovery(WAKES)
        .unwrap_or_else(|| panic!("the keep-handed mutant was not caught"));
    let steps = path.into_actions();
    println!(
        "[waiting, mutant keep_handed] `{WAKES}` fails in {} steps: {steps:?}",
        steps.len()
    );
}
