//! Small network helpers of the testkit: a free port, a readiness `PING`, one-shot queries and
//! a bounded poll.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::{TestkitError, io};

/// Runs one command on the server at `127.0.0.1:port` (a short-lived connection, bounded by
/// one second to connect and to answer).
pub(super) fn query<T: redis::FromRedisValue>(
    port: u16,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    cmd.query(&mut conn)
}

/// Polls `check` every 20 ms until it returns `Ok`, for at most `timeout`; the error holds the
/// last thing `check` reported.
pub(super) fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, TestkitError> {
    let start = Instant::now();
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(last) if start.elapsed() > timeout => {
                return Err(TestkitError::Timeout {
                    what: what.to_owned(),
                    timeout,
                    last,
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

pub(super) fn free_port() -> Result<u16, TestkitError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io("bind a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io("read the bound port"))?
        .port();
    Ok(port)
}

pub(super) fn ping(addr: SocketAddr, auth: Option<(&str, &str)>) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if let Some((user, password)) = auth {
        let auth = match user {
            "" => format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{password}\r\n", password.len()),
            _ => format!(
                "*3\r\n$4\r\nAUTH\r\n${}\r\n{user}\r\n${}\r\n{password}\r\n",
                user.len(),
                password.len()
            ),
        };
        let mut ok = [0u8; 5];
        if stream.write_all(auth.as_bytes()).is_err()
            || stream.read_exact(&mut ok).is_err()
            || &ok != b"+OK\r\n"
        {
            return false;
        }
    }
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
