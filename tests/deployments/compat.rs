//! Compat mode (issue 15, item 6): the lock on a resource is the plain Redis key, as other
//! Redlock clients write it, so this client and `rslock` (standing in for redsync, node-redlock
//! and pottery, which use the same `SET NX PX` / compare-and-delete protocol) exclude each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use crate::support::*;
use quorumlock::{ConfigError, Election, Error, Redlock, RunOnce};

fn compat_client(cluster: &quorumlock::testkit::LocalCluster) -> Redlock {
    builder(cluster).compat(true).build().unwrap()
}

fn plain_get(url: &str, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut conn(url))
        .expect("GET")
}

/// The lock is the plain key with a random value and a ttl; the token is 0; extension and
/// release touch only our value; no other key is written; elections and run-once refuse it.
#[tokio::test]
async fn c1_compat_mode_locks_the_plain_resource_name() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = compat_client(&cluster);
    warm(&locks).await;
    let lock = locks.acquire("orders", TTL).await.unwrap();
    assert_eq!(lock.token().get(), 0);
    // The acquisition stands on a quorum (the last node's call may land later, or not at all).
    let holders: Vec<&String> = urls
        .iter()
        .filter(|u| plain_get(u, "orders").is_some())
        .collect();
    assert!(holders.len() >= 2, "{holders:?}");
    let value = plain_get(holders[0], "orders").expect("the plain key is set");
    assert_eq!(value.len(), 32, "{value}");
    assert!(
        holders
            .iter()
            .all(|u| plain_get(u, "orders").as_ref() == Some(&value))
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg("orders")
        .query(&mut conn(holders[0]))
        .unwrap();
    assert!(pttl > 0 && pttl <= TTL.as_millis() as i64, "{pttl}");
    // Someone else's value on one node (one we do not hold, else one of three we hold) is left
    // alone by our extension there, and the extension still has its quorum.
    let other = urls
        .iter()
        .find(|u| !holders.contains(u))
        .unwrap_or(&urls[2])
        .clone();
    set_plain(&other, "orders", "someone-else");
    lock.extend(TTL).await.unwrap();
    assert_eq!(plain_get(&other, "orders").as_deref(), Some("someone-else"));
    lock.release().await.unwrap();
    for url in &urls {
        let expected = (*url == other).then(|| "someone-else".to_owned());
        // The release returns at a quorum: the last node's call may still be on its way.
        wait_until(WAIT, &format!("{url} holds {expected:?}"), || {
            let left = plain_get(url, "orders");
            let expected = expected.clone();
            async move { left == expected }
        })
        .await;
    }
    for url in &urls {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn(url)).unwrap();
        let ours: Vec<&String> = keys
            .iter()
            .filter(|k| k.as_str() != "quorumlock:durability-marker" && k.as_str() != "orders")
            .collect();
        assert!(ours.is_empty(), "{url}: {ours:?}");
    }
    let refused = Election::builder(locks.clone(), "leader").build();
    assert!(matches!(refused.err(), Some(ConfigError::FencingRequired)));
    let refused = RunOnce::builder(locks.clone(), "job").build();
    assert!(matches!(refused.err(), Some(ConfigError::FencingRequired)));
}

fn set_plain(url: &str, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(TTL.as_millis() as u64)
        .query(&mut conn(url))
        .unwrap();
}

/// A lock held by rslock is `Held` for us, and ours is unavailable to rslock.
#[tokio::test]
async fn c2_rslock_and_compat_mode_see_each_others_locks() {
    let cluster = cluster(3);
    let locks = compat_client(&cluster);
    let mut rs = rslock::LockManager::new(cluster.urls());
    rs.set_retry(1, Duration::from_millis(1));
    let theirs = rs.lock("shared", TTL).await.expect("rslock acquires");
    assert!(matches!(
        locks.try_acquire("shared", TTL).await,
        Err(Error::Held { .. })
    ));
    rs.unlock(&theirs).await;
    let ours = locks.try_acquire("shared", TTL).await.unwrap();
    assert!(matches!(
        rs.lock("shared", TTL).await,
        Err(rslock::LockError::Unavailable)
    ));
    ours.release().await.unwrap();
    let again = rs.lock("shared", TTL).await.expect("free again");
    rs.unlock(&again).await;
}

/// Both clients contend on one resource over the same nodes, several tasks each; the critical
/// sections (marked by a flag that an entrant finds clear) never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c3_rslock_and_compat_mode_never_overlap() {
    const ROUNDS: u32 = 40;
    let cluster = cluster(3);
    let locks = compat_client(&cluster);
    warm(&locks).await;
    let inside = Arc::new(AtomicBool::new(false));
    let entries = [Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0))];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let (inside, entered) = (Arc::clone(&inside), Arc::clone(&entries[worker % 2]));
        let (locks, urls) = (locks.clone(), cluster.urls());
        tasks.push(tokio::spawn(async move {
            let mut rs = rslock::LockManager::new(urls);
            rs.set_retry(1, Duration::from_millis(1));
            while entered.load(Ordering::SeqCst) < ROUNDS && tokio::time::Instant::now() < deadline
            {
                // Even workers use quorumlock, odd ones rslock.
                let held: Option<Box<dyn std::any::Any + Send>> = if worker % 2 == 0 {
                    locks
                        .try_acquire("contended", TTL)
                        .await
                        .ok()
                        .map(|l| Box::new(l) as _)
                } else {
                    rs.lock("contended", TTL)
                        .await
                        .ok()
                        .map(|l| Box::new(l) as _)
                };
                let Some(held) = held else {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                };
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "worker {worker} entered while another client held the lock"
                );
                entered.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                inside.store(false, Ordering::SeqCst);
                match held.downcast::<quorumlock::Lock>() {
                    Ok(lock) => lock.release().await.unwrap(),
                    Err(other) => {
                        let lock = other.downcast::<rslock::Lock>().expect("an rslock lock");
                        rs.unlock(&lock).await;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let [ours, theirs] = [0, 1].map(|i| entries[i].load(Ordering::SeqCst));
    assert!(
        ours >= ROUNDS && theirs >= ROUNDS,
        "both clients got the lock repeatedly: quorumlock {ours}, rslock {theirs}"
    );
}

/// The ACL line of a Redis user limited to one resource key, as node-redlock and pottery need
/// it: the commands of their protocol (and `INFO`, which this client reads on connect), no
/// channel, only the key `orders` and pottery's `redlock:orders`.
const LIMITED_USER: &str = "user locker on >locker-pw resetkeys ~orders ~redlock:orders \
                            resetchannels -@all +info +ping +eval +evalsha +script|load \
                            +get +set +del +pexpire +pttl +type";

/// Three servers whose clients log in as `locker` ([`LIMITED_USER`]), the `default` user off,
/// and an `admin` user for the test's own reads.
fn limited_cluster() -> quorumlock::testkit::LocalCluster {
    init_tracing();
    let options = quorumlock::testkit::ServerOptions::new()
        .config_line("user default off")
        .config_line("user admin on >admin-pw ~* &* +@all")
        .config_line(LIMITED_USER)
        .user("locker", "locker-pw");
    quorumlock::testkit::LocalCluster::start_with(3, &options).unwrap_or_else(|e| panic!("{e}"))
}

/// Issue 26, item 5 (b): compat mode sends only the resource key, as the other clients do, so
/// a Redis user limited to that key is enough for acquire, extend and release; and the
/// servers' ACL log shows no refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4_a_user_limited_to_the_resource_key_is_enough_in_compat_mode() {
    let cluster = limited_cluster();
    let locks = builder(&cluster).compat(true).build().unwrap();
    // A status read names the resource key only too.
    warm_on_orders(&locks).await;
    let lock = locks.try_acquire("orders", TTL).await.expect("acquire");
    let extended = lock.extend(TTL).await;
    assert!(extended.is_ok(), "extend: {extended:?}");
    let released = lock.release().await;
    assert!(released.is_ok(), "release: {released:?}");
    released_everywhere_with_no_key_refused(&cluster).await;
}

/// Waits until every node answers `locks` a status read of `orders` (the only key the limited
/// user may read).
async fn warm_on_orders(locks: &Redlock) {
    wait_until(WAIT, "every node answers a status read", || async {
        locks
            .status("orders")
            .await
            .is_ok_and(|s| s.answered() == 3)
    })
    .await;
}

/// Waits until the release of `orders` reached each of the three nodes, then checks that the
/// nodes' ACL logs refused commands only (no key, no channel).
async fn released_everywhere_with_no_key_refused(cluster: &quorumlock::testkit::LocalCluster) {
    for i in 0..3 {
        let port = cluster.get(i).expect("server").port();
        let admin_url = format!("redis://admin:admin-pw@127.0.0.1:{port}");
        // The release returns at a quorum: the last node's call may still be on its way
        // (soak run 3 of 10, quiet: `node 0: the release deleted the key`).
        wait_until(
            WAIT,
            &format!("node {i}: the release deleted the key"),
            || {
                let url = admin_url.clone();
                async move {
                    let held: Option<String> = redis::cmd("GET")
                        .arg("orders")
                        .query(&mut conn(&url))
                        .unwrap();
                    held.is_none()
                }
            },
        )
        .await;
        let mut admin = conn(&admin_url);
        let log: Vec<Vec<String>> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
        // The connect's optional reads (`CONFIG GET`, `CLIENT SETINFO`) may be refused; no key
        // and no channel.
        let reasons: Vec<&str> = log
            .iter()
            .filter_map(|entry| {
                let at = entry.iter().position(|f| f == "reason")?;
                entry.get(at + 1).map(String::as_str)
            })
            .collect();
        assert!(
            reasons.iter().all(|r| *r == "command"),
            "node {i}: ACL LOG reasons {reasons:?}: {log:?}"
        );
    }
}

/// Issue 26, item 5 (c): on a Redis Cluster member in compat mode every call names the lock key
/// only, so no call spans two slots (the release used to name `K` and `K:waiters`, two slots:
/// every release and undo failed with `CROSSSLOT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c5_compat_mode_releases_on_a_cluster_member() {
    init_tracing();
    let standalone = cluster(1);
    let member = quorumlock::testkit::RedisClusterMember::start().unwrap_or_else(|e| panic!("{e}"));
    let locks = Redlock::builder([standalone.urls()[0].clone(), member.url()])
        .node_timeout(NODE_TIMEOUT)
        .compat(true)
        .build()
        .unwrap();
    warm(&locks).await;
    for round in 0..3 {
        let lock = locks.try_acquire("orders", TTL).await.expect("acquire");
        lock.extend(TTL).await.expect("extend");
        let released = lock.release().await;
        assert!(released.is_ok(), "round {round}: release: {released:?}");
        // The release returns at a quorum: the last member's call may still be on its way.
        wait_until(
            WAIT,
            &format!("round {round}: the key is gone everywhere"),
            || async {
                locks.status("orders").await.is_ok_and(|status| {
                    status
                        .nodes
                        .iter()
                        .all(|n| n.state.as_ref().is_ok_and(|s| s.value.is_none()))
                })
            },
        )
        .await;
    }
}

/// Issue 26, item 5 (a), against the real peer: pottery keeps its lock on `NAME` under the key
/// `redlock:NAME` (`Redlock._KEY_PREFIX`), so a compat client excludes it when given
/// `redlock:NAME`, and does not when given the bare name. Needs `python3` with `pottery`
/// (`pip install pottery`); without it the test says so on stderr and passes, unless
/// `QUORUMLOCK_REQUIRE_PEERS` is set (CI sets it, after installing pottery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_compat_mode_and_pottery_exclude_each_other_on_redlock_prefixed_names() {
    if !has_pottery("c6") {
        return;
    }
    let cluster = cluster(3);
    let urls = cluster.urls();
    let locks = compat_client(&cluster);
    warm(&locks).await;
    let pottery = |name: &str| pottery_takes(&urls, name);
    assert!(pottery("printer"), "pottery takes printer");
    assert!(
        urls.iter()
            .any(|u| plain_get(u, "redlock:printer").is_some()),
        "pottery's key is redlock:printer"
    );
    // The bare name is another key: no exclusion.
    let bare = locks
        .try_acquire("printer", TTL)
        .await
        .expect("the bare name is another key");
    bare.release().await.unwrap();
    // The prefixed name is pottery's lock.
    assert!(
        locks
            .try_acquire("redlock:printer", TTL)
            .await
            .unwrap_err()
            .is_held()
    );
    // And ours on redlock:scanner excludes pottery's scanner.
    let ours = locks
        .try_acquire("redlock:scanner", TTL)
        .await
        .expect("acquire");
    assert!(!pottery("scanner"), "pottery must not take a lock we hold");
    ours.release().await.unwrap();
    assert!(pottery("scanner"), "free again once released");
}

/// Whether `python3` with pottery is installed; when not, `test` says on stderr that it is
/// skipped, and fails if `QUORUMLOCK_REQUIRE_PEERS` is set (CI sets it, after installing
/// pottery, so that a pottery test never passes there unrun).
fn has_pottery(test: &str) -> bool {
    let has = std::process::Command::new("python3")
        .args(["-c", "import pottery"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        assert!(
            std::env::var_os("QUORUMLOCK_REQUIRE_PEERS").is_none(),
            "QUORUMLOCK_REQUIRE_PEERS is set but python3 with pottery is not installed"
        );
        eprintln!("{test} skipped: python3 with pottery is not installed (pip install pottery)");
    }
    has
}

/// pottery, in a process of its own, takes NAME (its key: `redlock:NAME`) on `urls` for 10 s
/// and exits without releasing; whether it acquired.
fn pottery_takes(urls: &[String], name: &str) -> bool {
    let script = "import sys\n\
                  from redis import Redis\n\
                  from pottery import Redlock\n\
                  masters = {Redis.from_url(u) for u in sys.argv[2:]}\n\
                  lock = Redlock(key=sys.argv[1], masters=masters, auto_release_time=10)\n\
                  print(lock.acquire(blocking=False))\n";
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(name)
        .args(urls)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim() == "True"
}

/// Issue 26, item 5 (b): when a node's ACL refuses the extension (here the user may not
/// `PEXPIRE`), the kept-alive lock is lost with a reason that names the refusal, not "its
/// validity ran out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c7_a_refused_extension_is_named_in_the_loss() {
    init_tracing();
    let options = quorumlock::testkit::ServerOptions::new()
        .config_line("user default off")
        .config_line(&LIMITED_USER.replace(" +pexpire", ""))
        .user("locker", "locker-pw");
    let cluster = quorumlock::testkit::LocalCluster::start_with(3, &options)
        .unwrap_or_else(|e| panic!("{e}"));
    let locks = builder(&cluster).compat(true).build().unwrap();
    let lock = locks
        .try_acquire("orders", Duration::from_secs(1))
        .await
        .expect("acquire");
    lock.keep_alive();
    tokio::time::timeout(WAIT, lock.lost())
        .await
        .expect("lost within the wait");
    let reason = lock.lost_reason().expect("a reason");
    assert!(
        reason.to_string().contains("PEXPIRE"),
        "the loss names the refused command: {reason}"
    );
}

/// An owner name and a hand-off in compat mode need no more than the resource key: the name
/// rides in the key's value, and the resume names the key only (token 0, as compat's
/// extension). Same user and checks as c4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c8_owner_names_and_hand_off_work_with_a_user_limited_to_the_resource_key() {
    let cluster = limited_cluster();
    let named = |name: &str| builder(&cluster).compat(true).owner(name).build().unwrap();
    let (dispatcher, worker) = (named("dispatcher 1"), named("worker 2"));
    for locks in [&dispatcher, &worker] {
        warm_on_orders(locks).await;
    }
    let lock = dispatcher
        .try_acquire("orders", TTL)
        .await
        .expect("acquire");
    let value = lock.value().to_owned();
    lock.forget();
    let status = worker.status("orders").await.unwrap();
    assert_eq!(status.owner().as_deref(), Some("dispatcher 1"));
    let resumed = worker
        .resume("orders", &value, quorumlock::FencingToken::new(0), TTL)
        .await
        .expect("resume");
    let extended = resumed.extend(TTL).await;
    assert!(extended.is_ok(), "extend: {extended:?}");
    let released = resumed.release().await;
    assert!(released.is_ok(), "release: {released:?}");
    released_everywhere_with_no_key_refused(&cluster).await;
}

/// A compat-mode waiter (no subscriptions: it polls the holder's key) takes over a crashed
/// holder's lock once its key has expired, without waiting for subscriptions compat mode never
/// makes. The connect timeout is 30 s, so a waiter that awaited them would stall for it; the
/// holder's ttl is 400 ms, and the takeover must come within the test's bounded wait.
#[tokio::test]
async fn c9_a_compat_waiter_does_not_wait_for_subscriptions() {
    let cluster = cluster(3);
    let holder = compat_client(&cluster);
    let waiter = builder(&cluster)
        .compat(true)
        .connect_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    warm_on_orders(&holder).await;
    warm_on_orders(&waiter).await;
    let crashed = holder
        .acquire("orders", Duration::from_millis(400))
        .await
        .unwrap();
    crashed.forget();
    let won = tokio::time::timeout(
        WAIT,
        waiter.acquire_timeout("orders", TTL, Duration::from_secs(60)),
    )
    .await
    .expect("the compat waiter took the expired lock (a stall would last the 30 s connect timeout)")
    .unwrap();
    won.release().await.unwrap();
}

/// Locks other Redlock clients took inside a namespace (the resource named as the lock key)
/// are listed by the inventory with no owner and no age: rslock's value (20 random bytes, which
/// must not fail the scan) and pottery's (a UUIDv4; when python3 with pottery is installed)
/// carry no acquisition time, beside a lock of ours whose age is known.
#[tokio::test]
async fn c10_locks_of_other_clients_have_no_age_in_the_inventory() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    // pottery's keys are `redlock:NAME`: this namespace's lock on `{K}` is pottery's on `{K}`.
    let locks = builder(&cluster).key_prefix("redlock").build().unwrap();
    let ours = locks.try_acquire("peers:ours", TTL).await.unwrap();
    let mut rs = rslock::LockManager::new(urls.clone());
    rs.set_retry(1, Duration::from_millis(1));
    let theirs = rs
        .lock(b"redlock:{peers:rslock}", TTL)
        .await
        .expect("rslock acquires");
    let mut expected = vec![("peers:ours", true), ("peers:rslock", false)];
    if has_pottery("c10's pottery part") {
        assert!(pottery_takes(&urls, "{peers:pottery}"), "pottery acquires");
        expected.insert(1, ("peers:pottery", false));
    }
    let fresh = builder(&cluster).key_prefix("redlock").build().unwrap();
    let inventory = fresh.locks("peers:").await.unwrap();
    let listed: Vec<(&str, bool)> = inventory
        .locks
        .iter()
        .map(|l| (l.key.as_str(), l.acquired_at.is_some()))
        .collect();
    assert_eq!(listed, expected, "{inventory:?}");
    assert!(inventory.locks[1..].iter().all(|l| l.owner.is_none()));
    rs.unlock(&theirs).await;
    drop(ours);
}
