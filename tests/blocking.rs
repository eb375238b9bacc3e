//! The blocking facade (feature `blocking`) and guards dropped outside a runtime, against real
//! redis-server processes: no tokio runtime on the calling thread.
#![cfg(feature = "blocking")]

mod support;

use std::time::{Duration, Instant};

use quorumlock::{ConfigError, Error, blocking};
use support::*;

const TTL: Duration = Duration::from_secs(60);

/// Polls `pred` on this thread until it holds, for at most `within`.
fn wait_blocking(within: Duration, what: &str, mut pred: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !pred() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn b10_a_program_without_a_runtime_acquires_extends_and_releases() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");

    let lock = locks.try_acquire("job", TTL).expect("acquire");
    assert!(lock.token().get() >= 1);
    assert!(holders(&urls, "job") >= 2, "a quorum holds the key");
    let other = locks.try_acquire("job", TTL).unwrap_err();
    assert!(other.is_held(), "{other}");

    let validity = lock.extend(TTL).expect("extend");
    // The new validity: the ttl less the round and the drift (0.6 s of a 60 s ttl); the rest
    // of the margin covers a loaded box's slow round.
    assert!(validity > TTL - Duration::from_secs(5), "{validity:?}");
    lock.keep_alive();
    assert!(!lock.is_lost());

    lock.release().expect("release");
    locks.flush().expect("flush");
    assert_eq!(holders(&urls, "job"), 0, "released everywhere");
    let status = locks.status("job").expect("status");
    assert_eq!(status.holder(), None);
}

/// A dropped blocking guard is released before `drop` returns (on a quorum; the rest follows
/// on the client's runtime): the same key can be taken again at once, as a blocking API's user
/// expects (issue 28).
#[test]
fn b11_a_dropped_guard_is_released_before_drop_returns() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let lock = locks.try_acquire("dropped", TTL).expect("acquire");
    assert!(holders(&urls, "dropped") >= 2);
    drop(lock);
    let again = locks
        .try_acquire("dropped", TTL)
        .expect("the dropped guard was released before drop returned");
    again.release().expect("release");
    // Everything left reaches every node, well before the 60 s ttl could remove the key.
    wait_blocking(WAIT, "released everywhere", || {
        holders(&urls, "dropped") == 0
    });
    // Dropping the client flushes what is still in flight and returns.
    drop(locks);
}

/// `forget` leaves the key to expire: nobody else can take it meanwhile.
#[test]
fn b14_forget_leaves_the_lock_to_expire() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let lock = locks.try_acquire("forgotten", TTL).expect("acquire");
    lock.forget();
    assert!(holders(&urls, "forgotten") >= 2, "still held after forget");
    let err = locks.try_acquire("forgotten", TTL).unwrap_err();
    assert!(err.is_held(), "{err}");
}

/// `with_lock` runs blocking work under the lock and releases it; work that finished after the
/// lock was lost (another owner took the key on every node) is reported as `Error::Lost`, not
/// as done under the lock.
#[test]
fn b15_with_lock_runs_releases_and_reports_a_loss() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let out = locks
        .with_lock("scoped", TTL, |lock| {
            assert!(holders(&urls, "scoped") >= 2, "held while the work runs");
            lock.token().get()
        })
        .expect("with_lock");
    assert!(out >= 1);
    wait_blocking(WAIT, "released after the work", || {
        holders(&urls, "scoped") == 0
    });

    let short = Duration::from_secs(3);
    let err = locks
        .with_lock("scoped", short, |lock| {
            for url in &urls {
                let _: () = redis::cmd("SET")
                    .arg(lock_key("scoped"))
                    .arg("usurper")
                    .arg("PX")
                    .arg(60_000)
                    .query(&mut conn(url))
                    .expect("SET");
            }
            // The next extension (every ttl / 3) finds another owner's value.
            wait_blocking(WAIT, "the lock is lost", || lock.is_lost());
            "done"
        })
        .unwrap_err();
    assert!(err.is_lost(), "{err}");
}

#[test]
fn b12_a_blocking_call_from_inside_an_async_runtime_is_an_error_not_a_panic() {
    let cluster = cluster(3);
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime
        .block_on(async { locks.try_acquire("inside", TTL).map(|_| ()) })
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ConfigError::Runtime(_))),
        "{err}"
    );
    // The client still works from a plain thread afterwards.
    locks
        .try_acquire("inside", TTL)
        .expect("acquire")
        .release()
        .unwrap();
}

#[test]
fn b13_an_async_guard_dropped_outside_any_runtime_is_released_on_the_one_it_came_from() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let locks = client(&cluster);
    let lock = runtime
        .block_on(locks.try_acquire("plain-thread", TTL))
        .expect("acquire");
    assert!(holders(&urls, "plain-thread") >= 2);
    // Dropped on a thread with no runtime at all, while the acquiring runtime still runs.
    std::thread::spawn(move || drop(lock)).join().unwrap();
    wait_blocking(WAIT, "the release sent on the acquiring runtime", || {
        holders(&urls, "plain-thread") == 0
    });
}
