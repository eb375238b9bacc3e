//! The resource the lock protects, with its fencing check: in process ([`FenceGate`]) for
//! clients that are tasks of the test, or in a separate Redis ([`fenced_set`]) when a client
//! runs in another process. Each write is recorded with whether fencing let it through.

use std::sync::Arc;

use quorumlock::{FenceGate, FencedWrite, FencingToken, fenced_set};
use redis::aio::MultiplexedConnection;

use crate::history::{Mono, Recorder, SessionId, Write};

/// The data key written on the resource Redis.
pub const DATA_KEY: &str = "{chaos}:resource";

#[derive(Clone)]
pub enum Resource {
    Gate(Arc<FenceGate>),
    Redis(MultiplexedConnection),
}

impl Resource {
    pub fn gate() -> Resource {
        Resource::Gate(Arc::new(FenceGate::new()))
    }

    /// A resource kept in the Redis at `url` (never behind a proxy, never faulted).
    pub async fn redis(url: &str) -> Resource {
        let client = redis::Client::open(url).expect("resource url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the resource redis");
        Resource::Redis(conn)
    }

    /// Writes `session`'s value with its token and records the write. Returns whether fencing
    /// accepted it.
    pub async fn write(&self, rec: &Recorder, session: SessionId, token: u64) -> bool {
        let start = Mono::now();
        let accepted = match self {
            Resource::Gate(gate) => gate.admit(FencingToken::new(token)).is_ok(),
            Resource::Redis(conn) => {
                let mut conn = conn.clone();
                match fenced_set(&mut conn, DATA_KEY, FencingToken::new(token), session).await {
                    Ok(FencedWrite::Written) => true,
                    Ok(_) => false,
                    Err(e) => panic!("the resource redis failed (it is never faulted): {e}"),
                }
            }
        };
        rec.write(Write {
            session,
            token,
            start,
            end: Mono::now(),
            accepted,
        });
        accepted
    }
}
