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
//! Why resuming is safe: the counters a repair must restore are those of tokens issued before
//! the restart (the node counts toward no quorum until the repair ends, so no later token needs
//! it). A counter on a clean peer is at least every such token from the moment the token was
//! issued, and never goes down, so a read at any time during the repair gives at least it; a
//! read early is only lower than tokens issued since, which do not need the restarted node.
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

use crate::node::Node;
use crate::quorum::quorum;
use crate::redlock::{Inner, Redlock};

/// Keys asked of a peer per page (`SCAN ... COUNT`), and counters per raise pipeline.
pub(crate) const PAGE: usize = 1000;
/// The smallest page, after timeouts halved it.
pub(crate) const MIN_PAGE: usize = 10;
/// Calls to one node that may time out in a row before a repair warns (a timeout is first
/// retried with a smaller page).
const WARN_AFTER: u32 = 5;
/// The shortest pause between two steps of a repair.
pub(crate) const MIN_PAUSE: Duration = Duration::from_millis(10);

/// How many complete reads of clean nodes a repair among `n` nodes needs when `clean` other
/// nodes are not themselves awaiting repair: `n - quorum(n) + 1`, or every clean node when
/// fewer exist (more nodes restarted than a quorum tolerates: the best there is).
pub(crate) fn repair_sources_required(n: usize, clean: usize) -> usize {
    (n - quorum(n) + 1).min(clean)
}

/// Whether a repair has read enough to raise: `counted` clean nodes completed a pass, out of
/// `clean` clean nodes among the others; `pending` nodes are still reading (a pass not
/// complete, and their last page answered). With `n - quorum(n) + 1` clean nodes, that many
/// complete passes are enough; with fewer (a best effort), every clean node must have
/// completed one and no reachable node may still be reading.
pub(crate) fn repair_ready(n: usize, clean: usize, counted: usize, pending: usize) -> bool {
    let needed = n - quorum(n) + 1;
    counted >= repair_sources_required(n, clean) && (clean >= needed || pending == 0)
}

/// The pause after a step that took `step`: as long as the step, at least [`MIN_PAUSE`], so a
/// repair keeps its peers busy at most half of the time.
pub(crate) fn repair_pause(step: Duration) -> Duration {
    step.max(MIN_PAUSE)
}

/// The next page size: halved after a timeout (down to [`MIN_PAGE`]), doubled after an answer
/// (up to [`PAGE`]).
pub(crate) fn next_page(page: usize, timed_out: bool) -> usize {
    if timed_out {
        (page / 2).max(MIN_PAGE)
    } else {
        page.saturating_mul(2).clamp(MIN_PAGE, PAGE)
    }
}

impl Redlock {
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
    fn finish(mut self, ok: bool) {
        self.node.finish_repair(self.epoch, ok);
        self.done = true;
    }

    /// False once the node restarted again (a new repair is due) or the client is gone.
    fn current(&self, client: &Weak<Inner>) -> bool {
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
    fn new(node: Arc<Node>) -> Self {
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

    fn begin_pass(&mut self) {
        self.cursor = 0;
        self.incarnation = self.node.incarnation();
        self.clean_at_start = !self.node.needs_repair();
    }

    fn clean(&self) -> bool {
        !self.node.needs_repair()
    }

    /// Whether this node still has something to give: a pass in progress, or a new pass now
    /// that it is clean (its last pass did not count).
    fn wants_page(&self) -> bool {
        !self.counted && (!self.finished || self.clean())
    }
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
    let started = Instant::now();
    let timeout = target.connect_timeout();
    // Every other node is read (a node awaiting its own repair adds nothing wrong: its
    // counters are only lower), but only clean ones count toward the nodes needed.
    let mut sources: Vec<Source> = nodes
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(_, node)| Source::new(Arc::clone(node)))
        .collect();
    let mut highest: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut pages = 0u64;
    let mut warned = false;
    let (clean, counted) = loop {
        if !claim.current(&client) {
            return;
        }
        let clean = sources.iter().filter(|s| s.clean()).count();
        let counted = sources.iter().filter(|s| s.counted && s.clean()).count();
        let pending = sources
            .iter()
            .filter(|s| s.wants_page() && !s.failing)
            .count();
        if repair_ready(n, clean, counted, pending) {
            break (clean, counted);
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
            let read = s.node.fence_counters_page(s.cursor, s.page, timeout).await;
            tracing::trace!(node = %s.node.name(), cursor = s.cursor, page = s.page, ok = read.is_ok(), "repair page");
            (s, read)
        }))
        .await;
        for (s, read) in reads {
            match read {
                Ok((next, counters)) => {
                    pages += 1;
                    s.failing = false;
                    s.failures = 0;
                    s.page = next_page(s.page, false);
                    for (key, value) in counters {
                        let slot = highest.entry(key).or_default();
                        *slot = (*slot).max(value);
                    }
                    if s.node.incarnation() != s.incarnation {
                        // The node restarted mid-pass: what was read stays (real counters),
                        // the pass starts again in the new incarnation.
                        tracing::debug!(node = %s.node.name(), "source node restarted during a repair; reading it again");
                        s.begin_pass();
                        continue;
                    }
                    s.cursor = next;
                    if next == 0 {
                        s.finished = true;
                        s.counted = s.clean_at_start && s.clean();
                    }
                }
                Err(e) => {
                    let timed_out = matches!(e, crate::error::NodeError::Timeout(_));
                    s.page = next_page(s.page, timed_out);
                    s.failing = true;
                    s.failures += 1;
                    s.retry_at = Instant::now() + if timed_out { MIN_PAUSE } else { timeout };
                    tracing::debug!(node = %s.node.name(), target = %target.name(), error = %e, "reading fencing counters for a repair failed; will retry");
                    // A timeout is retried with a smaller page first; a node that keeps
                    // failing is worth a warning (once per repair).
                    if !warned && (!timed_out || s.failures >= WARN_AFTER) {
                        warned = true;
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
        }
        tokio::time::sleep(repair_pause(now.elapsed())).await;
    };
    if clean < needed {
        tracing::warn!(
            node = %target.name(),
            clean,
            needed,
            "more nodes restarted without persistence than a quorum tolerates: restoring \
             fencing counters from the nodes that remain; tokens may repeat if a latest \
             token lived only on restarted nodes"
        );
    }
    let counters: Vec<_> = highest.into_iter().collect();
    let mut done = 0;
    let mut size = PAGE;
    let mut warned = false;
    let mut failures = 0u32;
    while done < counters.len() {
        if !claim.current(&client) {
            return;
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
                let timed_out = matches!(e, crate::error::NodeError::Timeout(_));
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
    if !claim.current(&client) {
        return;
    }
    tracing::info!(
        node = %target.name(),
        counters = counters.len(),
        clean_sources = counted,
        pages,
        took = ?started.elapsed(),
        "restored the fencing counters of a restarted node"
    );
    claim.finish(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repair_needs_n_minus_quorum_plus_one_clean_sources() {
        // 5 nodes: 3 clean complete passes, whatever the others do.
        assert!(!repair_ready(5, 4, 2, 2));
        assert!(repair_ready(5, 4, 3, 1));
        assert!(repair_ready(5, 4, 3, 0));
        // 3 nodes: 2.
        assert!(!repair_ready(3, 2, 1, 1));
        assert!(!repair_ready(3, 2, 1, 0));
        assert!(repair_ready(3, 2, 2, 0));
        assert_eq!(repair_sources_required(5, 4), 3);
        assert_eq!(repair_sources_required(3, 2), 2);
    }

    #[test]
    fn with_too_few_clean_nodes_every_one_and_every_reachable_read_is_needed() {
        // 5 nodes, 2 clean: both must complete, and no reachable node may still be reading.
        assert_eq!(repair_sources_required(5, 2), 2);
        assert!(!repair_ready(5, 2, 1, 0));
        assert!(!repair_ready(5, 2, 2, 1));
        assert!(repair_ready(5, 2, 2, 0));
        // Nobody clean: what the reachable nodes hold, once they are all read.
        assert!(!repair_ready(3, 0, 0, 1));
        assert!(repair_ready(3, 0, 0, 0));
    }

    #[test]
    fn pacing_keeps_peers_busy_at_most_half_the_time() {
        assert_eq!(repair_pause(Duration::ZERO), MIN_PAUSE);
        assert_eq!(repair_pause(Duration::from_millis(3)), MIN_PAUSE);
        assert_eq!(
            repair_pause(Duration::from_millis(40)),
            Duration::from_millis(40)
        );
        assert_eq!(next_page(PAGE, true), PAGE / 2);
        assert_eq!(next_page(MIN_PAGE, true), MIN_PAGE);
        assert_eq!(next_page(PAGE / 2, false), PAGE);
        assert_eq!(next_page(PAGE, false), PAGE);
        assert_eq!(next_page(15, false), 30);
    }
}
