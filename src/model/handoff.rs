//! Handing a lock over (`Redlock::resume`), as a small model of its own: a resume succeeds only
//! if no other holder came between the acquisition and the resume, unless a call of the
//! acquisition itself lands late; and in every case the fencing token orders the two.
//!
//! Three nodes, each with its lock key (free, A's value or B's) and its fencing counter. Steps,
//! interleaved every way:
//! - A (the dispatcher) acquires once with the acquire script on the nodes of a quorum that
//!   answer in time, then raises their counters to its token (as the library's grant does);
//!   with `late_calls`, its call to each other node stays in flight and may land at any later
//!   step (a delayed packet).
//! - Any node's key expires at any time (time itself is not modelled: an expiry may come as
//!   early as the adversary likes).
//! - A's extensions keep landing at any time (the dispatcher's own late calls): the EXTEND
//!   script with A's token, which re-sets an absent key only where the counter is at most the
//!   token.
//! - B acquires once the same way; refused, it undoes what it set.
//! - A worker resumes A's value: the resume round counts the nodes where A's value stands
//!   (the EXTEND script with token 0: never a re-set).
//!
//! Checked: with no late acquisition call, a resume never succeeds after B held the lock
//! ("no holder between"); with late calls that property fails (the delayed-packet case,
//! `docs/safety.md`, "Handing a lock over"), and "the tokens order them" (A's token below B's)
//! holds regardless. The mutant `reset_any_absent` lets the resume re-set absent keys without
//! the counter rule: the checker finds a resume after B.

use stateright::{Checker, HasDiscoveries, Model, Property};

use crate::core::quorum;

/// Nodes in the model.
const N: usize = 3;
const Q: usize = quorum::quorum(N);

const BETWEEN: &str = "no holder between the acquisition and a successful resume";
const ORDERED: &str = "a resumed token is below every holder's after it";
const RESUMED: &str = "coverage: a resume succeeds";
const RESUME_REFUSED_AFTER_B: &str = "coverage: B held, then a resume is refused";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Holder {
    A,
    B,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    key: [Option<Holder>; N],
    counter: [u8; N],
    /// A's token, once granted.
    a: Option<u8>,
    /// A's acquire calls still in flight.
    a_late: [bool; N],
    /// B's attempt made, and its token if granted.
    b_tried: bool,
    b: Option<u8>,
    /// A resume of A's value succeeded, and whether B had been granted before it.
    resumed: bool,
    b_before_resume: bool,
    refused_after_b: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    /// A's round; the nodes of the mask answer in time.
    AcquireA(u8),
    /// A's in-flight acquire call lands on node `n`.
    LateA(u8),
    /// A's extension lands on node `n`.
    ExtendA(u8),
    /// Node `n`'s key expires.
    Expire(u8),
    /// B's round on the nodes of the mask.
    AcquireB(u8),
    /// The worker's resume round, answered by the nodes of the mask.
    Resume(u8),
}

#[derive(Clone, Copy, Debug, Default)]
struct Handoff {
    /// A's acquire calls to nodes that did not answer in time may land later.
    late_calls: bool,
    /// The resume re-sets an absent key anywhere and counts it (the bug).
    reset_any_absent: bool,
}

/// The nodes of `mask`.
fn nodes(mask: u8) -> impl Iterator<Item = usize> {
    (0..N).filter(move |&n| mask & (1 << n) != 0)
}

/// The masks of at least a quorum of nodes.
fn quorum_masks() -> impl Iterator<Item = u8> {
    (0u8..(1 << N)).filter(|m| m.count_ones() as usize >= Q)
}

/// A round of the acquire script by `who` on the nodes of `mask`: the key set where free (the
/// counter raised there), then, granted, the counters of the yes nodes raised to the token.
fn acquire(s: &mut State, who: Holder, mask: u8) -> Option<u8> {
    let mut yes = Vec::new();
    for n in nodes(mask) {
        if s.key[n].is_none() {
            s.key[n] = Some(who);
            s.counter[n] = s.counter[n].saturating_add(1);
            yes.push(n);
        }
    }
    if yes.len() < Q {
        for n in yes {
            s.key[n] = None; // the undo
        }
        return None;
    }
    let token = yes.iter().map(|&n| s.counter[n]).max().unwrap_or(0);
    for n in yes {
        s.counter[n] = s.counter[n].max(token);
    }
    Some(token)
}

impl Model for Handoff {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            key: [None; N],
            counter: [0; N],
            a: None,
            a_late: [false; N],
            b_tried: false,
            b: None,
            resumed: false,
            b_before_resume: false,
            refused_after_b: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.a.is_none() {
            actions.extend(quorum_masks().map(Action::AcquireA));
            return;
        }
        for n in 0..N {
            let n8 = u8::try_from(n).unwrap_or(0);
            if s.a_late[n] {
                actions.push(Action::LateA(n8));
            }
            if s.key[n].is_some() {
                actions.push(Action::Expire(n8));
            }
            actions.push(Action::ExtendA(n8));
        }
        if !s.b_tried {
            actions.extend(quorum_masks().map(Action::AcquireB));
        }
        if !s.resumed {
            actions.extend(quorum_masks().map(Action::Resume));
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::AcquireA(mask) => {
                s.a = Some(acquire(&mut s, Holder::A, mask)?);
                if self.late_calls {
                    for n in 0..N {
                        s.a_late[n] = mask & (1 << n) == 0;
                    }
                }
            }
            Action::LateA(n) => {
                let n = usize::from(n);
                s.a_late[n] = false;
                if s.key[n].is_none() {
                    s.key[n] = Some(Holder::A);
                    s.counter[n] = s.counter[n].saturating_add(1);
                }
            }
            Action::ExtendA(n) => {
                let (n, t) = (usize::from(n), s.a.unwrap_or(0));
                match s.key[n] {
                    Some(Holder::A) => {}
                    Some(Holder::B) => return Some(s),
                    None if s.counter[n] > t => return Some(s),
                    None => s.key[n] = Some(Holder::A),
                }
                s.counter[n] = s.counter[n].max(t);
            }
            Action::Expire(n) => s.key[usize::from(n)] = None,
            Action::AcquireB(mask) => {
                s.b_tried = true;
                s.b = acquire(&mut s, Holder::B, mask);
            }
            Action::Resume(mask) => {
                let mut yes = 0;
                for n in nodes(mask) {
                    match s.key[n] {
                        Some(Holder::A) => yes += 1,
                        None if self.reset_any_absent => {
                            s.key[n] = Some(Holder::A);
                            yes += 1;
                        }
                        _ => {}
                    }
                }
                if yes >= Q {
                    s.resumed = true;
                    s.b_before_resume = s.b.is_some();
                } else if s.b.is_some() {
                    s.refused_after_b = true;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(BETWEEN, |_, s: &State| !(s.resumed && s.b_before_resume)),
            Property::always(ORDERED, |_, s: &State| match (s.resumed, s.a, s.b) {
                (true, Some(a), Some(b)) => a < b,
                _ => true,
            }),
            Property::sometimes(RESUMED, |_, s: &State| s.resumed),
            Property::sometimes(RESUME_REFUSED_AFTER_B, |_, s: &State| s.refused_after_b),
        ]
    }
}

/// The actions of a discovered path up to the first state where [`BETWEEN`] fails (the path
/// may run on past it).
fn until_between_fails(path: stateright::Path<State, Action>) -> Vec<Action> {
    path.into_vec()
        .into_iter()
        .take_while(|(s, _)| !(s.resumed && s.b_before_resume))
        .filter_map(|(_, a)| a)
        .collect()
}

#[test]
fn a_resume_never_follows_another_holder_without_late_acquire_calls() {
    let checker = Handoff::default().checker().spawn_bfs().join();
    checker.assert_properties();
    println!(
        "[handoff] {} states, {} unique: no holder between an acquisition and its resume",
        checker.state_count(),
        checker.unique_state_count()
    );
}

#[test]
fn with_late_acquire_calls_only_the_tokens_order_them() {
    let checker = Handoff {
        late_calls: true,
        ..Handoff::default()
    }
    .checker()
    .spawn_bfs()
    .join();
    checker.assert_no_discovery(ORDERED);
    let path = checker
        .discovery(BETWEEN)
        .unwrap_or_else(|| panic!("a late acquire call should let a resume follow B"));
    let steps = until_between_fails(path);
    println!(
        "[handoff, late acquire calls] {} states, {} unique; `{BETWEEN}` fails in {} steps \
         (the tokens still order them): {steps:?}",
        checker.state_count(),
        checker.unique_state_count(),
        steps.len()
    );
}

#[test]
fn mutant_reset_any_absent_is_caught() {
    let checker = Handoff {
        reset_any_absent: true,
        ..Handoff::default()
    }
    .checker()
    .finish_when(HasDiscoveries::AnyOf([BETWEEN].into_iter().collect()))
    .spawn_bfs()
    .join();
    let path = checker
        .discovery(BETWEEN)
        .unwrap_or_else(|| panic!("the reset-any-absent mutant was not caught"));
    let steps = until_between_fails(path);
    println!(
        "[handoff, mutant reset_any_absent] `{BETWEEN}` fails in {} steps: {steps:?}",
        steps.len()
    );
}
