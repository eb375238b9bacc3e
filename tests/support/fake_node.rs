//! A node that is not Redis: a TCP listener on a loopback port that answers every connection
//! with fixed bytes (garbage, an HTTP response, an SSH banner, a stray RESP frame), then reads
//! and discards whatever the client sends until it closes; and one that is connected to as a
//! Redis 7 and then answers the lock's commands with fixed bytes ([`ScriptedNode`]).
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Answers each connection with `reply` (then, with `repeat`, once per command received).
pub struct FakeNode {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl FakeNode {
    /// Starts listening on a free loopback port; every connection is sent `reply` at once.
    pub async fn start(reply: Vec<u8>) -> Self {
        Self::start_with(reply, false).await
    }

    /// As [`start`](Self::start); with `repeat`, `reply` is sent again after each read of the
    /// client's commands, once per command (a node that answers every command with the same
    /// bytes).
    pub async fn start_with(reply: Vec<u8>, repeat: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let reply = reply.clone();
                tokio::spawn(async move {
                    if socket.write_all(&reply).await.is_err() {
                        return;
                    }
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        if repeat {
                            let answers = reply.repeat(commands(&buf[..n]));
                            if socket.write_all(&answers).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        FakeNode { addr, task }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many commands (RESP arrays starting a line) `bytes` holds; at least one.
fn commands(bytes: &[u8]) -> usize {
    let starts = (0..bytes.len())
        .filter(|&i| bytes[i] == b'*' && (i == 0 || bytes[..i].ends_with(b"\r\n")))
        .count();
    starts.max(1)
}

/// What a node that is not Redis may answer, by name.
pub fn not_redis() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("garbage", vec![0xff, 0x00, 0xff, 0x00, b'\r', b'\n']),
        (
            "an HTTP server",
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\nContent-Length: 11\r\nConnection: close\r\n\r\n<html>\r\n</html>\r\n".to_vec(),
        ),
        ("an SSH server", b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n".to_vec()),
    ]
}

/// A node that speaks just enough Redis to be connected to (`CLIENT`, `INFO`, `SCRIPT`,
/// `CONFIG`, `PING`, `SELECT` get what a Redis 7 answers), and answers every other command
/// (the lock's scripts and commands) with `reply`; with `handshake` false, every command gets
/// `reply`. Replies go out one per command, in order, as Redis sends them.
pub struct ScriptedNode {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl ScriptedNode {
    /// `version` is the `redis_version` its `INFO` reports (6 runs the fenced acquire as a
    /// script, 7 pipelines it).
    pub async fn start(reply: Vec<u8>, handshake: bool, version: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let run_id = format!("{:040x}", addr.port());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let (reply, run_id) = (reply.clone(), run_id.clone());
                tokio::spawn(async move {
                    let mut pending = Vec::new();
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        pending.extend_from_slice(&buf[..n]);
                        let mut out = Vec::new();
                        while let Some((args, used)) = command(&pending) {
                            pending.drain(..used);
                            let name = args.first().map(|a| a.to_ascii_uppercase());
                            match name.as_deref() {
                                Some(n) if handshake => {
                                    let said = handshake_reply(n, &args, &run_id, version);
                                    out.extend(said.unwrap_or_else(|| reply.clone()));
                                }
                                _ => out.extend_from_slice(&reply),
                            }
                        }
                        if socket.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        ScriptedNode { addr, task }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for ScriptedNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a Redis server answers to the commands of a connect; `None` for any other command.
fn handshake_reply(name: &[u8], args: &[Vec<u8>], run_id: &str, version: &str) -> Option<Vec<u8>> {
    let bulk = |s: &str| format!("${}\r\n{s}\r\n", s.len()).into_bytes();
    Some(match name {
        b"CLIENT" | b"SELECT" => b"+OK\r\n".to_vec(),
        b"PING" => b"+PONG\r\n".to_vec(),
        b"INFO" => bulk(&format!(
            "# Server\r\nredis_version:{version}\r\nrun_id:{run_id}\r\nuptime_in_seconds:86400\r\n\
             # Persistence\r\naof_enabled:0\r\n"
        )),
        b"SCRIPT" => bulk(&"0".repeat(40)),
        b"CONFIG" => {
            let setting = args.get(2).map(|a| String::from_utf8_lossy(a).into_owned());
            let setting = setting.unwrap_or_default();
            let value = match setting.as_str() {
                "maxmemory" => "0",
                "maxmemory-policy" => "noeviction",
                _ => "everysec",
            };
            let mut out = b"*2\r\n".to_vec();
            out.extend(bulk(&setting));
            out.extend(bulk(value));
            out
        }
        _ => return None,
    })
}

/// One complete command (an array of bulk strings, as clients send) at the start of `bytes`,
/// and how many bytes it took.
fn command(bytes: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    fn line(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        Some((&bytes[at..at + end], at + end + 2))
    }
    let (head, mut at) = line(bytes, 0)?;
    let count: usize = std::str::from_utf8(head.strip_prefix(b"*")?)
        .ok()?
        .parse()
        .ok()?;
    let mut args = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let (len, next) = line(bytes, at)?;
        let len: usize = std::str::from_utf8(len.strip_prefix(b"$")?)
            .ok()?
            .parse()
            .ok()?;
        let arg = bytes.get(next..next + len)?.to_vec();
        at = next + len + 2;
        if bytes.len() < at {
            return None;
        }
        args.push(arg);
    }
    Some((args, at))
}
