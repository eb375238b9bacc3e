//! The fenced floor (`floor+pipefence`'s commands) over quorumlock's own connection layer
//! (`src/node/wire.rs`) instead of redis-rs's multiplexer: what the transport costs.
#![allow(dead_code)]

use futures::stream::FuturesUnordered;
use redis::Value;

use crate::floor::until_certain;
use crate::resp::pack;
use crate::wire::Wire;

const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

pub(crate) struct WireFloor {
    conns: Vec<Wire>,
    quorum: usize,
    release: String,
}

impl WireFloor {
    pub(crate) async fn connect(urls: &[String]) -> WireFloor {
        let mut conns = Vec::new();
        let mut release = String::new();
        for url in urls {
            let info: redis::ConnectionInfo = url.as_str().parse().expect("url");
            let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
                panic!("TCP only")
            };
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            let (wire, driver) = Wire::new(stream);
            tokio::spawn(driver);
            let mut out = Vec::new();
            pack(&mut out, &[b"SCRIPT", b"LOAD", RELEASE.as_bytes()]);
            match wire.one(&out).await.expect("script load") {
                Value::BulkString(sha) => release = String::from_utf8(sha).expect("sha"),
                other => panic!("SCRIPT LOAD: {other:?}"),
            }
            conns.push(wire);
        }
        WireFloor {
            quorum: conns.len() / 2 + 1,
            conns,
            release,
        }
    }

    pub(crate) async fn acquire_pipelined(
        &self,
        key: &str,
        fence_key: &str,
        value: &str,
        ttl_ms: u64,
    ) -> bool {
        let mut out = Vec::with_capacity(128);
        let ttl = ttl_ms.to_string();
        pack(
            &mut out,
            &[
                b"SET",
                key.as_bytes(),
                value.as_bytes(),
                b"NX",
                b"PX",
                ttl.as_bytes(),
                b"GET",
            ],
        );
        pack(&mut out, &[b"INCR", fence_key.as_bytes()]);
        let pending: FuturesUnordered<_> = self.conns.iter().map(|c| c.many(&out, 2)).collect();
        until_certain(
            pending,
            self.quorum,
            |reply| matches!(reply.as_deref(), Ok([Value::Nil, Value::Int(c)]) if *c > 0),
        )
        .await
    }

    pub(crate) async fn release(&self, key: &str, value: &str) -> bool {
        let mut out = Vec::with_capacity(128);
        pack(
            &mut out,
            &[
                b"EVALSHA",
                self.release.as_bytes(),
                b"1",
                key.as_bytes(),
                value.as_bytes(),
            ],
        );
        let pending: FuturesUnordered<_> = self.conns.iter().map(|c| c.one(&out)).collect();
        until_certain(pending, self.quorum, |reply| {
            matches!(reply, Ok(Value::Int(1)))
        })
        .await
    }
}
