//! The implementations under comparison behind one enum: one acquisition attempt, release and
//! extend, each with its tightest settings.

use std::sync::Arc;
use std::time::Duration;

use quorumlock::{Lock, Redlock};

use crate::floor::Floor;

pub(crate) const TTL: Duration = Duration::from_secs(10);
pub(crate) const TTL_MS: u64 = 10_000;
/// How long a waiting acquisition waits at most.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// One implementation, connected to the same nodes as the others.
pub(crate) enum Client {
    /// quorumlock, defaults (50 ms per-node timeout), one round per attempt (`try_acquire`).
    Ours(Redlock),
    /// The hand-written round: plain SET NX PX.
    Floor(Floor),
    /// The hand-written round with quorumlock's acquire script (SET NX PX + INCR of the
    /// fencing counter): what fencing costs in Redis and on the wire.
    FloorFenced(Floor),
    /// The hand-written round with a fenced acquire without Lua: `SET NX PX GET` and `INCR`
    /// pipelined on each node's connection.
    FloorPipeFenced(Floor),
    /// `FloorPipeFenced`, released by the library's own release script (its lean form: the
    /// waiters check and the notice): what the release notice costs, written by hand.
    FloorPipeFencedNotice(Floor),
    /// `rslock` (async, redis 1.x multiplexed connections; no per-node timeout of its own, so
    /// redis' default 500 ms response timeout applies), one round per attempt.
    Rslock(rslock::LockManager),
    /// `redlock` (blocking, redis 0.23; a new TCP connection per node and command, nodes asked
    /// one after the other, no timeouts), one round per attempt.
    Redlock(Arc<redlock::RedLock>),
    /// node-redlock 5 on ioredis 5, in a Node.js child process (`tools/compare/node`), one
    /// attempt per call (`retryCount: 0`): whole workloads are sent to it (see `workload.rs`).
    Node(crate::node::NodeDriver),
}

/// A held lock of any implementation.
pub(crate) enum Held {
    Ours(Lock),
    Floor { key: String, value: String },
    Rslock(rslock::Lock),
    Redlock { resource: Vec<u8>, val: Vec<u8> },
}

/// Why an attempt did not get the lock.
#[derive(Debug)]
pub(crate) enum Fail {
    /// Held by someone else (or the round was refused).
    Busy,
    /// An error the implementation reported.
    Error(String),
}

impl Client {
    /// Connects (or prepares) every implementation in `names` on `urls`.
    pub(crate) async fn connect(name: &str, urls: &[String]) -> Client {
        match name {
            "quorumlock" => Client::Ours(Redlock::builder(urls).build().expect("valid config")),
            // The client with an I/O thread of its own (opt-in).
            "quorumlock-io" => Client::Ours(
                Redlock::builder(urls)
                    .io_thread(quorumlock::IoThread::Always)
                    .build()
                    .expect("valid config"),
            ),
            "quorumlock-nofence" => Client::Ours(
                Redlock::builder(urls)
                    .fencing(false)
                    .build()
                    .expect("valid config"),
            ),
            "floor" => Client::Floor(Floor::connect(urls).await.expect("floor connects")),
            "floor-1task" => {
                Client::Floor(Floor::connect_one_task(urls).await.expect("floor connects"))
            }
            "floor+fence" => {
                Client::FloorFenced(Floor::connect(urls).await.expect("floor connects"))
            }
            "floor+pipefence" => {
                Client::FloorPipeFenced(Floor::connect(urls).await.expect("floor connects"))
            }
            "floor+pipefence+notice" => {
                Client::FloorPipeFencedNotice(Floor::connect(urls).await.expect("floor connects"))
            }
            "rslock" => {
                let mut m = rslock::LockManager::new(urls.to_vec());
                // One attempt per call (its loop runs `retry_count` rounds in total).
                m.set_retry(1, Duration::from_millis(1));
                Client::Rslock(m)
            }
            "redlock" => {
                let mut r = redlock::RedLock::new(urls.to_vec());
                // One round per call; a delay of 1 makes its random pause `0..1` ms, i.e. none.
                r.set_retry(1, 1);
                Client::Redlock(Arc::new(r))
            }
            "node-redlock" => Client::Node(crate::node::NodeDriver::start(urls)),
            other => panic!("unknown implementation {other}"),
        }
    }

    /// Whether its calls block the thread (run on OS threads, not tokio tasks).
    pub(crate) fn blocking(&self) -> bool {
        matches!(self, Client::Redlock(_))
    }

    /// The node-redlock driver, whose workloads run in its own process.
    pub(crate) fn node(&self) -> Option<&crate::node::NodeDriver> {
        match self {
            Client::Node(n) => Some(n),
            _ => None,
        }
    }

    /// Whether it can extend a held lock.
    pub(crate) fn can_extend(&self) -> bool {
        !matches!(
            self,
            Client::Redlock(_)
                | Client::FloorFenced(_)
                | Client::FloorPipeFenced(_)
                | Client::FloorPipeFencedNotice(_)
        )
    }

    /// Waits for `key` (quorumlock: `acquire_timeout`, woken by release notices, up to
    /// [`WAIT`]); the others make one attempt, as [`acquire`](Self::acquire) (they poll).
    pub(crate) async fn acquire_waiting(&self, key: &str) -> Result<Held, Fail> {
        match self {
            Client::Ours(locks) => match locks.acquire_timeout(key, TTL, WAIT).await {
                Ok(lock) => Ok(Held::Ours(lock)),
                Err(e) if e.is_held() => Err(Fail::Busy),
                Err(e) => Err(Fail::Error(e.to_string())),
            },
            _ => self.acquire(key).await,
        }
    }

    /// One acquisition attempt (a single round, no retry) on `key` for [`TTL`].
    pub(crate) async fn acquire(&self, key: &str) -> Result<Held, Fail> {
        match self {
            Client::Ours(locks) => match locks.try_acquire(key, TTL).await {
                Ok(lock) => Ok(Held::Ours(lock)),
                Err(e) if e.is_held() => Err(Fail::Busy),
                Err(e) => Err(Fail::Error(e.to_string())),
            },
            Client::Floor(f) => {
                let value = Floor::new_value();
                if f.acquire(key, &value, TTL_MS).await {
                    Ok(Held::Floor {
                        key: key.to_owned(),
                        value,
                    })
                } else {
                    f.release(key, &value).await;
                    Err(Fail::Busy)
                }
            }
            Client::FloorFenced(f)
            | Client::FloorPipeFenced(f)
            | Client::FloorPipeFencedNotice(f) => {
                // The same key layout as quorumlock's.
                let (lock_key, fence_key) = crate::floor::fenced_keys(key);
                let value = Floor::new_value();
                let won = if !matches!(self, Client::FloorFenced(_)) {
                    f.acquire_pipelined(&lock_key, &fence_key, &value, TTL_MS)
                        .await
                } else {
                    f.acquire_fenced(&lock_key, &fence_key, &value, TTL_MS)
                        .await
                };
                if won {
                    Ok(Held::Floor {
                        key: lock_key,
                        value,
                    })
                } else {
                    f.release(&lock_key, &value).await;
                    Err(Fail::Busy)
                }
            }
            Client::Rslock(m) => match m.lock(key.as_bytes(), TTL).await {
                Ok(lock) => Ok(Held::Rslock(lock)),
                Err(rslock::LockError::Unavailable) => Err(Fail::Busy),
                Err(e) => Err(Fail::Error(e.to_string())),
            },
            Client::Node(_) => Err(Fail::Error("node-redlock runs whole workloads".to_owned())),
            Client::Redlock(r) => match r.lock(key.as_bytes(), TTL_MS as usize) {
                Ok(Some(lock)) => Ok(Held::Redlock {
                    resource: lock.resource,
                    val: lock.val,
                }),
                Ok(None) => Err(Fail::Busy),
                Err(e) => Err(Fail::Error(e.to_string())),
            },
        }
    }

    /// Releases a held lock; false when the implementation reported a failure.
    pub(crate) async fn release(&self, held: Held) -> bool {
        match (self, held) {
            (Client::Ours(_), Held::Ours(lock)) => lock.release().await.is_ok(),
            (Client::FloorPipeFencedNotice(f), Held::Floor { key, value }) => {
                f.release_notice(&key, &value).await
            }
            (
                Client::Floor(f) | Client::FloorFenced(f) | Client::FloorPipeFenced(f),
                Held::Floor { key, value },
            ) => f.release(&key, &value).await,
            (Client::Rslock(m), Held::Rslock(lock)) => {
                m.unlock(&lock).await; // best effort, no result
                true
            }
            (Client::Redlock(r), Held::Redlock { resource, val }) => {
                r.unlock(&redlock::Lock {
                    resource,
                    val,
                    validity_time: 0,
                    lock_manager: r,
                });
                true
            }
            _ => unreachable!("a lock is released by the client that took it"),
        }
    }

    /// Leaves a held lock to expire (no release traffic).
    pub(crate) fn forget(held: Held) {
        if let Held::Ours(lock) = held {
            lock.forget();
        }
    }

    /// Extends a held lock to [`TTL`]; false on failure.
    pub(crate) async fn extend(&self, held: &mut Held) -> bool {
        match (self, held) {
            (Client::Ours(_), Held::Ours(lock)) => lock.extend(TTL).await.is_ok(),
            (Client::Floor(f), Held::Floor { key, value }) => f.extend(key, value, TTL_MS).await,
            (Client::Rslock(m), Held::Rslock(lock)) => match m.extend(lock, TTL).await {
                Ok(extended) => {
                    *lock = extended;
                    true
                }
                Err(_) => false,
            },
            _ => false,
        }
    }
}
