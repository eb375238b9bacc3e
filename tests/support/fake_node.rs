//! A node that is not Redis: a TCP listener on a loopback port that answers every connection
//! with fixed bytes (garbage, an HTTP response, an SSH banner, a stray RESP frame), then reads
//! and discards whatever the client sends until it closes.

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
