//! Finding 5 of the model checker (`docs/verification.md`): a token repeated when a node
//! restarted empty *inside* another client's acquisition round.
//!
//! `c1`'s round counts `n0`'s yes, given before `n0` crashed, and is granted after the restart
//! (it never calls `n0` again). `c0` sees the restart and repairs `n0` from the clean `n1` and
//! `n2` — but read `n2` before `c1`'s acquire landed there, so the repaired counter is below
//! `c1`'s token. Once `c1`'s key expired, `c0` acquired on `{n0, n1}` with the token `c1` had.
//! The repair's argument ("no token issued after the restart needs the node") missed rounds that
//! counted the node's answer from before it. Fixed in `client/repair.rs`: a repair reads its
//! sources only once the node's hold-out is over (the max ttl since its start): every round
//! that counted an answer the node gave before its restart has granted or failed by then, and
//! its counters stand on the clean nodes.
//!
//! Expected: `c0`'s token after the restart is above `c1`'s.

use std::sync::Mutex;
use std::time::Duration;

use quorumlock::Redlock;

use crate::proxy::Proxy;
use crate::support::{
    WAIT, cluster, del_lock, fence_key, fence_on, set_fence, set_foreign, wait_until, warm,
};

const KEY: &str = "s14";
/// A name in another counter bucket, to learn when n0 counts again.
const PROBE: &str = "s14-probe";
/// The lock's ttl and both clients' max ttl: the restarted node's hold-out.
const HOLD_OUT_TTL: Duration = Duration::from_secs(6);
/// Added each way on `c1`'s link to `n2`: `c1`'s acquire reaches `n2` about 2 s after it
/// reached `n0`, the window in which `n0` is restarted and `c0` repairs it.
const LATENCY: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_waits_for_rounds_that_counted_the_node_before_its_restart() {
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let to_n2 = Proxy::for_url(&urls[2]).await.expect("proxy");
    // The acquire script on every node (Redis 6, Cluster members): a refused pipelined acquire
    // also increments the counter, which would hide the gap in this schedule.
    let builder = |nodes: Vec<String>| {
        (0..3)
            .fold(Redlock::builder(nodes), |b, i| b.testkit_script_acquire(i))
            .node_timeout(Duration::from_secs(5))
            .max_ttl(HOLD_OUT_TTL)
            .build()
            .expect("valid config")
    };
    let c0 = builder(urls.clone());
    let c1 = builder(vec![urls[0].clone(), urls[1].clone(), to_n2.url()]);
    warm(&c0).await;
    warm(&c1).await;
    for url in &urls {
        set_fence(url, KEY, 10);
    }
    // Someone else's key on n1: c1's round needs n0 and n2. The same for a probe name in
    // another counter bucket, which c0 uses to learn about n0 without touching KEY's counters.
    set_foreign(&urls[1], KEY, "someone-else", Duration::from_secs(60));
    assert_ne!(fence_key(KEY), fence_key(PROBE));
    set_foreign(&urls[1], PROBE, "someone-else", Duration::from_secs(60));

    to_n2.set_latency(LATENCY);
    let round = tokio::spawn(async move {
        let lock = c1.try_acquire(KEY, HOLD_OUT_TTL).await;
        (c1, lock)
    });
    // n0 has answered c1 (yes, counter 11) while c1's call to n2 is on its way.
    wait_until(WAIT, "n0 answered c1's acquire", || async {
        let url = urls[0].clone();
        tokio::task::spawn_blocking(move || fence_on(&url, KEY) == 11)
            .await
            .unwrap()
    })
    .await;
    cluster.kill(0).unwrap();
    cluster.restart_empty(0).unwrap();
    // c0 sees the restart (its connection to n0 broke; a read reconnects and finds a new run
    // id) and its next round schedules the repair: before the fix, the repair read n1 and n2
    // at once, before c1's acquire reached n2.
    wait_until(WAIT, "c0 reconnected to n0", || async {
        c0.status(KEY).await.is_ok_and(|s| s.nodes[0].state.is_ok())
    })
    .await;
    assert!(
        c0.try_acquire(PROBE, HOLD_OUT_TTL).await.is_err(),
        "n0 is held out"
    );

    let (_c1, granted) = round.await.unwrap();
    let held = granted.expect("c1's round: yes from n0 (before its restart) and n2");
    let t1 = held.token().get();
    // c1 stalls and never releases (a release would raise every counter and hide the gap).
    std::mem::forget(held);

    // c0 waits until n0 counts again (hold-out over, repaired) without an attempt on KEY: a
    // refused attempt's yes on n1 would increment n1 too. While n0 is out the probe fails, then
    // it is acquired on n0 and n2. c1's key still holds n2 (set 2 s after n0
    // restarted, it outlives the hold-out by that), so c0 then takes KEY on n0 and n1.
    let probe = Mutex::new(None);
    wait_until(HOLD_OUT_TTL * 3, "n0 counts again for c0", || async {
        let got = c0.try_acquire(PROBE, HOLD_OUT_TTL).await.ok();
        let done = got.is_some();
        *probe.lock().unwrap() = got;
        done
    })
    .await;
    let probe = probe.into_inner().unwrap().expect("acquired");
    probe.release().await.unwrap();
    del_lock(&urls[1], KEY);
    let after = c0
        .try_acquire(KEY, HOLD_OUT_TTL)
        .await
        .expect("n0 and n1 are free for c0");
    assert!(
        after.token().get() > t1,
        "token repeated: {} after c1's {t1}",
        after.token()
    );
    after.release().await.unwrap();
}
