//! The nodes: the scripts of `src/scripts.rs`, time passing (key expiry, clocks), the repair,
//! and the steps fairness requires before time passes in the quiet phase.

use std::time::Duration;

use super::{Action, Op, Phase, Redlock, State, Val};
use crate::core::repair::repair_sources_required;

impl Redlock {
    // ---- nodes: the scripts of src/scripts.rs -------------------------------------------

    pub(super) fn apply(&self, s: &mut State, n: usize, op: Op) -> Option<(i8, Option<Val>)> {
        let ttl = self.cfg.ttl;
        let node = &mut s.nodes[n];
        let holder = node.key.map(|(v, _)| v);
        match op {
            // SET NX PX, INCR on success.
            Op::Acquire(val) => {
                if holder.is_some() {
                    return Some((0, holder));
                }
                node.key = Some((val, ttl));
                node.counter += 1;
                Some((node.counter as i8, None))
            }
            // SET NX PX GET: nil (0 here) when set, else the value that holds the key.
            Op::SetNx(val) => {
                if holder.is_some() {
                    return Some((0, holder));
                }
                node.key = Some((val, ttl));
                Some((1, None))
            }
            // INCR, whatever the SET did.
            Op::Incr => {
                node.counter += 1;
                Some((node.counter as i8, None))
            }
            Op::RaiseFence(val, token) => {
                if holder != Some(val) {
                    return Some((0, holder));
                }
                node.counter = node.counter.max(token);
                Some((1, None))
            }
            // EXTEND (scripts.rs), with the late-extension fix: an absent key is re-set only where
            // the counter is at most our token (a later acquisition leaves a quorum above it).
            Op::Extend(val, token) => {
                let r = match holder {
                    Some(v) if v == val => {
                        node.key = Some((val, ttl));
                        1
                    }
                    None if self.cfg.mutants.extend_recreates || node.counter <= token => {
                        node.key = Some((val, ttl));
                        2
                    }
                    _ => return Some((0, holder)),
                };
                node.counter = node.counter.max(token);
                Some((r, None))
            }
            Op::Release(val, token) => {
                if token > 0 {
                    node.counter = node.counter.max(token);
                }
                if holder == Some(val) {
                    node.key = None;
                }
                None
            }
        }
    }

    /// One second of real time: nodes' keys age (and expire), restarted nodes grow older, and
    /// every client not in `stall` sees its timers move.
    pub(super) fn tick(&self, s: &mut State, stall: u8) {
        let ttl = self.cfg.ttl;
        for node in &mut s.nodes {
            node.age = (node.age + 1).min(ttl + 2);
            if let Some((_, left)) = node.key.as_mut() {
                *left -= 1;
                if *left == 0 {
                    node.key = None;
                }
            }
        }
        let second = Duration::from_secs(1);
        for (c, client) in s.clients.iter_mut().enumerate() {
            if stall & (1 << c) != 0 {
                s.stalls += 1;
                continue;
            }
            for conn in &mut client.conns {
                conn.held_until = conn
                    .held_until
                    .map(|h| h.saturating_sub(second))
                    .filter(|h| !h.is_zero());
            }
            if let Some(lock) = client.lock.as_mut() {
                lock.deadline = lock.deadline.saturating_sub(second);
            }
            match &mut client.phase {
                Phase::Idle { wait } => *wait = wait.saturating_sub(1),
                Phase::Acquire { round, .. } | Phase::Extend { round } => {
                    round.elapsed = (round.elapsed + 1).min(ttl);
                    round.deadline = round.deadline.saturating_sub(second);
                }
                Phase::Raise { since, round, .. } => {
                    *since = (*since + 1).min(ttl);
                    round.elapsed = (round.elapsed + 1).min(ttl);
                    round.deadline = round.deadline.saturating_sub(second);
                }
                Phase::Hold => {}
            }
        }
        if let Some(q) = s.quiet.as_mut() {
            *q = (*q + 1).min(self.cfg.live_within + 1);
        }
    }

    /// `is_lost()` is recorded once true; the quiet phase notes a valid holder.
    pub(super) fn normalize(&self, s: &mut State) {
        self.noop_releases(s);
        for c in 0..s.clients.len() {
            let lost = !self.valid(s, c);
            if let Some(l) = s.clients[c].lock.as_mut() {
                // `ever_lost && !lost` is a violation: keep the flag as it was so the property
                // sees it.
                l.ever_lost |= lost;
            }
        }
        self.canonical_rids(s);
    }

    /// Delivers at once every release at the head of its queue that changes nothing at its node
    /// (its value does not hold the key there, its token is not above the counter). Sound (a
    /// stuttering equivalence, `docs/verification.md`): such a release stays a no-op until it is
    /// delivered (only its own client sends its value, on this connection, where nothing with
    /// that value is queued behind it; the counter only grows while a request is queued, a crash
    /// clearing the queues), nothing reads a release's reply, and the requests behind it may be
    /// delayed by the checker anyway.
    fn noop_releases(&self, s: &mut State) {
        for c in 0..s.clients.len() {
            for n in 0..self.cfg.nodes {
                let ix = self.ix(c, n);
                while let Some(&super::Req {
                    op: Op::Release(val, token),
                    ..
                }) = s.req[ix].front()
                {
                    let node = &s.nodes[n];
                    let noop = node.key.is_none_or(|(v, _)| v != val) && token <= node.counter;
                    if !noop {
                        break;
                    }
                    s.req[ix].pop_front();
                }
            }
        }
    }

    /// Renames round ids to 1 (the calls of the client's current round, and the round) and 0
    /// (every other call). Only whether a call belongs to the current round is ever read
    /// (`record`), so the renaming is a bisimulation: it merges states that differ only by how
    /// many rounds came before, and changes no step's outcome.
    fn canonical_rids(&self, s: &mut State) {
        let nodes = self.cfg.nodes;
        for c in 0..s.clients.len() {
            let current = match &mut s.clients[c].phase {
                Phase::Acquire { round, .. }
                | Phase::Raise { round, .. }
                | Phase::Extend { round } => {
                    let rid = round.rid;
                    round.rid = 1;
                    Some(rid)
                }
                Phase::Idle { .. } | Phase::Hold => None,
            };
            s.clients[c].rid = u8::from(current.is_some());
            for n in 0..nodes {
                for req in &mut s.req[self.ix(c, n)] {
                    req.rid = u8::from(Some(req.rid) == current);
                }
            }
        }
    }

    /// Steps that must happen before time passes in the quiet phase.
    pub(super) fn progress_actions(&self, s: &State, out: &mut Vec<Action>) {
        let n_nodes = self.cfg.nodes;
        for c in 0..self.cfg.clients {
            for n in 0..n_nodes {
                let ix = self.ix(c, n);
                let (cc, nn) = (c as u8, n as u8);
                if !s.req[ix].is_empty() && s.nodes[n].up {
                    out.push(Action::Deliver { c: cc, n: nn });
                }
                if self.repair_possible(s, c, n) {
                    out.push(Action::Repair { c: cc, n: nn });
                }
            }
            match &s.clients[c].phase {
                Phase::Idle { wait: 0 }
                    if s.clients[c].lock.is_none()
                        && s.clients[c].attempts < s.clients[c].budget =>
                {
                    out.push(Action::Start(c as u8));
                }
                Phase::Acquire { round, .. }
                | Phase::Raise { round, .. }
                | Phase::Extend { round }
                    if round.deadline.is_zero() =>
                {
                    out.push(Action::Timeout(c as u8));
                }
                // A user whose lock is lost lets it go (and tries again); once faults stop,
                // every user finishes its work and releases.
                Phase::Hold if !self.valid(s, c) || self.quiet(s) => {
                    out.push(Action::Release(c as u8));
                }
                _ => {}
            }
        }
        for n in 0..n_nodes {
            if !s.nodes[n].up {
                if self.cfg.data_restarts {
                    out.push(Action::Restart {
                        n: n as u8,
                        empty: false,
                    });
                }
                if self.cfg.empty_restarts {
                    out.push(Action::Restart {
                        n: n as u8,
                        empty: true,
                    });
                }
            }
        }
    }

    /// A repair of node `n` by client `c` would find enough clean nodes (only then is it a
    /// step: a repair that cannot succeed changes nothing), and the node's restart hold-out is
    /// over for this client.
    // mirrors repair.rs repair(): the sources are read only once the target's restart hold-out
    // (`Node::restart_hold_out`, the max ttl since its start) has passed: every round that
    // counted an answer the node gave before its restart has granted or failed by then, and
    // its raises have landed (finding 5 of docs/verification.md). Until the repair is done the
    // node still counts toward no quorum (`held_out`: `conn.repair`).
    pub(super) fn repair_possible(&self, s: &State, c: usize, n: usize) -> bool {
        let nodes = self.cfg.nodes;
        let conns = &s.clients[c].conns;
        if !conns[n].repair || !s.nodes[n].up {
            return false;
        }
        if conns[n].held_until.is_some() && !self.cfg.mutants.repair_before_hold_out_ends {
            return false;
        }
        let clean = (0..nodes).filter(|&j| j != n && !conns[j].repair).count();
        let up_clean = (0..nodes)
            .filter(|&j| j != n && !conns[j].repair && s.nodes[j].up)
            .count();
        up_clean >= repair_sources_required(nodes, clean)
    }

    // mirrors repair.rs repair(): the largest counter among N - Q + 1 clean nodes (every clean
    // node when fewer are clean), atomic here.
    pub(super) fn repair(&self, s: &mut State, c: usize, n: usize) {
        let nodes = self.cfg.nodes;
        let clean = (0..nodes)
            .filter(|&j| j != n && !s.clients[c].conns[j].repair)
            .count();
        let required = repair_sources_required(nodes, clean);
        let mut answered = 0;
        let mut highest = 0;
        for j in (0..nodes).filter(|&j| j != n) {
            if !s.nodes[j].up {
                continue;
            }
            let was_clean = !s.clients[c].conns[j].repair;
            self.connect(s, c, j);
            if was_clean && !s.clients[c].conns[j].repair {
                answered += 1;
            }
            highest = highest.max(s.nodes[j].counter);
        }
        if answered >= required {
            self.connect(s, c, n);
            let target = &mut s.nodes[n];
            target.counter = target.counter.max(highest);
            s.clients[c].conns[n].repair = false;
            s.seen.repaired = true;
        }
    }
}
