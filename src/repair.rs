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

use std::collections::HashMap;
use tokio::time::Instant;

use crate::quorum::quorum;
use crate::redlock::Redlock;

/// How many connect timeouts one repair may take, reading and writing included.
const REPAIR_BUDGET: u32 = 5;

impl Redlock {
    /// Starts restoring the counters of every node that needs it (at most one repair per node at
    /// a time). Called around every round, so a restart seen in a round is repaired right away.
    pub(crate) fn schedule_repairs(&self) {
        for (i, node) in self.inner.nodes.iter().enumerate() {
            if node.claim_repair() {
                let client = self.clone();
                self.inner
                    .tasks
                    .spawn(async move { client.repair(i).await });
            }
        }
    }

    async fn repair(&self, i: usize) {
        let nodes = &self.inner.nodes;
        let target = &nodes[i];
        let n = nodes.len();
        let needed = n - quorum(n) + 1;
        if n - 1 < needed {
            tracing::warn!(
                node = %target.name(),
                "a single node restarted: no other node can restore its fencing counters, so \
                 tokens restart from zero (run it with appendfsync always to keep them)"
            );
            target.finish_repair(true);
            return;
        }
        let deadline = Instant::now() + target.connect_timeout() * REPAIR_BUDGET;
        // Every other node is read (a node awaiting its own repair adds nothing wrong: its
        // counters are only lower), but only clean ones count toward the nodes needed.
        let others: Vec<_> = nodes
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, node)| (node, !node.needs_repair()))
            .collect();
        let clean = others.iter().filter(|(_, clean)| *clean).count();
        // When more nodes restarted than the rule allows (a rolling restart nobody watched),
        // every clean node must answer and the result is the best there is.
        let required = needed.min(clean);
        let reads =
            futures::future::join_all(others.iter().map(|(node, _)| node.fence_counters(deadline)))
                .await;
        let mut answered = 0;
        let mut highest: HashMap<Vec<u8>, u64> = HashMap::new();
        for ((node, clean), counters) in others.iter().zip(reads) {
            let Ok(counters) = counters else { continue };
            // Clean before *and* after the read: a read that reconnected may have found that
            // this node restarted too, and then its counters are no source.
            if *clean && !node.needs_repair() {
                answered += 1;
            }
            for (key, value) in counters {
                let slot = highest.entry(key).or_default();
                *slot = (*slot).max(value);
            }
        }
        if answered < required {
            tracing::warn!(
                node = %target.name(),
                answered,
                required,
                "cannot restore the fencing counters of a restarted node yet: too few clean nodes \
                 answered; it stays out of quorums"
            );
            target.finish_repair(false);
            return;
        }
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
        match target.raise_counters(&counters, deadline).await {
            Ok(()) => {
                tracing::info!(
                    node = %target.name(),
                    counters = counters.len(),
                    clean_sources = answered,
                    "restored the fencing counters of a restarted node"
                );
                target.finish_repair(true);
            }
            Err(e) => {
                tracing::warn!(node = %target.name(), error = %e, "restoring fencing counters failed; will retry");
                target.finish_repair(false);
            }
        }
    }
}
