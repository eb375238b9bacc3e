//! What standing by costs the nodes, counted on them: standbys wait for the leader's resign
//! notice or its key's expiry, reading the key's remaining time (one command per node) at most
//! once a second, and attempt only when a quorum may be free; term tokens rise by about one
//! per term.

use std::time::Duration;

use crate::support::*;
use crate::{Election, election};
use quorumlock::testkit::LocalCluster;

/// Every command the nodes ran, less `INFO` (these reads) and `PING` (the subscriptions'
/// health checks), summed over the nodes.
fn commands_run(urls: &[String]) -> u64 {
    urls.iter()
        .map(|u| commands(u) - calls(u, "info") - calls(u, "ping"))
        .sum()
}

/// The standbys' rounds on the lock's key, summed over the nodes: reads of its remaining time
/// (`PTTL`) and attempts (`SET`; the leader's extensions run in a script, as `PEXPIRE`).
fn lock_rounds(urls: &[String]) -> u64 {
    urls.iter()
        .map(|u| calls(u, "pttl") + calls(u, "set"))
        .sum()
}

fn fresh(cluster: &LocalCluster, name: &str, id: &str, ttl: Duration) -> Election {
    election(cluster, name, id, ttl)
}

/// A leader (ttl 3 s) and two standbys on fresh clients, three nodes. The leader alone for
/// 4 s gives the baseline; then with both standbys campaigning for 10 s, what they add is at
/// most one command per node per standby per second (one round), and the fencing counter does
/// not move. Then three handovers by resign: each term's token is at most the number of
/// candidates above the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t110_standbys_cost_at_most_a_round_a_second_and_tokens_rise_by_about_one() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let ttl = Duration::from_secs(3);
    let a = fresh(&cluster, "s110", "a", ttl);
    let leader = lead(&a).await;
    let first_token = leader.token().get();

    let (baseline_for, measured_for) = (Duration::from_secs(4), Duration::from_secs(10));
    let before = commands_run(&urls);
    tokio::time::sleep(baseline_for).await;
    let leader_alone = commands_run(&urls) - before;

    let (b, c) = (
        fresh(&cluster, "s110", "b", ttl),
        fresh(&cluster, "s110", "c", ttl),
    );
    let standbys = [b.clone(), c.clone()].map(|e| tokio::spawn(async move { e.campaign().await }));
    let standbys = Vec::from(standbys);
    b.wait_standing_by(1).await;
    c.wait_standing_by(1).await;
    let before = commands_run(&urls);
    let incr_before: u64 = urls.iter().map(|u| calls(u, "incr")).sum();
    let rounds_before = lock_rounds(&urls);
    tokio::time::sleep(measured_for).await;
    let with_standbys = commands_run(&urls) - before;
    let incr_after: u64 = urls.iter().map(|u| calls(u, "incr")).sum();
    let rounds = lock_rounds(&urls) - rounds_before;

    let per_second = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
    let leader_rate = per_second(leader_alone, baseline_for);
    let standby_rate = (per_second(with_standbys, measured_for) - leader_rate) / 2.0;
    let per_node = standby_rate / urls.len() as f64;
    let round_rate = per_second(rounds, measured_for) / 2.0 / urls.len() as f64;
    println!(
        "[t110] leader alone {leader_rate:.1} commands/s; each standby {standby_rate:.2} commands/s ({per_node:.2} per node), {round_rate:.2} rounds/s; INCR while held: {}",
        incr_after - incr_before
    );
    assert!(
        round_rate <= 1.1,
        "a standby makes {round_rate:.2} rounds a second while a leader holds ({standby_rate:.1} commands/s on {} nodes)",
        urls.len()
    );
    assert!(
        per_node <= 2.0,
        "a standby costs {per_node:.2} commands per node per second"
    );
    assert_eq!(
        incr_after, incr_before,
        "standbys moved the fencing counter while a leader held"
    );

    // Three handovers by resign; whoever resigned stands by again.
    let elections = [a, b, c];
    let mut tokens = vec![first_token];
    let mut pending = standbys;
    let mut current = leader;
    for _ in 0..3 {
        let resigner = current.candidate().to_owned();
        current.resign().await.unwrap();
        let (won, _, rest) = tokio::time::timeout(WAIT, futures::future::select_all(pending))
            .await
            .expect("a standby takes over within the wait");
        current = won.unwrap().unwrap();
        tokens.push(current.token().get());
        pending = rest;
        let again = elections
            .iter()
            .find(|e| e.candidate() == resigner)
            .unwrap()
            .clone();
        pending.push(tokio::spawn(async move { again.campaign().await }));
    }
    current.resign().await.unwrap();
    for p in pending {
        p.abort();
    }
    let rises: Vec<u64> = tokens.windows(2).map(|w| w[1] - w[0]).collect();
    println!("[t110] term tokens {tokens:?}, rises {rises:?}");
    assert!(
        rises.iter().all(|&r| r <= 3),
        "term tokens {tokens:?} rose by more than the number of candidates"
    );
}
