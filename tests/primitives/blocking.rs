//! The blocking facade (feature `blocking`) and guards dropped outside a runtime, against real
//! redis-server processes: no tokio runtime on the calling thread.
#![cfg(feature = "blocking")]

use std::time::{Duration, Instant};

use crate::support::*;
use quorumlock::{ConfigError, Error, blocking};

/// Far longer than any test here: a key that goes early was released, not expired.
const FACADE_TTL: Duration = Duration::from_secs(60);

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

    let lock = locks.try_acquire("job", FACADE_TTL).expect("acquire");
    assert!(lock.token().get() >= 1);
    assert!(holders(&urls, "job") >= 2, "a quorum holds the key");
    let other = locks.try_acquire("job", FACADE_TTL).unwrap_err();
    assert!(other.is_held(), "{other}");

    let validity = lock.extend(FACADE_TTL).expect("extend");
    // The new validity: the ttl less the round and the drift (0.6 s of a 60 s ttl); the rest
    // of the margin covers a loaded box's slow round.
    assert!(
        validity > FACADE_TTL - Duration::from_secs(5),
        "{validity:?}"
    );
    lock.keep_alive();
    assert!(!lock.is_lost());

    lock.release().expect("release");
    locks.flush().expect("flush");
    assert_eq!(holders(&urls, "job"), 0, "released everywhere");
    let status = locks.status("job").expect("status");
    assert_eq!(status.holder(), None);

    // Operating it: the inventory, a token check, a revoke.
    let held = locks.try_acquire("job", FACADE_TTL).expect("acquire");
    let inventory = locks.locks("jo").expect("inventory");
    assert_eq!(inventory.locks.len(), 1);
    assert_eq!(inventory.locks[0].value, held.value());
    assert!(locks.is_current("job", held.token()).expect("check"));
    let revocation = locks.revoke("job").expect("revoke");
    assert!(revocation.revoked() && revocation.token > held.token());
    assert!(!locks.is_current("job", held.token()).expect("check"));
    assert!(held.extend(FACADE_TTL).is_err());
}

/// A dropped blocking guard is released before `drop` returns (on a quorum; the rest follows
/// on the client's runtime): the same key can be taken again at once, as a blocking API's user
/// expects (issue 28).
#[test]
fn b11_a_dropped_guard_is_released_before_drop_returns() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let lock = locks.try_acquire("dropped", FACADE_TTL).expect("acquire");
    assert!(holders(&urls, "dropped") >= 2);
    drop(lock);
    let again = locks
        .try_acquire("dropped", FACADE_TTL)
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
    let lock = locks.try_acquire("forgotten", FACADE_TTL).expect("acquire");
    lock.forget();
    assert!(holders(&urls, "forgotten") >= 2, "still held after forget");
    let err = locks.try_acquire("forgotten", FACADE_TTL).unwrap_err();
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
        .with_lock("scoped", FACADE_TTL, |lock| {
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
        .block_on(async { locks.try_acquire("inside", FACADE_TTL).map(|_| ()) })
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ConfigError::Runtime(_))),
        "{err}"
    );
    // The client still works from a plain thread afterwards.
    locks
        .try_acquire("inside", FACADE_TTL)
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
        .block_on(locks.try_acquire("plain-thread", FACADE_TTL))
        .expect("acquire");
    assert!(holders(&urls, "plain-thread") >= 2);
    // Dropped on a thread with no runtime at all, while the acquiring runtime still runs.
    std::thread::spawn(move || drop(lock)).join().unwrap();
    wait_blocking(WAIT, "the release sent on the acquiring runtime", || {
        holders(&urls, "plain-thread") == 0
    });
}

/// `acquire_all` from a thread without a runtime: all the keys or none, their tokens, and a
/// dropped set released before `drop` returns.
#[test]
fn b16_acquire_all_takes_every_key_or_none() {
    let cluster = cluster(3);
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let both = locks
        .acquire_all(["account:4", "account:17"], FACADE_TTL)
        .expect("acquire_all");
    assert_eq!(
        both.keys().collect::<Vec<_>>(),
        ["account:17", "account:4"],
        "sorted"
    );
    assert!(both.token("account:4").is_some_and(|t| t.get() >= 1));
    assert!(both.extend(FACADE_TTL).expect("extend") > Duration::ZERO);
    // One of them held: the other is not taken either.
    let err = locks.try_acquire("account:4", FACADE_TTL).unwrap_err();
    assert!(err.is_held(), "{err}");
    drop(both);
    let again = locks
        .acquire_all(["account:17", "account:4"], FACADE_TTL)
        .expect("free at once after the drop");
    let held = locks.try_acquire("account:99", FACADE_TTL).unwrap();
    let err = locks
        .acquire_all(["account:99", "account:100"], FACADE_TTL)
        .unwrap_err();
    assert!(err.is_held(), "{err}");
    assert!(
        locks
            .try_acquire("account:100", FACADE_TTL)
            .is_ok_and(|l| l.release().is_ok()),
        "all or nothing: account:100 was given back"
    );
    held.release().unwrap();
    again.release().expect("release");
}

/// A semaphore of two permits admits two holders, refuses a third, and a released permit is
/// free again at once.
#[test]
fn b17_a_semaphore_admits_its_permits() {
    let cluster = cluster(3);
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let exports = locks.semaphore("exports", 2).expect("semaphore");
    assert_eq!((exports.name(), exports.permits()), ("exports", 2));
    let a = exports.try_acquire(FACADE_TTL).expect("first permit");
    let b = exports.acquire(FACADE_TTL).expect("second permit");
    assert_ne!(a.index(), b.index());
    assert!(b.token().get() >= 1);
    b.keep_alive();
    let err = exports.try_acquire(FACADE_TTL).unwrap_err();
    assert!(err.is_held(), "{err}");
    let index = a.index();
    a.release().expect("release");
    let c = exports
        .acquire_timeout(FACADE_TTL, Duration::from_secs(5))
        .expect("the released permit");
    assert_eq!(c.index(), index);
    drop(c);
    drop(b);
    let again = exports
        .try_acquire(FACADE_TTL)
        .expect("free after the drops");
    again.release().unwrap();
}

/// An election from blocking code: the campaign leads, a second candidate's bounded campaign
/// gives up naming the leader (with its owner name), and after the resign it leads.
#[test]
fn b18_an_election_campaigns_reads_the_leader_and_resigns() {
    let cluster = cluster(3);
    let a_locks = blocking::Redlock::new(
        builder(&cluster)
            .owner("host-a/pid 1")
            .build()
            .expect("config"),
    )
    .expect("runtime");
    let b_locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let election = |locks: &blocking::Redlock, id: &str| {
        locks.election(
            quorumlock::Election::builder(locks.as_async().clone(), "blocking-e")
                .ttl(Duration::from_secs(10))
                .candidate(id)
                .build()
                .expect("election"),
        )
    };
    let (a, b) = (election(&a_locks, "a"), election(&b_locks, "b"));
    let leadership = a.campaign().expect("a leads");
    assert!(a.is_leading() && !leadership.is_lost());
    assert!(a.health().is_leader());
    let err = b.campaign_timeout(Duration::from_millis(200)).unwrap_err();
    assert!(err.is_held(), "{err}");
    wait_blocking(WAIT, "the leader record names a", || {
        b.leader()
            .ok()
            .flatten()
            .is_some_and(|l| l.candidate.as_deref() == Some("a"))
    });
    let leader = b.leader().unwrap().expect("a leads");
    assert_eq!(leader.token, leadership.token());
    assert_eq!(leader.owner.as_deref(), Some("host-a/pid 1"));
    let health = b.health().to_string();
    assert!(
        health.starts_with("standby (leader a, owner \"host-a/pid 1\", token "),
        "{health}"
    );
    leadership.resign().expect("resign");
    let next = b.campaign_timeout(WAIT).expect("b leads after the resign");
    assert!(next.token() > leader.token);
    drop(next); // resigns before drop returns
    assert!(!b.is_leading());
    assert_eq!(a.leader().unwrap(), None);
}

/// Run-once from blocking code: the job runs on this thread (and may use the blocking client
/// meanwhile), the tick runs once, a second call skips it as already run.
#[test]
fn b19_run_once_runs_a_tick_once_on_this_thread() {
    let cluster = cluster(3);
    let locks = blocking::Redlock::new(client(&cluster)).expect("runtime");
    let job = locks.run_once(
        quorumlock::RunOnce::builder(locks.as_async().clone(), "report")
            .ttl(Duration::from_secs(10))
            .marker_ttl(Duration::from_secs(60))
            .instance("i1")
            .build()
            .expect("job"),
    );
    let caller = std::thread::current().id();
    let outcome = job
        .run(7, |ctx| {
            assert_eq!(
                std::thread::current().id(),
                caller,
                "the job runs on this thread"
            );
            // The blocking client works inside the job.
            let status = locks.status("report").expect("status inside the job");
            assert!(status.holder().is_some(), "the job's lock is held");
            (ctx.tick().to_owned(), ctx.token())
        })
        .expect("run");
    assert!(outcome.ran(), "{outcome:?}");
    let again = job.run(7, |_| ()).expect("run");
    assert!(!again.ran(), "{again:?}");
    let failed = job.try_run(8, |_| Err::<(), _>("boom")).expect("try_run");
    assert!(failed.ran(), "{failed:?}");
    assert!(
        !job.run(8, |_| ()).expect("run").ran(),
        "at most once by default"
    );
}
