//! The resource the lock protects, with its fencing check: in process ([`FenceGate`]) for
//! clients that are tasks of the test, or in a separate Redis ([`fenced_set`]) when a client
//! runs in another process. Each write is recorded with whether fencing let it through.

use std::sync::Arc;

use quorumlock::{FenceGate, FencedWrite, FencingToken, fenced_set};
use redis::aio::MultiplexedConnection;

use crate::history::{Mono, PendingWrite, Recorder, SessionId, Write};

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
        let conn = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            client.get_multiplexed_async_connection_with_config(&crate::support::direct_config()),
        )
        .await
        .expect("connect to the resource redis within 10 s")
        .expect("connect to the resource redis");
        Resource::Redis(conn)
    }

    /// Writes `session`'s value with its token and records the write. Returns whether fencing
    /// accepted it. The write is announced first ([`Recorder::write_started`]): one in flight when
    /// its process is killed is resolved from the resource's value, or stays "unfinished".
    pub async fn write(
        &self,
        rec: &Recorder,
        client: usize,
        session: SessionId,
        token: u64,
    ) -> bool {
        let start = Mono::now();
        rec.write_started(PendingWrite {
            session,
            client,
            token,
            start,
        });
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

/// The session whose value the resource Redis at `url` holds now (None when nothing was written
/// or it cannot be read within `within`).
pub async fn holder_of_value(url: &str, within: std::time::Duration) -> Option<SessionId> {
    tokio::time::timeout(within, async {
        let client = redis::Client::open(url).ok()?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&crate::support::direct_config())
            .await
            .ok()?;
        redis::cmd("GET")
            .arg(DATA_KEY)
            .query_async::<Option<SessionId>>(&mut conn)
            .await
            .ok()
            .flatten()
    })
    .await
    .ok()
    .flatten()
}
