//! Counterexample traces as a readable timeline: who sent what to whom, what each node did, when
//! each key expired, and what each client concluded.

use std::fmt::Write as _;

use super::{Action, Op, Phase, Redlock, State};

/// Real time and each client's clock along the path (the states only hold relative times).
#[derive(Debug, Clone, Default)]
struct Times {
    now: u32,
    lag: Vec<u32>,
}

impl Times {
    fn clock(&self, c: usize) -> u32 {
        self.now - self.lag.get(c).copied().unwrap_or(0)
    }
}

/// One line per step, with the events the step caused (found by comparing the states around it).
pub(crate) fn timeline(m: &Redlock, path: &[(State, Option<Action>)]) -> String {
    let mut out = String::new();
    let mut tm = Times {
        now: 0,
        lag: vec![0; m.cfg.clients],
    };
    for pair in path.windows(2) {
        let (before, Some(action)) = (&pair[0].0, pair[0].1) else {
            continue;
        };
        let after = &pair[1].0;
        let _ = writeln!(out, "{}", step(m, &tm, before, action, after));
        if let Action::Tick { stall } = action {
            tm.now += 1;
            for (c, lag) in tm.lag.iter_mut().enumerate() {
                if stall & (1 << c) != 0 {
                    *lag += 1;
                }
            }
        }
        for event in events(m, &tm, before, action, after) {
            let _ = writeln!(out, "        {event}");
        }
    }
    if let Some((last, _)) = path.last() {
        let _ = writeln!(out, "-- final state at t={}s --", tm.now);
        for (n, node) in last.nodes.iter().enumerate() {
            let key = match node.key {
                Some((v, left)) => format!("key {v} for {left}s more"),
                None => "no key".to_owned(),
            };
            let _ = writeln!(
                out,
                "   n{n}: {} run#{} counter {} {key}",
                if node.up { "up" } else { "DOWN" },
                node.epoch,
                node.counter
            );
        }
        for c in 0..last.clients.len() {
            let client = &last.clients[c];
            let lock = match &client.lock {
                Some(l) => format!(
                    "holds {} token {} with {:?} of validity left (clock {}s){}",
                    l.val,
                    l.token,
                    l.deadline,
                    tm.clock(c),
                    if m.valid(last, c) {
                        ", believes it valid"
                    } else {
                        ", lost"
                    }
                ),
                None => format!("holds nothing (clock {}s)", tm.clock(c)),
            };
            let _ = writeln!(out, "   c{c}: {lock}");
        }
    }
    out
}

fn step(m: &Redlock, tm: &Times, before: &State, action: Action, after: &State) -> String {
    let t = format!("t={}s", tm.now);
    match action {
        Action::Tick { stall } => {
            let mut s = format!("---- t={}s ----", tm.now + 1);
            for c in 0..after.clients.len() {
                if stall & (1 << c) != 0 {
                    let _ = write!(s, " (c{c}'s clock stalls: {}s behind)", tm.lag[c] + 1);
                }
            }
            s
        }
        Action::Start(c) => {
            let c = usize::from(c);
            let op = match &after.clients[c].phase {
                Phase::Acquire { val, .. } => format!("ACQUIRE {val}"),
                _ => "ACQUIRE".to_owned(),
            };
            format!(
                "{t} c{c} starts an attempt at clock {}s: {op} {}",
                tm.clock(c),
                sent(m, before, after, c)
            )
        }
        Action::Extend(c) => {
            let c = usize::from(c);
            format!(
                "{t} c{c} extends at clock {}s: EXTEND {}",
                tm.clock(c),
                sent(m, before, after, c)
            )
        }
        Action::Release(c) => {
            let c = usize::from(c);
            format!("{t} c{c} releases: RELEASE {}", sent(m, before, after, c))
        }
        Action::Deliver { c, n } => delivered(m, before, after, c, n, false, &t),
        Action::DeliverLoseReply { c, n } => delivered(m, before, after, c, n, true, &t),
        Action::Timeout(c) => format!(
            "{t} c{c}'s round reaches its deadline (clock {}s): unanswered nodes count as failed",
            tm.clock(usize::from(c))
        ),
        Action::Repair { c, n } => format!(
            "{t} c{c} repairs n{n}: counter {} -> {}",
            before.nodes[usize::from(n)].counter,
            after.nodes[usize::from(n)].counter
        ),
        Action::Disconnect { c, n } => format!(
            "{t} connection c{c} <-> n{n} breaks: {} queued request(s) lost",
            before.req[m.ix(c.into(), n.into())].len()
        ),
        Action::Crash(n) => format!("{t} n{n} CRASHES (queued requests and replies lost)"),
        Action::Restart { n, empty } => format!(
            "{t} n{n} restarts {}",
            if empty {
                "EMPTY (no keys, counter 0)"
            } else {
                "with its data"
            }
        ),
        Action::JumpClock(n) => format!("{t} n{n}'s clock JUMPS {}s forward", m.cfg.jump),
        Action::Evict(n) => format!("{t} n{n} EVICTS the lock key"),
        Action::Promote { n, failback } => format!(
            "{t} n{n} {} (lock key and counter not replicated; clients' connections killed)",
            if failback {
                "FAILS BACK to its old server (same run id, new replication id)"
            } else {
                "FAILS OVER to a replica (new run id)"
            }
        ),
        Action::Quiet => format!("{t} faults stop"),
    }
}

/// Client `c`'s oldest request applied by node `n` (its reply lost with the connection when
/// `lose_reply`), as of `t`.
fn delivered(
    m: &Redlock,
    before: &State,
    after: &State,
    c: u8,
    n: u8,
    lose_reply: bool,
    t: &str,
) -> String {
    let (c, n) = (usize::from(c), usize::from(n));
    let head = before.req[m.ix(c, n)].front();
    let req = head.map(|r| r.op.to_string());
    let set = head.is_some_and(|r| matches!(r.op, Op::SetNx(_)));
    let reply = head
        .and_then(|r| m.apply(&mut before.clone(), n, r.op))
        .map(|(int, holder)| match holder {
            Some(h) if set => format!(" -> {h} (held: not set)"),
            Some(h) => format!(" -> {int} (held by {h})"),
            None if set => " -> nil (set)".to_owned(),
            None => format!(" -> {int}"),
        })
        .unwrap_or_default();
    let node = &after.nodes[n];
    let key = match node.key {
        Some((v, left)) => format!("key {v} for {left}s"),
        None => "no key".to_owned(),
    };
    let lost = if lose_reply {
        "; the connection breaks before the reply: lost"
    } else {
        ""
    };
    format!(
        "{t} n{n} applies {} from c{c}{reply}: now {key}, counter {}{lost}",
        req.unwrap_or_default(),
        node.counter
    )
}

/// "to n0 n1, n2 failed at once" from the request queues' growth.
fn sent(m: &Redlock, before: &State, after: &State, c: usize) -> String {
    let mut to = Vec::new();
    let mut failed = Vec::new();
    for n in 0..m.cfg.nodes {
        let ix = m.ix(c, n);
        if after.req[ix].len() > before.req[ix].len() {
            to.push(format!("n{n}"));
        } else if matches!(after.clients[c].phase, Phase::Idle { .. }) && after.nodes[n].up {
            // A release that changes nothing there is applied at once (`noop_releases`), or
            // an undo that skips a node that refused.
            to.push(format!("n{n} (no-op)"));
        } else {
            failed.push(format!("n{n}"));
        }
    }
    let mut s = format!("-> {}", to.join(" "));
    if !failed.is_empty() {
        let _ = write!(s, " (not sent: {})", failed.join(" "));
    }
    s
}

/// The properties a step broke, each as a `VIOLATION` line.
fn violations(m: &Redlock, before: &State, after: &State, ev: &mut Vec<String>) {
    let (fb, fa) = (&before.flags, &after.flags);
    if !fb.token_not_increasing && fa.token_not_increasing {
        ev.push("VIOLATION: a token not greater than an earlier one".to_owned());
    }
    if !fb.ok_after_gap && fa.ok_after_gap {
        ev.push("VIOLATION: extension Ok after a gap".to_owned());
    }
    if !fb.held_with_too_few_refusals && fa.held_with_too_few_refusals {
        ev.push("VIOLATION: Held/NotOwner while the refusals alone allow a quorum".to_owned());
    }
    if !fb.held_on_split_vote && fa.held_on_split_vote {
        ev.push(
            "VIOLATION: Held on a split vote (no value on a quorum, nothing failed)".to_owned(),
        );
    }
    let holders = |s: &State| (0..m.cfg.clients).filter(|&c| m.valid(s, c)).count();
    if holders(before) <= 1 && holders(after) > 1 {
        ev.push("VIOLATION: two clients believe they hold the lock".to_owned());
    }
}

fn events(m: &Redlock, tm: &Times, before: &State, action: Action, after: &State) -> Vec<String> {
    let mut ev = Vec::new();
    for (n, (b, a)) in before.nodes.iter().zip(&after.nodes).enumerate() {
        let touched = match action {
            Action::Deliver { n: d, .. }
            | Action::Evict(d)
            | Action::Restart { n: d, .. }
            | Action::Promote { n: d, .. } => usize::from(d) == n,
            _ => false,
        };
        if let (Some((v, _)), None) = (b.key, a.key)
            && !touched
        {
            ev.push(format!("key {v} EXPIRES on n{n}"));
        }
    }
    for c in 0..after.clients.len() {
        let (b, a) = (&before.clients[c], &after.clients[c]);
        let was_valid = m.valid(before, c);
        let is_valid = m.valid(after, c);
        match (&b.lock, &a.lock) {
            (None, Some(l)) => ev.push(format!(
                "c{c} ACQUIRED {} with token {}, valid for {:?} more on its clock",
                l.val, l.token, l.deadline
            )),
            // The deadline moved forward, or the first `Ok` (a 1 s round can leave the same
            // validity as before: the deadline does not move, but the extension succeeded).
            (Some(x), Some(l))
                if (x.deadline < l.deadline
                    || (before.seen.extended ^ after.seen.extended) & (1 << c) != 0)
                    && !l.lost
                    && !matches!(action, Action::Tick { .. }) =>
            {
                ev.push(format!(
                    "c{c}'s lock extended: valid for {:?} more on its clock",
                    l.deadline
                ))
            }
            _ => {}
        }
        if let (Some(x), Some(l)) = (&b.lock, &a.lock)
            && !x.lost
            && l.lost
        {
            ev.push(format!("c{c} is told its lock is LOST"));
        }
        if was_valid && !is_valid && a.lock.is_some() {
            ev.push(format!(
                "c{c} no longer believes its lock valid (clock {}s)",
                tm.clock(c)
            ));
        }
        if !was_valid && is_valid && b.lock.is_some() {
            ev.push(format!(
                "c{c} believes its lock VALID AGAIN (clock {}s)",
                tm.clock(c)
            ));
        }
        let failed = matches!(b.phase, Phase::Acquire { .. } | Phase::Raise { .. })
            && matches!(a.phase, Phase::Idle { .. })
            && a.lock.is_none();
        if failed {
            ev.push(format!(
                "c{c}'s attempt fails (undo: RELEASE of its value, but to the nodes that refused it)"
            ));
        }
        if matches!(b.phase, Phase::Acquire { .. }) && matches!(a.phase, Phase::Raise { .. }) {
            ev.push(format!("c{c}: fewer than a quorum at the token: raising"));
        }
    }
    violations(m, before, after, &mut ev);
    ev
}
