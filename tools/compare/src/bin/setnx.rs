//! The minimal fresh-process lock that `redlock run` is measured against: `SET key value NX PX`
//! on every node at once, the command run as soon as a quorum said `OK`, then `DEL` where it
//! was set. No fencing, no retry, no check on release, no `CLIENT SETINFO`: the least a new
//! process must send to run a command under a Redlock.
//!
//!   setnx URL,URL,... KEY CMD [ARG...]
//!
//! Exits with CMD's code, 75 when the key is held, 69 when too few nodes answer.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::IntoConnectionInfo;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [nodes, key, cmd @ ..] = args.as_slice() else {
        eprintln!("usage: setnx URL,URL,... KEY CMD [ARG...]");
        return ExitCode::from(2);
    };
    if cmd.is_empty() {
        eprintln!("usage: setnx URL,URL,... KEY CMD [ARG...]");
        return ExitCode::from(2);
    }
    let urls: Vec<&str> = nodes.split(',').collect();
    let quorum = urls.len() / 2 + 1;
    let value = format!("{:032x}", rand::random::<u128>());
    let mut sets: FuturesUnordered<_> = urls
        .iter()
        .map(|url| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                let info = url.into_connection_info().ok()?;
                let quiet = info.redis_settings().clone().set_skip_set_lib_name();
                let client = redis::Client::open(info.set_redis_settings(quiet)).ok()?;
                let connect = client.get_multiplexed_async_connection();
                let mut conn = tokio::time::timeout(Duration::from_secs(1), connect)
                    .await
                    .ok()?
                    .ok()?;
                let set: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&value)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                set.map(|_| conn)
            }
        })
        .collect();
    let mut held = Vec::new();
    let mut answered = 0;
    while held.len() < quorum
        && let Some(conn) = sets.next().await
    {
        answered += 1;
        held.extend(conn);
        if answered - held.len() > urls.len() - quorum {
            break;
        }
    }
    if held.len() < quorum {
        return ExitCode::from(if answered == urls.len() { 75 } else { 69 });
    }
    let code = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .status()
        .ok()
        .and_then(|s| s.code())
        .unwrap_or(1);
    for mut conn in held {
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query_async(&mut conn).await;
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
