//! Pins issue 12 item 7: contenders that start at the same moment (a cron firing on three hosts,
//! each a fresh process calling `try_acquire`) do not all lose. A round in which no single value
//! stands on a quorum and nothing failed is contention, not `Held`: `try_acquire` undoes its
//! partial acquisition and re-tries after a short random pause, a bounded number of times, so
//! exactly one contender wins; the losers are told `Held`, counting truthfully how many nodes
//! hold the winner's value.

use std::sync::Arc;
use std::time::Duration;

use quorumlock::{Error, Redlock};
use tokio::sync::Barrier;

use crate::support::{TTL, builder, cluster};

const TRIALS: usize = 200;
const CONTENDERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_simultaneous_fresh_contenders_produce_exactly_one_winner() {
    let cluster = cluster(5);
    let observer = builder(&cluster).build().unwrap();
    let mut no_winner = Vec::new();
    let mut bad = Vec::new();
    for trial in 0..TRIALS {
        let key = format!("cron-{trial}");
        // Fresh clients, not warmed: each connects during its first round, as a new process
        // would. A generous node timeout: this is about contention, and on a loaded box a
        // fresh connection's first call can take longer than the suite's 300 ms (a timed-out
        // node is a failure, which no contention round resolves).
        let clients: Vec<Redlock> = (0..CONTENDERS)
            .map(|_| {
                builder(&cluster)
                    .node_timeout(Duration::from_secs(3))
                    .build()
                    .unwrap()
            })
            .collect();
        let barrier = Arc::new(Barrier::new(CONTENDERS));
        let tasks: Vec<_> = clients
            .iter()
            .map(|c| {
                let (c, key, barrier) = (c.clone(), key.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    c.try_acquire(&key, TTL).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut held = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(lock) => winners.push(lock),
                Err(Error::Held { held: h, .. }) => held.push(h),
                Err(e) => bad.push(format!("trial {trial}: unexpected error {e}")),
            }
        }
        match winners.len() {
            0 => no_winner.push(trial),
            1 => {
                let status = observer.status(&key).await.unwrap();
                let holder = status
                    .holder()
                    .expect("the winner holds a quorum")
                    .to_owned();
                let on = status
                    .nodes
                    .iter()
                    .filter(|n| {
                        n.state
                            .as_ref()
                            .is_ok_and(|s| s.value.as_deref() == Some(holder.as_str()))
                    })
                    .count();
                for h in &held {
                    if *h > on || *h < status.quorum {
                        bad.push(format!(
                            "trial {trial}: a loser was told {h} nodes hold the lock; the \
                             winner's value stands on {on}"
                        ));
                    }
                }
            }
            w => bad.push(format!("trial {trial}: {w} winners")),
        }
        for lock in winners {
            lock.release().await.unwrap();
        }
        for c in &clients {
            c.flush().await;
        }
    }
    assert!(
        no_winner.is_empty(),
        "nobody won in {} of {TRIALS} trials: {no_winner:?}",
        no_winner.len()
    );
    assert!(bad.is_empty(), "{bad:#?}");
}
