//! Issue 30: with `IoThread::Always` the client runs its connections and rounds on an I/O
//! thread of its own. Everything a user sees still works from there, called from a multi-thread
//! runtime: acquire, extend, keep-alive, waiting woken by a release, release, a guard dropped
//! outside any runtime, a cancelled acquisition; the thread ends once the last handle on the
//! client is dropped; the default (`IoThread::Never`) starts none.

use std::sync::Mutex;
use std::time::Duration;

use crate::support::*;
use quorumlock::testkit::LocalCluster;
use quorumlock::{IoThread, Redlock};

/// This process's threads named as the client's I/O thread.
fn io_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "quorumlock-io")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits (bounded) until `n` I/O threads run.
fn until_io_threads(n: usize, what: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    while io_threads() != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} I/O threads, expected {n}",
            io_threads()
        );
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// A multi-thread runtime (two workers) and a client of `cluster` whose connections and rounds
/// run on an I/O thread of its own.
fn on_io_thread(cluster: &LocalCluster) -> (tokio::runtime::Runtime, Redlock) {
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let locks = builder(cluster)
        .io_thread(IoThread::Always)
        .build()
        .unwrap();
    (mt, locks)
}

/// The tests of this module count the process's threads: one at a time (no other module of
/// this binary starts an I/O thread: only `IoThread::Always` does).
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn io1_an_io_thread_serves_every_operation_and_ends_with_the_client() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = cluster(3);
    let urls = cluster.urls();
    assert_eq!(io_threads(), 0);
    let (mt, locks) = on_io_thread(&cluster);
    let dropped_outside = mt.block_on(every_operation(&locks, &urls));
    drop(dropped_outside);
    until_released_everywhere(&urls, "io1-dropped");
    assert_eq!(io_threads(), 1);
    drop(locks);
    until_io_threads(0, "after the last client handle dropped");
    drop(mt);

    // From a current-thread runtime too.
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let always = builder(&cluster)
        .io_thread(IoThread::Always)
        .build()
        .unwrap();
    ct.block_on(async {
        let lock = always.acquire("io1-always", TTL).await.unwrap();
        lock.extend(TTL).await.unwrap();
        lock.release().await.unwrap();
    });
    assert_eq!(io_threads(), 1);
    drop(always);
    until_io_threads(0, "after the current-thread caller's client dropped");
    the_default_starts_no_thread(&cluster, &ct);
}

/// Acquire, extend, keep-alive, a waiter woken by a release, release, all through `locks`;
/// returns a guard for the caller to drop outside any runtime.
async fn every_operation(locks: &Redlock, urls: &[String]) -> quorumlock::Lock {
    warm(locks).await;
    assert_eq!(io_threads(), 1, "the first operation starts the I/O thread");
    let lock = locks.acquire("io1", TTL).await.unwrap();
    assert!(lock.token().get() > 0);
    assert!(lock.extend(TTL).await.unwrap() > Duration::from_secs(5));
    // Keep-alive runs its extensions on the I/O thread.
    let short = locks
        .acquire("io1-kept", Duration::from_millis(300))
        .await
        .unwrap();
    short.keep_alive();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!short.is_lost(), "kept alive past its ttl");
    short.release().await.unwrap();
    // A waiter (another clone, another task) is woken by the release.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire_timeout("io1", TTL, WAIT).await })
    };
    wait_until(
        WAIT,
        "the waiter has announced itself on a node",
        || async {
            urls.iter().any(|u| {
                redis::cmd("EXISTS")
                    .arg(format!("{}:waiters", lock_key("io1")))
                    .query::<i64>(&mut conn(u))
                    .is_ok_and(|n| n > 0)
            })
        },
    )
    .await;
    assert!(!waiter.is_finished(), "the lock is held: the waiter waits");
    lock.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second.token().get() > 0);
    second.release().await.unwrap();
    assert!(locks.try_acquire("io1", TTL).await.is_ok_and(|l| {
        l.forget();
        true
    }));
    // A guard taken here and dropped outside any runtime still releases (on the I/O thread).
    locks.acquire("io1-dropped", TTL).await.unwrap()
}

/// Waits (bounded) until `key` is gone from every node: a dropped guard's release landed.
fn until_released_everywhere(urls: &[String], key: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    while !urls.iter().all(|u| value_on(u, key).is_none()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped guard's release never landed"
        );
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// The default (`IoThread::Never`) starts no thread, from a multi-thread runtime or from `ct`.
fn the_default_starts_no_thread(cluster: &LocalCluster, ct: &tokio::runtime::Runtime) {
    let default: Redlock = builder(cluster).build().unwrap();
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    mt.block_on(async {
        default
            .acquire("io1-default", TTL)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    });
    ct.block_on(async {
        default
            .acquire("io1-default", TTL)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    });
    assert_eq!(io_threads(), 0, "the default starts no thread");
}

/// Dropping an acquisition's future on the caller's side aborts it on the I/O thread, and
/// whatever it had set is released: the key is free again within the bounded wait.
#[test]
fn io2_a_cancelled_acquisition_leaves_no_lock_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = cluster(3);
    let (mt, locks) = on_io_thread(&cluster);
    mt.block_on(async {
        warm(&locks).await;
        for i in 0..20 {
            let key = format!("io2-{i}");
            // Cut at a different point each time: before, during or after the round.
            let cut = Duration::from_micros(50 * i);
            let _ = tokio::time::timeout(cut, locks.acquire(&key, TTL)).await;
            wait_until(
                WAIT,
                "the cancelled attempt's key is free again",
                || async {
                    locks.try_acquire(&key, TTL).await.is_ok_and(|l| {
                        l.forget();
                        true
                    })
                },
            )
            .await;
        }
    });
    drop(locks);
    until_io_threads(0, "after the client dropped");
}
