//! The floor: the least work a correct Redlock round can do, written against the `redis` crate
//! directly. Every figure of ours is reported as a ratio to it.
//!
//! One multiplexed connection per node; acquire sends `SET key value NX PX ttl` to every node at
//! once and decides as soon as the outcome is certain (three OK of five, or too few left to
//! reach three); release and extend send a conditional Lua script (`EVALSHA`, loaded on connect)
//! the same way. No per-node timeout, no validity arithmetic, no fencing, no retries, no
//! background cleanup: whatever a library adds on top of this is its overhead.
//!
//! `acquire_fenced` is the same round with the library's acquire script (SET NX PX, then INCR of
//! the fencing counter, in one Lua call): it isolates what fencing costs on the wire and in Redis.
//!
//! Shared by `benches/acquire.rs` and `tools/compare` (included with `#[path]`).
#![allow(dead_code)]

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, Script, Value};

const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
const EXTEND: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
/// The library's acquire script (see `src/scripts.rs`, `ACQUIRE`), copied so the floor can run it.
const ACQUIRE_FENCED: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0";

/// The floor's release as a Redis 7 function (`FCALL floor_release 1 key value`), the same Lua
/// as `RELEASE`: to compare what a function call costs the node against `EVALSHA` (issue 30).
const FUNCTIONS: &str = "#!lua name=quorumlock_floor\nredis.register_function('floor_release', function(keys, args) if redis.call('GET', keys[1]) == args[1] then return redis.call('DEL', keys[1]) end return 0 end)";

/// The library's release script (`src/node/lua.rs`, `RELEASE`), read from the library's source
/// so that it cannot drift from it: the release with the waiters check and the notice.
fn library_release() -> &'static str {
    const LUA_RS: &str = include_str!("../../src/node/lua.rs");
    let at = LUA_RS
        .find("pub(crate) static RELEASE:")
        .expect("lua.rs defines RELEASE");
    let body = &LUA_RS[at..];
    let start = body.find("r#\"").expect("RELEASE's body") + 3;
    let len = body[start..].find("\"#").expect("RELEASE's body ends");
    &body[start..start + len]
}

/// quorumlock's key layout for a user key: the lock and its fencing counter (same hash tag).
pub(crate) fn fenced_keys(key: &str) -> (String, String) {
    (
        format!("quorumlock:{{{key}}}"),
        format!("quorumlock:{{{key}}}:fence"),
    )
}

/// A hand-written Redlock round over multiplexed connections.
#[derive(Clone)]
pub(crate) struct Floor {
    conns: Vec<MultiplexedConnection>,
    quorum: usize,
    release: String,
    extend: String,
    acquire_fenced: String,
    release_notice: String,
}

impl Floor {
    /// Connects to every node and loads the scripts.
    pub(crate) async fn connect(urls: &[String]) -> redis::RedisResult<Floor> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
            .set_response_timeout(None);
        let mut conns = Vec::with_capacity(urls.len());
        let scripts = [RELEASE, EXTEND, ACQUIRE_FENCED, library_release()].map(Script::new);
        for url in urls {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            for s in &scripts {
                s.prepare_invoke().load_async(&mut conn).await?;
            }
            conns.push(conn);
        }
        let [release, extend, acquire_fenced, release_notice] =
            scripts.map(|s| s.get_hash().to_owned());
        Ok(Floor {
            quorum: conns.len() / 2 + 1,
            conns,
            release,
            extend,
            acquire_fenced,
            release_notice,
        })
    }

    /// As [`connect`](Self::connect), but the five connections' driver futures (which redis-rs
    /// otherwise spawns as one task each) run in one task: a round's replies then wake one task
    /// instead of five. An experiment for issue 30 (`tools/compare`'s `floor-1task`): on a
    /// multi-thread runtime, several tasks woken at once by the I/O driver are what spreads a
    /// round over the workers. TCP nodes only.
    pub(crate) async fn connect_one_task(urls: &[String]) -> redis::RedisResult<Floor> {
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let scripts = [RELEASE, EXTEND, ACQUIRE_FENCED, library_release()].map(Script::new);
        let mut conns = Vec::with_capacity(urls.len());
        let mut drivers: Vec<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> = Vec::new();
        for url in urls {
            let client = redis::Client::open(url.as_str())?;
            let info = client.get_connection_info();
            let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "floor-1task: TCP nodes only",
                )));
            };
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            stream.set_nodelay(true)?;
            let connecting = MultiplexedConnection::new_with_config(
                info.redis_settings(),
                stream,
                config.clone(),
            );
            let (conn, driver) = connecting.await?;
            drivers.push(Box::pin(driver));
            conns.push(conn);
        }
        tokio::spawn(futures::future::join_all(drivers));
        for conn in &mut conns {
            for s in &scripts {
                s.prepare_invoke().load_async(conn).await?;
            }
        }
        let [release, extend, acquire_fenced, release_notice] =
            scripts.map(|s| s.get_hash().to_owned());
        Ok(Floor {
            quorum: conns.len() / 2 + 1,
            conns,
            release,
            extend,
            acquire_fenced,
            release_notice,
        })
    }

    /// A fresh 128-bit owner value, as the library makes them.
    pub(crate) fn new_value() -> String {
        format!("{:032x}", rand::random::<u128>())
    }

    /// `SET key value NX PX ttl` on every node; true once a quorum said OK.
    pub(crate) async fn acquire(&self, key: &str, value: &str, ttl_ms: u64) -> bool {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value).arg("NX").arg("PX").arg(ttl_ms);
        self.round(&cmd, |v| matches!(v, Value::Okay)).await
    }

    /// The acquire round with fencing: SET NX PX + INCR of `fence_key` in one script.
    pub(crate) async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        value: &str,
        ttl_ms: u64,
    ) -> bool {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.acquire_fenced)
            .arg(2)
            .arg(key)
            .arg(fence_key)
            .arg(value)
            .arg(ttl_ms);
        self.round(&cmd, |v| matches!(v, Value::Int(i) if *i > 0))
            .await
    }

    /// The acquire round with fencing, without Lua: `SET key value NX PX ttl GET` then `INCR
    /// fence_key`, pipelined on each node's connection (one write, two replies). A node says yes
    /// when the `SET` found the key free (nil: no old value) and the `INCR` answered. Unlike the
    /// script, the `INCR` also runs where the key is held (counters then grow on refusals too),
    /// and other clients' commands may run between the two. Needs Redis 7 (`NX` with `GET`).
    /// A prototype for issue 17: what the fenced acquire would cost in Redis without a script.
    pub(crate) async fn acquire_pipelined(
        &self,
        key: &str,
        fence_key: &str,
        value: &str,
        ttl_ms: u64,
    ) -> bool {
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .arg("GET")
            .cmd("INCR")
            .arg(fence_key);
        let pipe = &pipe;
        let pending: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                async move { c.send_packed_commands(pipe, 0, 2).await }
            })
            .collect();
        until_certain(
            pending,
            self.quorum,
            |reply| matches!(reply.as_deref(), Ok([Value::Nil, Value::Int(c)]) if *c > 0),
        )
        .await
    }

    /// Loads the floor's function library on every node (Redis 7).
    pub(crate) async fn load_functions(&self) -> redis::RedisResult<()> {
        for conn in &self.conns {
            let _: String = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(FUNCTIONS)
                .query_async(&mut conn.clone())
                .await?;
        }
        Ok(())
    }

    /// The release as `FCALL` of the same Lua ([`load_functions`](Self::load_functions) first).
    pub(crate) async fn release_fcall(&self, key: &str, value: &str) -> bool {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("floor_release").arg(1).arg(key).arg(value);
        self.round(&cmd, |v| matches!(v, Value::Int(1))).await
    }

    /// The library's own release, in its lean form (the lock key and its waiters count, no
    /// counter): a compare-and-delete that reads the waiters count in the same `MGET` and
    /// publishes a notice when someone waits; true once a quorum deleted. What the release
    /// notice costs the nodes, beside [`release`](Self::release).
    pub(crate) async fn release_notice(&self, key: &str, value: &str) -> bool {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.release_notice)
            .arg(2)
            .arg(key)
            .arg(format!("{key}:waiters:n"))
            .arg(value);
        self.round(&cmd, |v| matches!(v, Value::Int(1))).await
    }

    /// Conditional delete on every node; true once a quorum deleted.
    pub(crate) async fn release(&self, key: &str, value: &str) -> bool {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.release).arg(1).arg(key).arg(value);
        self.round(&cmd, |v| matches!(v, Value::Int(1))).await
    }

    /// Conditional `PEXPIRE` on every node; true once a quorum extended.
    pub(crate) async fn extend(&self, key: &str, value: &str, ttl_ms: u64) -> bool {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.extend).arg(1).arg(key).arg(value).arg(ttl_ms);
        self.round(&cmd, |v| matches!(v, Value::Int(1))).await
    }

    /// Sends `cmd` to every node at once; returns as soon as a quorum said yes (true) or can no
    /// longer say yes (false). Unanswered calls are dropped.
    async fn round(&self, cmd: &Cmd, yes: impl Fn(&Value) -> bool) -> bool {
        let pending: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                async move { c.send_packed_command(cmd).await }
            })
            .collect();
        until_certain(pending, self.quorum, |reply| reply.as_ref().is_ok_and(&yes)).await
    }
}

/// Reads the replies of one round's calls as they come; true as soon as `quorum` of them said
/// yes, false as soon as too few are left to. Unanswered calls are dropped.
pub(crate) async fn until_certain<F: Future>(
    mut pending: FuturesUnordered<F>,
    quorum: usize,
    yes: impl Fn(&F::Output) -> bool,
) -> bool {
    let n = pending.len();
    let (mut ok, mut answered) = (0, 0);
    while let Some(reply) = pending.next().await {
        answered += 1;
        if yes(&reply) {
            ok += 1;
        }
        if ok >= quorum {
            return true;
        }
        if ok + (n - answered) < quorum {
            return false;
        }
    }
    false
}
