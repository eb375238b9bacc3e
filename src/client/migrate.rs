//! Folding a node's legacy per-name fencing counters into the buckets, so that the node can
//! take the pipelined acquire (`node/fence.rs`).
//!
//! A connect that finds a Redis 7 node without its migration marker asks for one migration;
//! the next round starts it here, one background task per node: `SCAN` for `P:{*}:fence`
//! page by page (paced as a repair is: [`repair_pause`]), each page's counters folded into
//! their buckets (raise only, then `DEL`), then the marker written with the run id scanned and
//! the node's connection switched to the pipeline. Until then the node runs the acquire
//! script, which folds a lock's legacy counter atomically when it sets the lock, so tokens
//! never go backwards while the migration runs (`docs/safety.md`, "Fencing tokens").
//!
//! The migration stops, without writing the marker, if its connection is replaced (the next
//! connect reads the marker and asks again if needed) or the client is dropped; a page that
//! fails is retried after a connect timeout.

use std::sync::{Arc, Weak};

use tokio::time::Instant;

use super::{Inner, Redlock};
use crate::core::repair::{PAGE, repair_pause};
use crate::node::Node;

impl Redlock {
    /// Starts the migration of every node whose last connect asked for one. Called around
    /// every round, by [`schedule_repairs`](Redlock::schedule_repairs).
    pub(crate) fn schedule_migrations(&self) {
        for node in &self.inner.nodes {
            if let Some((generation, run_id)) = node.claim_migration() {
                tokio::spawn(migrate(
                    Arc::downgrade(&self.inner),
                    Arc::clone(node),
                    generation,
                    run_id,
                ));
            }
        }
    }
}

async fn migrate(client: Weak<Inner>, node: Arc<Node>, generation: u64, run_id: String) {
    let Some(keys) = client.upgrade().map(|c| c.cfg.keys.clone()) else {
        return;
    };
    let timeout = node.connect_timeout();
    let started = Instant::now();
    let (mut cursor, mut folded) = (0u64, 0usize);
    loop {
        if client.strong_count() == 0 || !node.connection_current(generation) {
            return;
        }
        let step = Instant::now();
        let page = match node
            .legacy_counters_page(&keys, cursor, PAGE, timeout)
            .await
        {
            Ok((next, legacy)) => node
                .fold_legacy(&keys, &legacy, timeout)
                .await
                .map(|()| (next, legacy.len())),
            Err(e) => Err(e),
        };
        match page {
            Ok((next, n)) => {
                folded += n;
                cursor = next;
                if next == 0 {
                    break;
                }
                tokio::time::sleep(repair_pause(step.elapsed())).await;
            }
            Err(e) => {
                tracing::debug!(node = %node.name(), error = %e, "folding legacy fencing counters failed; will retry");
                tokio::time::sleep(timeout).await;
            }
        }
    }
    match node.finish_migration(generation, &run_id, timeout).await {
        Ok(true) => {
            let took = started.elapsed();
            if folded > 0 {
                tracing::info!(node = %node.name(), folded, ?took, "legacy per-name fencing counters folded into their buckets; acquires pipelined from now on");
            } else {
                tracing::debug!(node = %node.name(), ?took, "no legacy fencing counters; acquires pipelined from now on");
            }
        }
        Ok(false) => {}
        Err(e) => {
            tracing::debug!(node = %node.name(), error = %e, "writing the migration marker failed; the next connect scans again");
        }
    }
}
