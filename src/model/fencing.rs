//! An in-memory model of N nodes running the acquire / raise / release / extend-free protocol,
//! driven by proptest through random interleavings of acquisitions (each seeing a random set of
//! reachable nodes, answers in random order), releases, ttl expiry and data loss. It uses the
//! crate's own decision functions ([`Tally`], [`fencing_max`]), and checks that every token
//! handed out is greater than every earlier one.
//!
//! Two kinds of data loss. `LoseData` is a restart nobody noticed (the guard off): allowed while
//! the nodes that keep their data still hold a quorum at the latest token (a lost minority whose
//! counters a majority remembers). `Crash` is what the restart guard handles: any node may
//! restart empty as long as at most a minority is unrepaired at once; it then counts toward no
//! quorum (it answers as failed) until a `Repair` raises its counters to the largest of
//! `N - quorum + 1` clean nodes, as `repair.rs` does. The last test shows the boundary of the
//! first kind: lose a node that was one of only a quorum at the token, and tokens can repeat,
//! which is why `docs/safety.md` asks for the guard, `appendfsync always` or healthy releases.
//!
//! Revokes (`client/revoke.rs`): a revoke reads a quorum, takes the value a quorum of the read
//! holds, raises the counters it writes to the read's highest counter plus one, and deletes
//! that value. A resource that checks the counter (`Redlock::check_token`) reads a quorum of
//! clean nodes and accepts a token at least the highest counter read. Checked: once a revoke
//! reached a quorum, no write with the revoked holder's token is accepted; the mutant that
//! deletes without raising is caught.

use proptest::prelude::*;

use crate::core::quorum::{Answer, Tally, Verdict, quorum};
use crate::core::token::{FencingToken, fencing_max};

#[derive(Debug, Clone, Default)]
struct Node {
    owner: Option<u32>,
    counter: u64,
    /// Restarted empty and not yet repaired: held out of every quorum.
    dirty: bool,
}

#[derive(Debug, Default)]
struct World {
    nodes: Vec<Node>,
    next_owner: u32,
    holders: Vec<(u32, u64)>,
    tokens: Vec<u64>,
    /// Holders revoked on a quorum, with their tokens: never accepted again.
    revoked: Vec<(u32, u64)>,
    /// The highest counter a revoke raised a quorum to (data loss must keep it, as tokens).
    last_revoke: u64,
    /// The mutant: a revoke deletes the value without raising the counters.
    revoke_without_raise: bool,
}

#[derive(Debug, Clone)]
enum Op {
    /// Acquire with these nodes reachable, answering in the order of `order`.
    Acquire {
        reachable: Vec<bool>,
        order: Vec<usize>,
    },
    /// Release holder `which` (modulo the holders) on the reachable nodes.
    Release { which: usize, reachable: Vec<bool> },
    /// Every ttl runs out.
    Expire,
    /// A node restarts empty (only allowed while a quorum of others stands at the last token).
    LoseData { node: usize },
    /// A node restarts empty and the client sees it (only while fewer than a minority are
    /// unrepaired): held out until repaired.
    Crash { node: usize },
    /// Restore a crashed node's counters from the clean nodes among `sources` (the repair needs
    /// `N - quorum + 1` of them to answer, else it waits).
    Repair { node: usize, sources: Vec<bool> },
    /// A revoke reading the nodes of `reads` and writing to those of `writes`.
    Revoke { reads: Vec<bool>, writes: Vec<bool> },
    /// Holder or revoked holder `which` writes to a resource that checks the counters of the
    /// clean nodes of `reads` (when they are a quorum) and accepts a token at least their highest.
    Write { which: usize, reads: Vec<bool> },
}

impl World {
    fn new(n: usize) -> Self {
        World {
            nodes: vec![Node::default(); n],
            ..World::default()
        }
    }

    fn last_token(&self) -> u64 {
        self.tokens.last().copied().unwrap_or(0)
    }

    /// The clean nodes among `set`, if they are a quorum.
    fn quorum_of(&self, set: &[bool]) -> Option<Vec<usize>> {
        let n = self.nodes.len();
        let clean: Vec<usize> = (0..n).filter(|&i| set[i] && !self.nodes[i].dirty).collect();
        (clean.len() >= quorum(n)).then_some(clean)
    }

    /// The revoke: the value a quorum of the read holds, the read's highest counter plus one
    /// raised (unless the mutant) and the value deleted on the nodes written; the holder counts
    /// as revoked once a quorum of clean nodes was written.
    fn revoke(&mut self, reads: &[bool], writes: &[bool]) {
        let n = self.nodes.len();
        let Some(read) = self.quorum_of(reads) else {
            return;
        };
        let owners: Vec<Option<u32>> = read.iter().map(|&i| self.nodes[i].owner).collect();
        let Some(owner) = owners
            .iter()
            .flatten()
            .copied()
            .find(|o| owners.iter().filter(|x| **x == Some(*o)).count() >= quorum(n))
        else {
            return;
        };
        let token = read
            .iter()
            .map(|&i| self.nodes[i].counter)
            .max()
            .unwrap_or(0)
            + 1;
        for (i, _) in writes.iter().enumerate().filter(|(_, w)| **w) {
            let node = &mut self.nodes[i];
            if !self.revoke_without_raise {
                node.counter = node.counter.max(token);
            }
            if node.owner == Some(owner) {
                node.owner = None;
            }
        }
        if self.quorum_of(writes).is_some()
            && let Some(at) = self.holders.iter().position(|(o, _)| *o == owner)
        {
            let holder = self.holders.remove(at);
            self.revoked.push(holder);
            self.last_revoke = self.last_revoke.max(token);
        }
    }

    /// A fenced write checked against the counters: refused, or accepted (an error if its
    /// holder was revoked).
    fn write(&self, which: usize, reads: &[bool]) -> Result<(), String> {
        let all: Vec<(u32, u64)> = self.holders.iter().chain(&self.revoked).copied().collect();
        let (Some(&(owner, token)), Some(read)) =
            (all.get(which % all.len().max(1)), self.quorum_of(reads))
        else {
            return Ok(());
        };
        let highest = read
            .iter()
            .map(|&i| self.nodes[i].counter)
            .max()
            .unwrap_or(0);
        if token >= highest && self.revoked.contains(&(owner, token)) {
            return Err(format!(
                "revoked token {token} accepted (highest counter read {highest}, nodes {:?})",
                self.nodes
            ));
        }
        Ok(())
    }

    /// The acquire script on one node: SET NX, INCR on success.
    fn acquire_on(&mut self, i: usize, owner: u32) -> Option<u64> {
        let node = &mut self.nodes[i];
        if node.owner.is_some() {
            return None;
        }
        node.owner = Some(owner);
        node.counter += 1;
        Some(node.counter)
    }

    /// The release script on one node: raise the counter, delete if ours.
    fn release_on(&mut self, i: usize, owner: u32, token: u64) {
        let node = &mut self.nodes[i];
        node.counter = node.counter.max(token);
        if node.owner == Some(owner) {
            node.owner = None;
        }
    }

    /// An acquisition with the nodes of `reachable` answering in the order of `order`: its
    /// token, if it won, must be above every earlier one.
    fn acquire(&mut self, reachable: &[bool], order: &[usize]) -> Result<(), String> {
        let n = self.nodes.len();
        let owner = self.next_owner;
        self.next_owner += 1;
        let mut tally = Tally::new(n);
        let mut yes = Vec::new();
        let mut verdict = None;
        for &i in order {
            // Answers after the verdict still run on the node (the request was sent).
            let answer = if reachable[i] && !self.nodes[i].dirty {
                match self.acquire_on(i, owner) {
                    Some(c) => {
                        if verdict.is_none() {
                            yes.push((i, c));
                        }
                        Answer::Yes
                    }
                    None => Answer::No,
                }
            } else {
                Answer::Failed
            };
            if verdict.is_none() {
                tally.record(answer);
                verdict = tally.verdict();
            }
        }
        let verdict = verdict.unwrap_or_else(|| tally.final_verdict());
        let counters: Vec<FencingToken> = yes.iter().map(|&(_, c)| FencingToken::new(c)).collect();
        let won = verdict == Verdict::Quorum
            && match fencing_max(&counters, n) {
                Some((_, true)) => true,
                Some((max, false)) => {
                    let max = max.get();
                    // Raise the lower yes-nodes that still hold our key.
                    for &(i, c) in &yes {
                        if c < max && self.nodes[i].owner == Some(owner) {
                            self.nodes[i].counter = self.nodes[i].counter.max(max);
                        }
                    }
                    true
                }
                None => false,
            };
        if won {
            let token = fencing_max(&counters, n).ok_or("no counters")?.0.get();
            if token <= self.last_token() {
                return Err(format!(
                    "token {token} not above {} (history {:?})",
                    self.last_token(),
                    self.tokens
                ));
            }
            self.tokens.push(token);
            self.holders.push((owner, token));
        } else {
            // Failed round: release everywhere reachable, token unknown (0).
            for (i, _) in reachable.iter().enumerate().filter(|(_, r)| **r) {
                self.release_on(i, owner, 0);
            }
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        let n = self.nodes.len();
        match op {
            Op::Acquire { reachable, order } => self.acquire(reachable, order)?,
            Op::Release { which, reachable } => {
                if !self.holders.is_empty() {
                    let (owner, token) = self.holders.remove(which % self.holders.len());
                    for (i, _) in reachable.iter().enumerate().filter(|(_, r)| **r) {
                        self.release_on(i, owner, token);
                    }
                }
            }
            Op::Expire => {
                for node in &mut self.nodes {
                    node.owner = None;
                }
                self.holders.clear();
            }
            Op::Revoke { reads, writes } => self.revoke(reads, writes),
            Op::Write { which, reads } => self.write(*which, reads)?,
            Op::LoseData { node } => {
                let last = self.last_token().max(self.last_revoke);
                let intact = (0..n)
                    .filter(|&i| i != *node && self.nodes[i].counter >= last)
                    .count();
                if intact >= quorum(n) && !self.nodes[*node].dirty {
                    self.nodes[*node] = Node::default();
                }
            }
            Op::Crash { node } => {
                let dirty = self.nodes.iter().filter(|x| x.dirty).count();
                if self.nodes[*node].dirty || dirty < n - quorum(n) {
                    self.nodes[*node] = Node {
                        dirty: true,
                        ..Node::default()
                    };
                }
            }
            Op::Repair { node, sources } => {
                let clean: Vec<u64> = (0..n)
                    .filter(|&i| i != *node && sources[i] && !self.nodes[i].dirty)
                    .map(|i| self.nodes[i].counter)
                    .collect();
                if self.nodes[*node].dirty && clean.len() > n - quorum(n) {
                    let target = &mut self.nodes[*node];
                    target.counter = target.counter.max(clean.iter().copied().max().unwrap_or(0));
                    target.dirty = false;
                }
            }
        }
        Ok(())
    }
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    let reachable = proptest::collection::vec(any::<bool>(), n);
    let order = Just((0..n).collect::<Vec<_>>()).prop_shuffle();
    prop_oneof![
        5 => (reachable.clone(), order).prop_map(|(reachable, order)| Op::Acquire { reachable, order }),
        3 => (any::<usize>(), reachable.clone()).prop_map(|(which, reachable)| Op::Release { which, reachable }),
        2 => Just(Op::Expire),
        1 => (0..n).prop_map(|node| Op::LoseData { node }),
        1 => (0..n).prop_map(|node| Op::Crash { node }),
        2 => (0..n, reachable.clone()).prop_map(|(node, sources)| Op::Repair { node, sources }),
        2 => (reachable.clone(), reachable.clone()).prop_map(|(reads, writes)| Op::Revoke { reads, writes }),
        3 => (any::<usize>(), reachable).prop_map(|(which, reads)| Op::Write { which, reads }),
    ]
}

fn scenario() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (1usize..=9).prop_flat_map(|n| (Just(n), proptest::collection::vec(op(n), 1..80)))
}

/// Histories where nothing heals the counters: locks only expire (no release), different
/// majorities win, and nodes crash empty and are repaired from random sets of sources.
fn crash_op(n: usize) -> impl Strategy<Value = Op> {
    let reachable = proptest::collection::vec(any::<bool>(), n);
    let order = Just((0..n).collect::<Vec<_>>()).prop_shuffle();
    prop_oneof![
        4 => (reachable.clone(), order).prop_map(|(reachable, order)| Op::Acquire { reachable, order }),
        3 => Just(Op::Expire),
        2 => (0..n).prop_map(|node| Op::Crash { node }),
        3 => (0..n, reachable).prop_map(|(node, sources)| Op::Repair { node, sources }),
    ]
}

fn crash_scenario() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (3usize..=7).prop_flat_map(|n| (Just(n), proptest::collection::vec(crash_op(n), 1..60)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn tokens_only_grow((n, ops) in scenario()) {
        replay(n, &ops)?;
    }

    #[test]
    fn tokens_only_grow_across_repaired_crashes((n, ops) in crash_scenario()) {
        replay(n, &ops)?;
    }

    #[test]
    fn a_revoked_token_is_never_accepted((n, ops) in revoke_scenario()) {
        replay(n, &ops)?;
    }
}

/// Histories about revokes: acquisitions, revokes and checked writes through random quorums,
/// with expiry, releases, crashes and repairs between them.
fn revoke_scenario() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (3usize..=7).prop_flat_map(|n| {
        let reachable = proptest::collection::vec(any::<bool>(), n);
        let order = Just((0..n).collect::<Vec<_>>()).prop_shuffle();
        let op = prop_oneof![
            4 => (reachable.clone(), order).prop_map(|(reachable, order)| Op::Acquire { reachable, order }),
            4 => (reachable.clone(), reachable.clone()).prop_map(|(reads, writes)| Op::Revoke { reads, writes }),
            6 => (any::<usize>(), reachable.clone()).prop_map(|(which, reads)| Op::Write { which, reads }),
            1 => (any::<usize>(), reachable.clone()).prop_map(|(which, reachable)| Op::Release { which, reachable }),
            1 => Just(Op::Expire),
            1 => (0..n).prop_map(|node| Op::Crash { node }),
            2 => (0..n, reachable).prop_map(|(node, sources)| Op::Repair { node, sources }),
        ];
        (Just(n), proptest::collection::vec(op, 1..60))
    })
}

/// The mutant that deletes the holder's value without raising the counters: a resource that
/// checks them still accepts the revoked token (the revoke's own reads and writes are whole
/// quorums; the check reads another).
#[test]
fn a_revoke_that_does_not_raise_is_caught() {
    let only = |set: &[usize]| (0..5).map(|i| set.contains(&i)).collect::<Vec<_>>();
    let steps = [
        Op::Acquire {
            reachable: only(&[0, 1, 2, 3, 4]),
            order: (0..5).collect(),
        },
        Op::Revoke {
            reads: only(&[0, 1, 2]),
            writes: only(&[0, 1, 2, 3, 4]),
        },
        Op::Write {
            which: 0,
            reads: only(&[2, 3, 4]),
        },
    ];
    let run = |mutant: bool| {
        let mut world = World::new(5);
        world.revoke_without_raise = mutant;
        steps.iter().try_for_each(|step| world.apply(step))
    };
    run(false).expect("the revoked token is refused");
    let err = run(true).expect_err("the mutant accepts the revoked token");
    assert!(err.contains("revoked token 1 accepted"), "{err}");
    // The property test finds the mutant by itself too.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(512));
    let found = runner.run(&revoke_scenario(), |(n, ops)| {
        let mut world = World::new(n);
        world.revoke_without_raise = true;
        for op in &ops {
            if let Err(e) = world.apply(op) {
                prop_assert!(false, "{e}");
            }
        }
        Ok(())
    });
    assert!(found.is_err(), "the random histories catch the mutant");
}

/// Applies `ops` to a fresh world of `n` nodes; fails at the first token that did not grow.
fn replay(n: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut world = World::new(n);
    for op in ops {
        if let Err(e) = world.apply(op) {
            prop_assert!(false, "{e} after {op:?}");
        }
    }
    Ok(())
}

/// Crashes the guard sees, never released locks, different majorities: a repair from
/// `N - quorum + 1` clean nodes is what keeps tokens growing. Without it (the crashed nodes
/// counting again at once, empty) this schedule repeats a token.
#[test]
fn repaired_crashes_keep_tokens_growing() {
    let only = |set: &[usize]| (0..5).map(|i| set.contains(&i)).collect::<Vec<_>>();
    let order: Vec<usize> = (0..5).collect();
    let acquire = |set: &[usize]| Op::Acquire {
        reachable: only(set),
        order: order.clone(),
    };
    let run = |repair: bool| {
        let mut world = World::new(5);
        let mut steps = vec![acquire(&[0, 1, 2]), Op::Expire];
        for node in [0, 1] {
            steps.push(Op::Crash { node });
            if repair {
                steps.push(Op::Repair {
                    node,
                    sources: only(&[2, 3, 4]),
                });
            } else {
                world.nodes[node].dirty = false;
            }
        }
        steps.push(acquire(&[0, 1, 3]));
        steps.iter().try_for_each(|step| {
            if !repair {
                for node in &mut world.nodes {
                    node.dirty = false;
                }
            }
            world.apply(step)
        })
    };
    run(true).expect("tokens grow with repairs");
    assert!(run(false).is_err(), "without repairs the token repeats");
}

/// Counters drift apart when different majorities win; the raise keeps the next token above.
#[test]
fn different_majorities_still_give_growing_tokens() {
    let mut world = World::new(5);
    let all = [true; 5];
    let order: Vec<usize> = (0..5).collect();
    let only = |set: &[usize]| (0..5).map(|i| set.contains(&i)).collect::<Vec<_>>();
    let steps = [
        Op::Acquire {
            reachable: only(&[0, 1, 2]),
            order: order.clone(),
        },
        Op::Expire,
        Op::Acquire {
            reachable: only(&[2, 3, 4]),
            order: order.clone(),
        },
        Op::Expire,
        Op::Acquire {
            reachable: only(&[0, 1, 3]),
            order: order.clone(),
        },
        Op::Release {
            which: 0,
            reachable: all.to_vec(),
        },
        Op::Acquire {
            reachable: all.to_vec(),
            order,
        },
    ];
    for step in &steps {
        world.apply(step).unwrap();
    }
    assert_eq!(world.tokens.len(), 4);
}

/// The boundary of the guarantee: a lock held by exactly a quorum, never released (its holder
/// crashed), then one of those nodes loses its data: a later majority that does not include
/// the two remaining nodes hands out the same token again.
#[test]
fn losing_one_of_only_a_quorum_at_the_token_can_repeat_it() {
    let mut world = World::new(5);
    let only = |set: &[usize]| (0..5).map(|i| set.contains(&i)).collect::<Vec<_>>();
    let order: Vec<usize> = (0..5).collect();
    world
        .apply(&Op::Acquire {
            reachable: only(&[0, 1, 2]),
            order: order.clone(),
        })
        .unwrap();
    world.apply(&Op::Expire).unwrap();
    // Bypass the precondition: node 0 restarts empty although only 0, 1, 2 stood at token 1.
    world.nodes[0] = Node::default();
    let err = world
        .apply(&Op::Acquire {
            reachable: only(&[0, 3, 4]),
            order,
        })
        .unwrap_err();
    assert!(err.contains("token 1 not above 1"), "{err}");
}
