//! Symmetry reduction: states that differ only by a renaming of the nodes, or of the clients,
//! are one state for the checker (stateright's [`Representative`], used by the depth-first
//! checker).
//!
//! **Why it is sound.** Nothing in the model or its properties depends on *which* node or which
//! client is which: every node runs the same scripts with the same configuration, every client
//! the same steps with the same budgets, the fault budgets are global, and every property is
//! stated over all nodes or all clients (the coverage bit masks are permuted with the clients).
//! A renaming maps every run to a run (the actions are renamed alike) and keeps every property's
//! value, so the renamed states reach the same verdicts; the checker explores one state of each
//! class. A node's identity is its index; a client's is its index *and* the `client` field of
//! the owner values it drew (stored on nodes, in queues, in refusals), renamed together.
//!
//! **The representative.** Nodes are sorted by everything the state holds about them (the node,
//! each client's connection to it, each queue to it, each round's answer from it): equal keys
//! are equal columns, so the sorted state does not depend on the order it started from. Clients
//! are few (2 or 3): every client permutation is tried and the smallest node-sorted state is
//! kept. Node permutations commute with client permutations, so that minimum is the same for
//! every state of a class.

use std::cmp::Ordering;

use stateright::Representative;

use super::{Ans, ClientS, Op, Phase, Req, State, Val};

/// Compares everything a state holds about nodes `a` and `b` (the node, then each client's
/// connection to it, queue to it and round answer from it): the key nodes are sorted by.
fn cmp_columns(s: &State, a: usize, b: usize) -> Ordering {
    let nodes = s.nodes.len();
    s.nodes[a].cmp(&s.nodes[b]).then_with(|| {
        for (c, client) in s.clients.iter().enumerate() {
            let o = client.conns[a]
                .cmp(&client.conns[b])
                .then_with(|| s.req[c * nodes + a].cmp(&s.req[c * nodes + b]))
                .then_with(|| {
                    round_answers(&client.phase).map_or(Ordering::Equal, |r| r[a].cmp(&r[b]))
                });
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    })
}

fn round_answers(p: &Phase) -> Option<&Vec<Option<Ans>>> {
    match p {
        Phase::Acquire { round, .. } | Phase::Raise { round, .. } | Phase::Extend { round } => {
            Some(&round.answers)
        }
        Phase::Idle { .. } | Phase::Hold => None,
    }
}

/// The state with its nodes in the canonical order.
fn sort_nodes(s: &State) -> State {
    let nodes = s.nodes.len();
    let mut order: Vec<usize> = (0..nodes).collect();
    order.sort_by(|&a, &b| cmp_columns(s, a, b));
    if order.iter().enumerate().all(|(i, &n)| i == n) {
        return s.clone();
    }
    let mut out = s.clone();
    for (i, &n) in order.iter().enumerate() {
        out.nodes[i] = s.nodes[n].clone();
        for c in 0..s.clients.len() {
            out.clients[c].conns[i] = s.clients[c].conns[n].clone();
            out.req[c * nodes + i] = s.req[c * nodes + n].clone();
        }
    }
    for (c, client) in out.clients.iter_mut().enumerate() {
        if let Phase::Acquire { round, .. } | Phase::Raise { round, .. } | Phase::Extend { round } =
            &mut client.phase
        {
            let before = round_answers(&s.clients[c].phase).expect("same phase");
            for (i, &n) in order.iter().enumerate() {
                round.answers[i] = before[n];
            }
        }
    }
    out
}

/// The state with client `c` renamed `perm[c]`.
fn rename_clients(s: &State, perm: &[usize]) -> State {
    let nodes = s.nodes.len();
    let val = |v: Val| Val {
        client: perm[usize::from(v.client)] as u8,
        attempt: v.attempt,
    };
    let op = |o: Op| match o {
        Op::Acquire(v) => Op::Acquire(val(v)),
        Op::SetNx(v) => Op::SetNx(val(v)),
        Op::Incr => Op::Incr,
        Op::RaiseFence(v, t) => Op::RaiseFence(val(v), t),
        Op::Extend(v, t) => Op::Extend(val(v), t),
        Op::Release(v, t) => Op::Release(val(v), t),
    };
    let bits = |m: u8| {
        (0..perm.len())
            .filter(|&c| m & (1 << c) != 0)
            .fold(0u8, |acc, c| acc | (1 << perm[c]))
    };
    let mut out = s.clone();
    for node in &mut out.nodes {
        if let Some((v, _)) = node.key.as_mut() {
            *v = val(*v);
        }
    }
    for (c, client) in s.clients.iter().enumerate() {
        let mut moved: ClientS = client.clone();
        if let Some(l) = moved.lock.as_mut() {
            l.val = val(l.val);
        }
        match &mut moved.phase {
            Phase::Acquire { val: v, round } | Phase::Raise { val: v, round, .. } => {
                *v = val(*v);
                rename_answers(&mut round.answers, &val);
            }
            Phase::Extend { round } => rename_answers(&mut round.answers, &val),
            Phase::Idle { .. } | Phase::Hold => {}
        }
        out.clients[perm[c]] = moved;
        for n in 0..nodes {
            out.req[perm[c] * nodes + n] = s.req[c * nodes + n]
                .iter()
                .map(|r| Req {
                    rid: r.rid,
                    op: op(r.op),
                })
                .collect();
        }
    }
    out.seen.granted = bits(s.seen.granted);
    out.seen.extended = bits(s.seen.extended);
    out.seen.released = bits(s.seen.released);
    out
}

fn rename_answers(answers: &mut [Option<Ans>], val: &impl Fn(Val) -> Val) {
    for a in answers.iter_mut() {
        if let Some(Ans::No(Some(v)) | Ans::Set(Some(v))) = a {
            *v = val(*v);
        }
    }
}

/// Every permutation of `0..k` (k is 2 or 3 here).
fn permutations(k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in permutations(k - 1) {
        for i in 0..k {
            let mut q = p.clone();
            q.insert(i, k - 1);
            out.push(q);
        }
    }
    out
}

impl Representative for State {
    fn representative(&self) -> Self {
        permutations(self.clients.len())
            .iter()
            .map(|perm| {
                if perm.iter().enumerate().all(|(i, &c)| i == c) {
                    sort_nodes(self)
                } else {
                    sort_nodes(&rename_clients(self, perm))
                }
            })
            .min()
            .expect("at least one permutation")
    }
}

#[cfg(test)]
mod tests {
    use stateright::{Model, Representative};

    use super::super::{Config, Redlock, State};
    use super::rename_clients;

    /// Walks a few hundred states: the representative is the same for a state and for its
    /// renamings, and renaming twice by a swap gives the state back.
    #[test]
    fn representatives_are_canonical() {
        let model = Redlock::new(Config {
            crashes: 1,
            ..Config::base()
        });
        let mut frontier: Vec<State> = model.init_states();
        let mut seen = 0;
        while let Some(s) = frontier.pop() {
            if seen > 400 {
                break;
            }
            seen += 1;
            let rep = s.representative();
            assert_eq!(rep.representative(), rep, "not idempotent");
            let swapped = rename_clients(&s, &[1, 0]);
            assert_eq!(rename_clients(&swapped, &[1, 0]), s);
            assert_eq!(
                swapped.representative(),
                rep,
                "a client swap changed the class"
            );
            let mut actions = Vec::new();
            model.actions(&s, &mut actions);
            frontier.extend(actions.into_iter().filter_map(|a| model.next_state(&s, a)));
        }
    }
}
