//! Restoring a restarted node's fencing counters.
//!
//! Counters never expire, so a node restarted without persistence comes back with all of them
//! at zero, and the delayed-restart rule, which protects lock keys, does not bring them back. If
//! nothing did, a few restarts of different minorities would leave too few nodes remembering the
//! latest token, and a later majority could hand out a smaller one. So when the client sees a
//! node restart (its run id changed), the node counts toward no quorum until its counters have
//! been raised to the largest value any of `N - quorum + 1` clean nodes holds: that many nodes
//! meet every quorum that could have issued the latest token, minus the restarted node.
//! Raising a counter is always safe (it only makes later tokens larger).
//!
//! # Incremental and paced
//!
//! A repair is one background task per restarted node that reads every other node page by page
//! (`SCAN ... MATCH quorumlock:{*}:fence COUNT 1000`, then one `MGET` of the page), all peers in
//! parallel, one page per peer per *step*, with a pause after each step as long as the step took
//! and at least [`MIN_PAUSE`]: at most two commands and about [`PAGE`] keys per peer every
//! 10 ms, and the peers busy with the repair at most half of the time. Each call is bounded by
//! the connect timeout; a page that times out is asked again, smaller, from the same cursor, and
//! a peer that fails is retried after a connect timeout while the others go on. What was read is
//! kept, so a repair always finishes on a large keyspace (it used to read each peer in one go
//! within five connect timeouts, and retry that back to back). The highest value per counter is
//! then raised on the restarted node in pipelines of [`PAGE`] keys, paced the same way.
//!
//! # When it reads
//!
//! The counters a repair must restore are those of tokens that needed the restarted node: the
//! tokens of rounds that counted an answer it gave before it restarted (the node counts toward
//! no quorum from the restart until the repair ends, so no round counts an answer it gives
//! after). Such a round may still be *granted after* the restart — it does not call the node
//! again — and its token reaches the clean nodes only with its raises, which land before its
//! validity ends, within a max ttl of the restart. So the repair reads its sources only once
//! the node's hold-out (the max ttl since its start) is over; read earlier, it could miss such a
//! token and a later quorum with the restarted node could hand it out again (finding 5 of
//! `docs/verification.md`, found by the model checker; `tests/safety/s14_repair_after_hold_out.rs`).
//! The node is held out for that long anyway, so this costs no availability beyond the repair
//! itself.
//!
//! Why resuming is safe: a counter on a clean peer is at least every such token from the moment
//! the token was granted, and never goes down, so a read at any time after the hold-out gives at
//! least it.
//! Counter keys are never deleted, so a complete `SCAN` pass returns every counter the peer had
//! when the pass began. A pass counts only if it completed within one incarnation of the peer
//! (a peer restarting mid-pass, which this client sees as a new run id on reconnect, starts its
//! pass again from cursor 0: a cursor means nothing to a new process, whose hash seed differs),
//! and the peer was clean (not awaiting its own repair) when the pass began and when the
//! repair ends. Values read from any pass are kept: each is a real counter, and raising to it is
//! safe. A restarted node that restarts again mid-repair loses what was raised: the repair
//! stops, and a new one starts from scratch.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{Engine, Inner};
use crate::core::quorum::quorum;
use crate::core::repair::{MIN_PAUSE, PAGE, next_page, repair_pause, repair_ready};
use crate::error::NodeError;
use crate::node::Node;

/// How often a repair waiting out its node's hold-out checks that it is still wanted.
const HOLD_OUT_CHECK: Duration = Duration::from_secs(1);

/// Calls to one node that may time out in a row before a repair warns (a timeout is first
/// retried with a smaller page).
const WARN_AFTER: u32 = 5;
impl Engine {
    /// Starts restoring the counters of every node that needs it (at most one repair per node at
    /// a time). Called around every round, so a restart seen in a round is repaired right away.
    ///
    /// A repair runs until it is done, however long the keyspace makes it, and is not waited for
    /// by [`flush`](Redlock::flush); it stops when the client is dropped.
    pub(crate) fn schedule_repairs(&self) {
        for (i, node) in self.inner.nodes.iter().enumerate() {
            if let Some(epoch) = node.claim_repair() {
                let claim = Claim {
                    node: Arc::clone(node),
                    epoch,
                    done: false,
                };
                let nodes = self.inner.nodes.clone();
                tokio::spawn(repair(Arc::downgrade(&self.inner), nodes, i, claim));
            }
        }
    }
}

/// A claimed repair: ended as failed (to be claimed again) if its task ends without finishing
/// it (the client dropped, the runtime shut down).
struct Claim {
    node: Arc<Node>,
    epoch: u64,
    done: bool,
}

impl Claim {
    pub(super) fn finish(mut self, ok: bool) {
        self.node.finish_repair(self.epoch, ok);
        self.done = true;
    }

    /// False once the node restarted again (a new repair is due) or the client is gone.
    pub(super) fn current(&self, client: &Weak<Inner>) -> bool {
        client.strong_count() > 0 && self.node.repair_current(self.epoch)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.done {
            self.node.finish_repair(self.epoch, false);
        }
    }
}

/// One other node read by a repair.
struct Source {
    node: Arc<Node>,
    /// Where the current pass goes on (0: at its start).
    cursor: u64,
    /// The node's incarnation when the current pass began.
    incarnation: u64,
    /// Whether the node was clean when the current pass began.
    clean_at_start: bool,
    /// A pass completed (counted or not).
    finished: bool,
    /// A pass completed within one incarnation, clean when it began.
    counted: bool,
    /// The last page failed: retried at `retry_at`.
    failing: bool,
    /// Pages failed in a row.
    failures: u32,
    retry_at: Instant,
    page: usize,
}

impl Source {
    pub(super) fn new(node: Arc<Node>) -> Self {
        let mut s = Source {
            node,
            cursor: 0,
            incarnation: 0,
            clean_at_start: false,
            finished: false,
            counted: false,
            failing: false,
            failures: 0,
            retry_at: Instant::now(),
            page: PAGE,
        };
        s.begin_pass();
        s
    }

    pub(super) fn begin_pass(&mut self) {
        self.cursor = 0;
        self.incarnation = self.node.incarnation();
        self.clean_at_start = !self.node.needs_repair();
    }

    pub(super) fn clean(&self) -> bool {
        !self.node.needs_repair()
    }

    /// Whether this node still has something to give: a pass in progress, or a new pass now
    /// that it is clean (its last pass did not count).
    pub(super) fn wants_page(&self) -> bool {
        !self.counted && (!self.finished || self.clean())
    }

    /// Takes in a page read: its counters into `highest`, then the cursor moves on (a pass
    /// that reached cursor 0 is finished, and counts if the node was clean throughout).
    fn absorb(&mut self, next: u64, counters: Vec<(Vec<u8>, u64)>, highest: &mut Highest) {
        self.failing = false;
        self.failures = 0;
        self.page = next_page(self.page, false);
        for (key, value) in counters {
            let slot = highest.entry(key).or_default();
            *slot = (*slot).max(value);
        }
        if self.node.incarnation() != self.incarnation {
            // The node restarted mid-pass: what was read stays (real counters), the pass
            // starts again in the new incarnation.
            tracing::debug!(node = %self.node.name(), "source node restarted during a repair; reading it again");
            self.begin_pass();
            return;
        }
        self.cursor = next;
        if next == 0 {
            self.finished = true;
            self.counted = self.clean_at_start && self.clean();
        }
    }

    /// Takes in a failed read: retried after a pause (a timeout at once, with a smaller page).
    /// Returns whether the failure is worth a warning (not a first timeout).
    fn failed(&mut self, e: &NodeError, timeout: Duration) -> bool {
        let timed_out = matches!(e, NodeError::Timeout(_));
        self.page = next_page(self.page, timed_out);
        self.failing = true;
        self.failures += 1;
        self.retry_at = Instant::now() + if timed_out { MIN_PAUSE } else { timeout };
        !timed_out || self.failures >= WARN_AFTER
    }
}

/// The highest value read so far, per counter key.
type Highest = HashMap<Vec<u8>, u64>;

/// A page of counters read from a node: the next cursor, and each counter with its value.
type Page = (u64, Vec<(Vec<u8>, u64)>);

/// What reading the other nodes gave a repair.
struct Read {
    highest: Highest,
    /// Clean nodes among the others, and how many of them completed a counted pass.
    clean: usize,
    counted: usize,
    pages: u64,
}

async fn repair(client: Weak<Inner>, nodes: Vec<Arc<Node>>, i: usize, claim: Claim) {
    let target = &nodes[i];
    let n = nodes.len();
    let needed = n - quorum(n) + 1;
    if n - 1 < needed {
        tracing::warn!(
            node = %target.name(),
            "a single node restarted: no other node can restore its fencing counters, so \
             tokens restart from zero (run it with appendfsync always to keep them)"
        );
        claim.finish(true);
        return;
    }
    // The sources are read only once the node's hold-out is over (the max ttl since its
    // start): a round that counted an answer the node gave before it restarted may still be
    // granted after the restart, and its token stands on the clean nodes only once its raises
    // have landed, which is before its validity ends (finding 5 of `docs/verification.md`,
    // `tests/safety/s14_repair_after_hold_out.rs`).
    while let Some(left) = target.restart_hold_out() {
        if !claim.current(&client) {
            return;
        }
        tokio::time::sleep(left.min(HOLD_OUT_CHECK)).await;
    }
    let started = Instant::now();
    // Every other node is read (a node awaiting its own repair adds nothing wrong: its
    // counters are only lower), but only clean ones count toward the nodes needed.
    let sources: Vec<Source> = nodes
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(_, node)| Source::new(Arc::clone(node)))
        .collect();
    let Some(read) = read_sources(&client, target, sources, &claim).await else {
        return;
    };
    if read.clean < needed {
        tracing::warn!(
            node = %target.name(),
            clean = read.clean,
            needed,
            "more nodes restarted without persistence than a quorum tolerates: restoring \
             fencing counters from the nodes that remain; tokens may repeat if a latest \
             token lived only on restarted nodes"
        );
    }
    let counters: Vec<_> = read.highest.into_iter().collect();
    if !raise_all(&client, target, &counters, &claim).await || !claim.current(&client) {
        return;
    }
    tracing::info!(
        node = %target.name(),
        counters = counters.len(),
        clean_sources = read.counted,
        pages = read.pages,
        took = ?started.elapsed(),
        "restored the fencing counters of a restarted node"
    );
    claim.finish(true);
}

/// Reads the other nodes page by page, paced, until enough clean ones completed a pass
/// ([`repair_ready`]). `None` when the claim stopped being current (the target restarted
/// again, or the client is gone).
async fn read_sources(
    client: &Weak<Inner>,
    target: &Arc<Node>,
    mut sources: Vec<Source>,
    claim: &Claim,
) -> Option<Read> {
    let n = sources.len() + 1;
    let keys = client.upgrade()?.cfg.keys.clone();
    let keys = &keys;
    let timeout = target.connect_timeout();
    let mut found = Found::default();
    loop {
        if !claim.current(client) {
            return None;
        }
        if let Some((clean, counted)) = ready(&sources, n) {
            return Some(Read {
                highest: found.highest,
                clean,
                counted,
                pages: found.pages,
            });
        }
        let now = Instant::now();
        let step: Vec<&mut Source> = sources
            .iter_mut()
            .filter(|s| s.wants_page() && s.retry_at <= now)
            .collect();
        if step.is_empty() {
            // Waiting for a failed node's retry, or for a node to be repaired itself.
            let next = sources
                .iter()
                .filter(|s| s.wants_page())
                .map(|s| s.retry_at)
                .min()
                .unwrap_or(now + timeout);
            tokio::time::sleep_until(next.max(now + MIN_PAUSE)).await;
            continue;
        }
        let reads = futures::future::join_all(step.into_iter().map(|s| async move {
            if s.cursor == 0 {
                // Nothing read in this pass yet: it starts from what the node is now.
                s.begin_pass();
            }
            let read = s.node.fence_counters_page(keys, s.cursor, s.page, timeout).await;
            tracing::trace!(node = %s.node.name(), cursor = s.cursor, page = s.page, ok = read.is_ok(), "repair page");
            (s, read)
        }))
        .await;
        for (s, read) in reads {
            found.take(s, read, target, timeout);
        }
        tokio::time::sleep(repair_pause(now.elapsed())).await;
    }
}

/// The clean sources, and how many of them completed a counted pass, once they are enough
/// ([`repair_ready`]).
fn ready(sources: &[Source], n: usize) -> Option<(usize, usize)> {
    let clean = sources.iter().filter(|s| s.clean()).count();
    let counted = sources.iter().filter(|s| s.counted && s.clean()).count();
    let pending = sources
        .iter()
        .filter(|s| s.wants_page() && !s.failing)
        .count();
    repair_ready(n, clean, counted, pending).then_some((clean, counted))
}

/// What a repair's reads found so far.
#[derive(Default)]
struct Found {
    highest: Highest,
    pages: u64,
    /// Whether a source that keeps failing was warned about (once per repair).
    warned: bool,
}

impl Found {
    /// One page read from `s` for the repair of `target`, or its failure.
    fn take(
        &mut self,
        s: &mut Source,
        read: Result<Page, NodeError>,
        target: &Node,
        timeout: Duration,
    ) {
        let e = match read {
            Ok((next, counters)) => {
                self.pages += 1;
                s.absorb(next, counters, &mut self.highest);
                return;
            }
            Err(e) => e,
        };
        tracing::debug!(node = %s.node.name(), target = %target.name(), error = %e, "reading fencing counters for a repair failed; will retry");
        // A timeout is retried with a smaller page first; a node that keeps failing is worth a
        // warning (once per repair).
        if s.failed(&e, timeout) && !std::mem::replace(&mut self.warned, true) {
            tracing::warn!(
                node = %target.name(),
                source = %s.node.name(),
                error = %e,
                "a node cannot be read to restore a restarted node's fencing \
                 counters; retrying, and the restarted node stays out of quorums \
                 until they are restored"
            );
        }
    }
}

/// Raises the target's counters to `counters` in paced pipelines, retrying failures. `false`
/// when the claim stopped being current.
async fn raise_all(
    client: &Weak<Inner>,
    target: &Arc<Node>,
    counters: &[(Vec<u8>, u64)],
    claim: &Claim,
) -> bool {
    let timeout = target.connect_timeout();
    let mut done = 0;
    let mut size = PAGE;
    let mut warned = false;
    let mut failures = 0u32;
    while done < counters.len() {
        if !claim.current(client) {
            return false;
        }
        let now = Instant::now();
        let chunk = &counters[done..(done + size).min(counters.len())];
        match target.raise_counters(chunk, timeout).await {
            Ok(()) => {
                failures = 0;
                done += chunk.len();
                size = next_page(size, false);
                tokio::time::sleep(repair_pause(now.elapsed())).await;
            }
            Err(e) => {
                let timed_out = matches!(e, NodeError::Timeout(_));
                size = next_page(size, timed_out);
                tracing::debug!(node = %target.name(), error = %e, "raising fencing counters failed; will retry");
                failures += 1;
                if !warned && (!timed_out || failures >= WARN_AFTER) {
                    warned = true;
                    tracing::warn!(node = %target.name(), error = %e, "restoring fencing counters failed; retrying");
                }
                let pause = if timed_out { MIN_PAUSE } else { timeout };
                tokio::time::sleep(pause).await;
            }
        }
    }
    true
}
