//! `Redlock::locks`: the inventory of held locks, against 5 real nodes with one down (t80);
//! the acquisition time it reads from a value, kept across extensions and a hand-over, unknown
//! for another client's value (t81).

use std::time::{Duration, SystemTime};

use crate::support::*;

/// Writes `value` for each of `keys` on one node (one pipeline), as a client's acquisition
/// that reached only some nodes leaves it.
fn write_on(url: &str, keys: &[String], value: &str, ttl: Duration) {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("SET")
            .arg(lock_key(key))
            .arg(value)
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .ignore();
    }
    let _: () = pipe.query(&mut conn(url)).expect("SET pipeline");
}

/// 1,000 lock keys over 5 nodes: 800 taken by the library, 150 on a bare majority {1,2,3}, 30
/// remnants on one node, 20 expired; node 0 down. The inventory lists exactly the 950 held (no
/// remnant, no expired key, nothing outside the prefix), and costs each node about one command
/// per lock key it holds (counted in `INFO commandstats` against a baseline).
#[tokio::test]
async fn t80_the_inventory_is_complete_without_phantoms_and_bounded() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let started = SystemTime::now();
    let (held, outside, bare) = stage_locks(&locks, &urls).await;
    cluster.kill(0).unwrap();

    let before: Vec<u64> = urls[1..].iter().map(|u| commands(u)).collect();
    let keys_on: Vec<u64> = urls[1..]
        .iter()
        .map(|u| redis::cmd("DBSIZE").query::<u64>(&mut conn(u)).unwrap())
        .collect();
    let fresh = client(&cluster); // as `redlock ls` is: a new process
    let inventory = fresh.locks("inv:").await.unwrap();
    let read = SystemTime::now();
    let cost: Vec<u64> = urls[1..]
        .iter()
        .zip(&before)
        .map(|(u, b)| commands(u) - b - 1) // less the baseline's own INFO
        .collect();

    assert_eq!(inventory.failures.len(), 1, "{:?}", inventory.failures);
    assert!(!inventory.truncated);
    let listed: Vec<&str> = inventory.locks.iter().map(|l| l.key.as_str()).collect();
    let mut expected: Vec<String> = (0..800)
        .map(|i| key("full", i))
        .chain(bare.clone())
        .collect();
    expected.sort();
    assert_eq!(listed.len(), 950, "complete, no phantom");
    assert!(
        listed.iter().zip(&expected).all(|(a, b)| a == b),
        "exactly the held keys"
    );
    assert_every_lock_listed_as_held(&inventory.locks, started, read);
    let full = inventory
        .locks
        .iter()
        .find(|l| l.key.contains(":full:"))
        .unwrap();
    let mine = held.iter().find(|l| l.key() == full.key).unwrap();
    assert_eq!(
        (&full.value, full.fence),
        (&mine.value().to_owned(), mine.token())
    );
    assert_cost_bounded(&cost, &keys_on);
    drop(outside);
    drop(held);
}

/// Lock key `i` of a kind (`full`, `gone`, `bare`, `remnant`) under the prefix `inv:`.
fn key(kind: &str, i: usize) -> String {
    format!("inv:{kind}:{i:04}")
}

/// Stages the 1,000 keys: 800 full locks (returned), 20 short ones left to expire, 150 bare
/// majority values (their keys returned) and 30 one-node remnants; and a lock outside the
/// prefix (returned). Returns once the short ones are gone and the full ones on every node.
async fn stage_locks(
    locks: &quorumlock::Redlock,
    urls: &[String],
) -> (Vec<quorumlock::Lock>, quorumlock::Lock, Vec<String>) {
    let mut held = Vec::new();
    for i in 0..800 {
        let lock = locks.try_acquire(&key("full", i), LONG_TTL).await.unwrap();
        held.push(lock);
    }
    let short = Duration::from_millis(300);
    let mut expiring = Vec::new();
    for i in 0..20 {
        expiring.push(locks.try_acquire(&key("gone", i), short).await.unwrap());
    }
    let bare: Vec<String> = (0..150).map(|i| key("bare", i)).collect();
    for url in &urls[1..4] {
        write_on(url, &bare, "0123456789abcdef0123456789abcdef", LONG_TTL);
    }
    let remnants: Vec<String> = (0..30).map(|i| key("remnant", i)).collect();
    write_on(
        &urls[1],
        &remnants,
        "fedcba9876543210fedcba9876543210",
        LONG_TTL,
    );
    // A lock outside the prefix.
    let outside = locks.try_acquire("other", LONG_TTL).await.unwrap();
    for lock in expiring {
        lock.forget();
    }
    wait_until(WAIT, "the short locks expired on every node", || async {
        (0..20).all(|i| holders(urls, &key("gone", i)) == 0)
    })
    .await;
    wait_until(WAIT, "every full lock on every node", || async {
        (0..800)
            .step_by(97)
            .all(|i| holders(urls, &key("full", i)) == 5)
    })
    .await;
    (held, outside, bare)
}

/// Every listed lock is certain, with a ttl from a quorum; the full ones are on the 4 live
/// nodes with a token and dated between `started` and `read`, the others on 3 without a date.
fn assert_every_lock_listed_as_held(
    listed: &[quorumlock::HeldLock],
    started: SystemTime,
    read: SystemTime,
) {
    for lock in listed {
        assert!(lock.certain, "{lock:?}");
        let ttl = lock.ttl.expect("a quorum answered with it");
        assert!(ttl > Duration::from_secs(20) && ttl <= LONG_TTL, "{lock:?}");
        if lock.key.contains(":full:") {
            assert_eq!(lock.held_on, 4, "{lock:?}");
            assert!(lock.fence.get() >= 1, "{lock:?}");
            // Taken during this test, by this host's clock (to the millisecond, rounded down).
            let at = lock.acquired_at.expect("a value of this crate is dated");
            assert!(
                at + Duration::from_millis(1) > started && at <= read,
                "{lock:?}"
            );
        } else {
            assert_eq!((lock.held_on, lock.value.len()), (3, 32), "{lock:?}");
            assert_eq!(
                lock.acquired_at, None,
                "a random value has no age: {lock:?}"
            );
        }
    }
}

/// The cost: per node, one PTTL per lock key under the prefix, a few SCAN and MGET pages,
/// and the connect of a new client.
fn assert_cost_bounded(cost: &[u64], keys_on: &[u64]) {
    eprintln!(
        "inventory of 950 locks over 4 live nodes (keys per node {keys_on:?}): commands per node {cost:?}"
    );
    for (i, c) in cost.iter().enumerate() {
        let lock_keys = if (1..4).contains(&(i + 1)) {
            950 + 30 * usize::from(i == 0)
        } else {
            800
        };
        assert!(
            *c <= lock_keys as u64 + 60,
            "node {}: {c} commands for {lock_keys} lock keys",
            i + 1
        );
    }
}

/// A lock's acquisition time is its value's: the same after extensions and after another
/// process resumes it by value, as any fresh client reads it; a value another client wrote
/// (random hex, as node-redlock and redsync write) has none.
#[tokio::test]
async fn t81_the_acquisition_time_survives_extension_and_hand_over() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let before = SystemTime::now();
    let dispatcher = client(&cluster);
    let lock = dispatcher.acquire("aged:job", LONG_TTL).await.unwrap();
    let after = SystemTime::now();
    let (value, token) = (lock.value().to_owned(), lock.token());
    lock.forget();
    let worker = client(&cluster);
    let resumed = worker
        .resume("aged:job", &value, token, LONG_TTL)
        .await
        .unwrap();
    resumed.extend(LONG_TTL).await.unwrap();
    // A foreign client's lock in the namespace, on every node.
    for url in &urls {
        let _: () = redis::cmd("SET")
            .arg(lock_key("aged:foreign"))
            .arg("5f0c2a9e81d34b7c9a6e0f1d2c3b4a59")
            .arg("PX")
            .arg(LONG_TTL.as_millis() as u64)
            .query(&mut conn(url))
            .unwrap();
    }

    let inventory = client(&cluster).locks("aged:").await.unwrap();
    let now = SystemTime::now();
    let keys: Vec<&str> = inventory.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["aged:foreign", "aged:job"]);
    let (foreign, job) = (&inventory.locks[0], &inventory.locks[1]);
    assert_eq!(
        (foreign.acquired_at, foreign.age(now)),
        (None, None),
        "{foreign:?}"
    );
    assert_eq!(job.value, value);
    let at = job.acquired_at.expect("dated");
    assert!(
        at + Duration::from_millis(1) > before && at <= after,
        "the dispatcher's acquisition, not the resume or the extension: {job:?}"
    );
    let age = job.age(now).unwrap();
    // The stamp is rounded down to a millisecond: up to 1 ms before `before`.
    let most = now.duration_since(before).unwrap() + Duration::from_millis(1);
    assert!(age <= most, "{age:?} {most:?}");
    drop(resumed);
}
