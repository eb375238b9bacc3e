//! Shared test support: real clusters from `quorumlock::testkit`, a client tuned for a busy
//! test machine, deadline-bounded waits, and direct reads of each node.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::Once;
use std::time::Duration;

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;
use tokio::time::Instant;

mod pool;
#[allow(unused_imports)]
pub use pool::{Cluster, cluster, fresh_cluster};

/// Generous per-node timeout: a loaded 2-core box can take tens of ms to answer.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(300);
/// Upper bound for any condition a test waits on.
pub const WAIT: Duration = Duration::from_secs(10);

pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// A client for the cluster with test-friendly timings.
pub fn client(cluster: &LocalCluster) -> Redlock {
    builder(cluster).build().expect("valid config")
}

pub fn builder(cluster: &LocalCluster) -> quorumlock::RedlockBuilder {
    Redlock::builder(cluster.urls())
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(20))
}

/// Waits until `pred` holds, polling every 10 ms, for at most `within`; panics naming `what`.
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut pred: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if pred().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Extends `lock` until every node in `urls` holds its key. An acquisition is only sure to stand
/// on a quorum (a call still unanswered when the quorum is reached may never run); an extension
/// re-sets the key where it is missing.
pub async fn spread(lock: &quorumlock::Lock, urls: &[String]) {
    wait_until(WAIT, "every node holds the lock", || async {
        if holders(urls, lock.key()) == urls.len() {
            return true;
        }
        let _ = lock.extend(lock.ttl()).await;
        false
    })
    .await;
}

/// The lock key for a user key (the library's documented layout).
pub fn lock_key(key: &str) -> String {
    format!("quorumlock:{{{key}}}")
}

/// The fencing counter of a user key (the library's documented layout, written here again as
/// an independent check of it): the bucket `quorumlock:fence:{T}` of the lock key's Cluster
/// slot, `T` the first of `0-9A-Za-z` strings by length then order whose slot it is.
pub fn fence_key(key: &str) -> String {
    format!(
        "quorumlock:fence:{{{}}}",
        slot_tag(slot(lock_key(key).as_bytes()))
    )
}

/// Redis Cluster's hash slot of a key.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let len = key[open + 1..].iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &key[open + 1..open + 1 + len])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

fn slot_tag(s: u16) -> String {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let mut tags = vec![String::new(); 16384];
        let mut strings: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..3 {
            strings = strings
                .iter()
                .flat_map(|p| ALPHABET.iter().map(move |&c| [p.as_slice(), &[c]].concat()))
                .collect();
            for t in &strings {
                let slot = usize::from(slot(t));
                if tags[slot].is_empty() {
                    tags[slot] = String::from_utf8(t.clone()).expect("ascii");
                }
            }
        }
        tags
    });
    tags[usize::from(s)].clone()
}

/// A direct connection to one node, bounded both ways: a paused node fails the test instead of
/// hanging it.
/// The configuration of a test's own async connection to a node: the connect and every reply
/// bounded by [`WAIT`]. redis 1.x's defaults (a 500 ms reply bound) fail on a loaded box
/// (`clock jump script: timed out` in a suite run beside benchmarks).
pub fn direct_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(WAIT))
        .set_response_timeout(Some(WAIT))
}

pub fn conn(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).expect("url");
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    conn.set_write_timeout(Some(Duration::from_secs(5)))
        .expect("write timeout");
    conn
}

/// Waits until the client has a live connection to every node: a status read answered by all.
/// A round returns at its quorum, so an acquire-and-release warm-up does not prove this.
pub async fn warm(locks: &Redlock) {
    wait_until(WAIT, "every node answers the client", || async {
        locks
            .status("warm-up")
            .await
            .is_ok_and(|s| s.answered() == locks.node_count())
    })
    .await;
}

/// The lock value stored on one node for `key` (None when absent).
pub fn value_on(url: &str, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(lock_key(key))
        .query(&mut conn(url))
        .expect("GET")
}

/// The fencing counter on one node.
pub fn fence_on(url: &str, key: &str) -> u64 {
    let v: Option<u64> = redis::cmd("GET")
        .arg(fence_key(key))
        .query(&mut conn(url))
        .expect("GET");
    v.unwrap_or(0)
}

/// Writes a foreign owner's value for `key` on one node, as another client would.
pub fn set_foreign(url: &str, key: &str, value: &str, ttl: Duration) {
    let _: () = redis::cmd("SET")
        .arg(lock_key(key))
        .arg(value)
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .query(&mut conn(url))
        .expect("SET");
}

/// Deletes the lock key on one node (as its expiry there would).
pub fn del_lock(url: &str, key: &str) {
    let _: () = redis::cmd("DEL")
        .arg(lock_key(key))
        .query(&mut conn(url))
        .expect("DEL");
}

pub fn set_fence(url: &str, key: &str, n: u64) {
    let _: () = redis::cmd("SET")
        .arg(fence_key(key))
        .arg(n)
        .query(&mut conn(url))
        .expect("SET");
}

/// How many of the given nodes hold any value for `key`.
pub fn holders(urls: &[String], key: &str) -> usize {
    urls.iter().filter(|u| value_on(u, key).is_some()).count()
}

/// What a `tracing` subscriber receives, as formatted lines.
#[derive(Clone, Default)]
pub struct Captured(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The ttl of the locks a test takes when its value does not matter: far longer than any step
/// of a test, so that no lock expires by accident. A test whose scenario needs another ttl names
/// its own.
pub const TTL: Duration = Duration::from_secs(10);
/// The ttl of a lock that must outlast a slower test's steps (TLS handshakes, a hand-over
/// between clients, a name read back by several readers).
pub const LONG_TTL: Duration = Duration::from_secs(30);

/// Campaigns until `election` leads, for at most [`WAIT`].
pub async fn lead(election: &quorumlock::Election) -> quorumlock::Leadership {
    tokio::time::timeout(WAIT, election.campaign())
        .await
        .expect("leads within the wait")
        .expect("campaign")
}

/// One field (`calls`, `usec_per_call`, ...) of `cmdstat_<command>` in a node's
/// `INFO commandstats` (the commands scripts call count too); `None` before the command first
/// ran.
pub fn commandstat(url: &str, command: &str, field: &str) -> Option<String> {
    let prefix = format!("cmdstat_{command}:");
    let field = format!("{field}=");
    commandstats(url)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix(&field)))
        .map(str::to_owned)
}

/// A node's `INFO commandstats`.
fn commandstats(url: &str) -> String {
    redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn(url))
        .expect("INFO")
}

/// `calls` of one command on one node (0 when never called).
pub fn calls(url: &str, command: &str) -> u64 {
    commandstat(url, command, "calls").map_or(0, |n| n.parse().expect("a count"))
}

/// Script calls on one node: `EVALSHA`, and `EVAL` (a connection's first call of each script
/// goes with its body).
pub fn script_calls(url: &str) -> u64 {
    calls(url, "evalsha") + calls(url, "eval")
}

/// `SET` calls per node: every acquire round sends one to each node it reaches, refused or not,
/// in either form (the pipelined `SET NX PX GET` + `INCR`, or the script's `SET NX`).
pub fn sets(urls: &[String]) -> Vec<u64> {
    urls.iter().map(|u| calls(u, "set")).collect()
}

/// Every command a node has run (the commands scripts call included).
pub fn commands(url: &str) -> u64 {
    commandstats(url)
        .lines()
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// The commands a node has run or refused, per command (`get`, `client|setinfo`, ...) from its
/// `INFO commandstats` (`calls` + `rejected_calls`; the commands scripts call included), and
/// under `unknown` those refused without an entry there (a command or subcommand the server
/// does not know, such as `CLIENT SETINFO` before Redis 7.2): its error replies (`INFO stats`)
/// that no entry counts.
pub fn calls_by_command(url: &str) -> std::collections::BTreeMap<String, u64> {
    // A connection that sends nothing on connect (no `CLIENT SETINFO`): the reading's only
    // command is its `INFO`.
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info().expect("url");
    let quiet = info.redis_settings().clone().set_skip_set_lib_name();
    let client = redis::Client::open(info.set_redis_settings(quiet)).expect("url");
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("stats")
        .query(&mut conn)
        .expect("INFO");
    let field = |rest: &str, name: &str| -> u64 {
        rest.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut calls = std::collections::BTreeMap::new();
    let mut errors_counted = 0;
    let mut errors = 0;
    for line in info.lines() {
        if let Some(v) = line.strip_prefix("total_error_replies:") {
            errors = v.trim().parse().expect("a count");
        }
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let rejected = field(rest, "rejected_calls");
        errors_counted += rejected + field(rest, "failed_calls");
        calls.insert(name.to_owned(), field(rest, "calls") + rejected);
    }
    calls.insert("unknown".to_owned(), errors - errors_counted.min(errors));
    calls
}

/// Each node's [`calls_by_command`] now.
pub fn readings(urls: &[String]) -> Vec<std::collections::BTreeMap<String, u64>> {
    urls.iter().map(|u| calls_by_command(u)).collect()
}

/// What a fresh process may send each node to take one uncontended lock, connection setup
/// included: the connect's `INFO` (the guards' settings, the clock-jump check's first reading)
/// and `EVAL` of `return 1` (the server runs scripts), then the acquire's `SET` and `INCR`. No
/// `CONFIG GET` (`INFO` gives the eviction settings, a node without AOF needs no
/// `appendfsync`) and no `TIME` (the connect's reading is less than a period old).
pub const FRESH_TAKE_COMMANDS: u64 = 4;

/// Checks, node by node, that a fresh process took its lock between the readings `before` and
/// `taking` with at most [`FRESH_TAKE_COMMANDS`] commands and no `SCRIPT LOAD`, and prints what
/// each node ran for the take and for the release (until `after`). `label` names the case.
pub fn assert_fresh_take(
    urls: &[String],
    readings: [&[std::collections::BTreeMap<String, u64>]; 3],
    label: &str,
) {
    let [before, taking, after] = readings;
    for (i, url) in urls.iter().enumerate() {
        let took = ran_between(&before[i], &taking[i]);
        let released = ran_between(&taking[i], &after[i]);
        eprintln!("{label}, node {i}: taking {took:?}; releasing {released:?}");
        let n: u64 = took.values().sum();
        assert!(
            n <= FRESH_TAKE_COMMANDS && !took.contains_key("script|load"),
            "{url}, {label}: {n} commands: {took:?}"
        );
    }
}

/// What a node ran between two readings of [`calls_by_command`] (`before`, `after`), by
/// command: the `INFO` that took `before` is counted in `after` and taken out here.
pub fn ran_between(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, &n)| {
            let own = u64::from(name == "info");
            let ran = n - before.get(name).copied().unwrap_or(0) - own;
            (name.clone(), ran)
        })
        .filter(|&(_, ran)| ran > 0)
        .collect()
}

/// Whether `err` is a loss because a quorum no longer holds our value (another owner, or none).
pub fn is_not_owner(err: &quorumlock::Error) -> bool {
    matches!(
        err,
        quorumlock::Error::Lost {
            reason: quorumlock::LostReason::NotOwner { .. },
            ..
        }
    )
}

/// Whether `err` is a loss because the lock's deadline passed.
pub fn is_expired(err: &quorumlock::Error) -> bool {
    matches!(
        err,
        quorumlock::Error::Lost {
            reason: quorumlock::LostReason::Expired,
            ..
        }
    )
}

/// One node's `MONITOR` stream, on a connection of its own: every command the node runs from
/// the start on, one line each, those a script runs marked `lua`
/// (`+1732860000.123456 [0 lua] "DEL" "quorumlock:{k}"`). Blocking: read it off the runtime
/// (`spawn_blocking`), or the client's connections are not driven meanwhile.
pub struct Monitor {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl Monitor {
    /// Starts monitoring the node at `url` (a plain `redis://host:port` one).
    pub fn start(url: &str) -> Monitor {
        use std::io::{BufRead, Write};
        let addr = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .expect("an address");
        let stream = std::net::TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(WAIT)).expect("read timeout");
        (&stream).write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut reader = std::io::BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("MONITOR's answer");
        assert_eq!(ok, "+OK\r\n", "MONITOR");
        Monitor { reader }
    }

    /// Reads lines until `count` of them satisfy `pred`, for at most [`WAIT`]; returns every
    /// line read (the monitor's command lines, without their `\r\n`).
    pub fn until(&mut self, count: usize, pred: impl Fn(&str) -> bool) -> Vec<String> {
        use std::io::BufRead;
        let deadline = std::time::Instant::now() + WAIT;
        let mut lines = Vec::new();
        let mut matched = 0;
        while matched < count {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after {WAIT:?}: {matched} of {count} lines matched in {lines:#?}"
            );
            let mut line = String::new();
            let read = self.reader.read_line(&mut line).expect("a monitor line");
            assert!(read > 0, "the monitor connection closed");
            let line = line.trim_end().to_owned();
            matched += usize::from(pred(&line));
            lines.push(line);
        }
        lines
    }
}
