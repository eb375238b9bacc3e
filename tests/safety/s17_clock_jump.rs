//! A node whose wall clock steps forward drops lock keys early (Redis expires keys on that
//! clock). The node's clock is stepped for real: its `redis-server` runs under libfaketime
//! (Debian's `libfaketime`; `scripts/ensure-redis.sh` installs it), which reads the offset from a
//! file at every clock read. Debian's `redis-server` allocates with jemalloc, whose start reads
//! the clock before libfaketime is ready; glibc's `libc_malloc_debug.so.0`, preloaded first,
//! takes the allocations instead and the server starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;
use quorumlock::testkit::{RedisServer, ServerOptions};
use quorumlock::{Error, Lock, NodeError, Redlock};
use tokio::time::Instant;

/// The ttl of the test's locks, and its clients' max ttl.
const JUMP_TTL: Duration = Duration::from_secs(4);

/// The first of `names` found in the usual library directories.
fn library(names: &[&str]) -> Option<PathBuf> {
    let dirs = [
        "/usr/lib/x86_64-linux-gnu/faketime",
        "/usr/lib/aarch64-linux-gnu/faketime",
        "/usr/lib/faketime",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ];
    dirs.iter()
        .flat_map(|d| names.iter().map(move |n| Path::new(d).join(n)))
        .find(|p| p.exists())
}

/// A server whose clock is the real one plus the offset written to `offset_file`
/// (`+0`, `+30s`), or `None` (after saying why) when libfaketime is not installed. Fails
/// instead when `QUORUMLOCK_REQUIRE_PEERS` is set (CI installs it).
fn faketime_server(offset_file: &Path) -> Option<RedisServer> {
    let faketime = library(&["libfaketime.so.1"]);
    let malloc = library(&["libc_malloc_debug.so.0"]);
    let (Some(faketime), Some(malloc)) = (faketime, malloc) else {
        assert!(
            std::env::var_os("QUORUMLOCK_REQUIRE_PEERS").is_none(),
            "QUORUMLOCK_REQUIRE_PEERS is set but libfaketime (Debian's libfaketime) or glibc's \
             libc_malloc_debug.so.0 is not installed"
        );
        eprintln!("s17 skipped: libfaketime is not installed (apt-get install libfaketime)");
        return None;
    };
    std::fs::write(offset_file, "+0\n").expect("write the offset file");
    let preload = format!("{} {}", malloc.display(), faketime.display());
    let options = ServerOptions::new()
        .env("LD_PRELOAD", &preload)
        .env(
            "FAKETIME_TIMESTAMP_FILE",
            &offset_file.display().to_string(),
        )
        .env("FAKETIME_NO_CACHE", "1");
    Some(RedisServer::start(&options).unwrap_or_else(|e| panic!("{e}")))
}

/// C1 holds "job" on A and on J (B is unreachable to it); J's clock steps forward past the ttl,
/// which drops C1's key there. C2 met every node before the step. C2 must not take "job" on B
/// and J while C1's lock is valid: its next acquire reads J's `TIME`, sees the clock moved
/// further than the time that passed, and holds J out for the max ttl (the cause named
/// `NodeError::ClockJumped`), then repairs it; afterwards tokens keep growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s17_a_node_whose_clock_steps_forward_is_held_out() {
    clock_step(false).await;
}

/// As s16, with C2's connection to J broken before the step: the reconnect's `TIME` is
/// compared with the last reading of the same server (the same run id), so the jump is seen at
/// the connect and J is held out (its calls fail as held out, not as `ClockJumped`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s17b_a_clock_step_while_disconnected_is_seen_at_the_reconnect() {
    clock_step(true).await;
}

/// The scenario of s17 and s17b; `reconnect` breaks C2's connection to J before the step.
async fn clock_step(reconnect: bool) {
    init_tracing();
    let dir =
        std::env::temp_dir().join(format!("quorumlock-s16-{}-{reconnect}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the offset file");
    let offset = dir.join("faketime");
    let Some(j) = faketime_server(&offset) else {
        return;
    };
    let j_url = j.url();

    assert_faketime_moves_expiry(&j_url, &offset);

    let standalone = cluster(2);
    let urls = vec![
        standalone.urls()[0].clone(),
        standalone.urls()[1].clone(),
        j_url.clone(),
    ];
    let c2 = jump_client(urls.clone());
    warm(&c2).await;
    let c1 = jump_client(vec![
        urls[0].clone(),
        "redis://127.0.0.1:1".to_owned(),
        urls[2].clone(),
    ]);
    let lock = c1.try_acquire("job", JUMP_TTL).await.expect("C1 acquires");
    let t1 = lock.token().get();
    assert!(value_on(&j_url, "job").is_some(), "C1 holds on J");

    if reconnect {
        // Every client connection to J breaks (ours reconnect on their next call).
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut conn(&j_url))
            .expect("CLIENT KILL");
    }
    // J's clock steps forward past the ttl: C1's key there expires at once.
    std::fs::write(&offset, "+50s\n").expect("step the clock");
    let stepped = Instant::now();
    assert!(value_on(&j_url, "job").is_none(), "C1's key expired on J");
    // An acquire reads a node's clock when its last reading is 10 ms old or more (the period:
    // `docs/safety.md`); C2's last reading of J predates the step, and its next acquire comes
    // more than a period after it.
    tokio::time::sleep(Duration::from_millis(20)).await;

    c2_never_takes_over(&c2, &lock, stepped, reconnect).await;

    // Then J counts again, repaired: tokens never go backwards.
    let next = until_j_counts_again(&c2).await;
    assert!(next.token().get() > t1, "token {} after {t1}", next.token());
    next.release().await.expect("release");
    drop(lock);
    drop(j);
    let _ = std::fs::remove_dir_all(&dir);
}

/// libfaketime moves the server's expiry: a key with 30 s to live is gone after a 40 s step of
/// the clock in `offset`.
fn assert_faketime_moves_expiry(j_url: &str, offset: &Path) {
    let mut direct = conn(j_url);
    let () = redis::cmd("SET")
        .arg("probe")
        .arg("x")
        .arg("PX")
        .arg(30_000)
        .query(&mut direct)
        .expect("SET");
    std::fs::write(offset, "+40s\n").expect("step the clock");
    let left: Option<String> = redis::cmd("GET")
        .arg("probe")
        .query(&mut direct)
        .expect("GET");
    assert_eq!(left, None, "libfaketime did not move the server's expiry");
}

/// A client of `urls` with the test's timeouts and `JUMP_TTL` as its max ttl.
fn jump_client(urls: Vec<String>) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
        .max_ttl(JUMP_TTL)
        .build()
        .expect("valid config")
}

/// While C1's `lock` is valid (500 ms margin), C2 tries "job" every 100 ms and never wins; the
/// jump is named (`ClockJumped`, or already seen at the reconnect) and J is held out.
async fn c2_never_takes_over(c2: &Redlock, lock: &Lock, stepped: Instant, reconnect: bool) {
    let mut jumped = reconnect;
    let mut held_out = false;
    let mut attempts = 0;
    while lock.validity() > Duration::from_millis(500) {
        match c2.try_acquire("job", JUMP_TTL).await {
            Ok(second) => panic!(
                "two holders: C2 took \"job\" (token {}) {} ms after J's clock stepped 10 s \
                 forward, while C1's lock (token {}) was valid for {} ms more",
                second.token(),
                stepped.elapsed().as_millis(),
                lock.token().get(),
                lock.validity().as_millis()
            ),
            Err(Error::NoQuorum { failures, .. }) => {
                held_out |= failures
                    .iter()
                    .any(|f| matches!(f.cause, NodeError::HeldOut { .. } | NodeError::Repairing));
                jumped |= failures
                    .iter()
                    .any(|f| matches!(f.cause, NodeError::ClockJumped { .. }));
            }
            Err(e) => assert!(e.is_held(), "{e}"),
        }
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(attempts > 3, "C2 tried {attempts} times only");
    assert!(jumped, "the jump was named (NodeError::ClockJumped)");
    assert!(held_out, "J was held out after the jump");
}

/// Then J counts again, repaired: C2 acquires "job" within the bounded wait.
async fn until_j_counts_again(c2: &Redlock) -> Lock {
    let deadline = Instant::now() + WAIT + JUMP_TTL;
    loop {
        assert!(Instant::now() < deadline, "J never counted again");
        if let Ok(next) = c2.try_acquire("job", JUMP_TTL).await {
            break next;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
