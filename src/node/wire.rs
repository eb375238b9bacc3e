//! A node's multiplexed connection, written for the lock's traffic: many tasks' commands
//! appended to one output buffer and written together, their replies read back in order by
//! one driver task and handed to each caller.
//!
//! Rules it keeps:
//! - A command's bytes and its place in the reply queue are taken under one lock, so replies
//!   are matched to callers in the order the bytes were written.
//! - Once appended, a command is written, even if its caller is gone: its reply is read and
//!   dropped. A caller that drops its future only stops waiting.
//! - When the socket fails or ends, or the driver is dropped, every waiting caller gets an I/O
//!   error; bytes that are not RESP give them a parse error. Every later caller gets a dropped
//!   connection's error, so that the owner replaces the connection whatever ended it.
//! - Replies are parsed in place (`resp.rs`). RESP3 push frames are not replies and are
//!   skipped, as is a reply that comes while no command waits for one.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use redis::{RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::resp::parse;

/// The read buffer's starting size; it grows to hold one reply larger than this.
const READ_CHUNK: usize = 16 * 1024;

/// A handle to one connection; clones share it.
#[derive(Clone)]
pub(crate) struct Wire {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Bytes not yet taken by the driver.
    out: Vec<u8>,
    /// One entry per command written or to be written, in order.
    waiting: VecDeque<Waiting>,
    /// The driver's waker while it has nothing to write.
    driver: Option<Waker>,
    /// Why the connection ended, once it has.
    ended: Option<Ended>,
}

/// A caller waiting for `replies` replies.
struct Waiting {
    replies: usize,
    got: Vec<Value>,
    tx: oneshot::Sender<RedisResult<Reply>>,
}

/// What a command (one reply) or a pipeline (several) got back.
pub(crate) enum Reply {
    One(Value),
    Many(Vec<Value>),
}

fn locked(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug)]
enum Ended {
    /// The socket failed or closed (or the driver was dropped).
    Io(io::ErrorKind),
    /// The server sent bytes that are not RESP.
    NotResp,
}

impl Ended {
    fn error(self) -> RedisError {
        match self {
            Ended::Io(kind) => io::Error::new(kind, "the connection to the server ended").into(),
            Ended::NotResp => (
                redis::ErrorKind::Parse,
                "the server's reply is not RESP (not a Redis server?)",
            )
                .into(),
        }
    }
}

impl Wire {
    /// A connection over `stream`, and its driver: a future that writes and reads until the
    /// stream fails or ends (spawn it; dropping it ends the connection).
    pub(crate) fn new<S>(stream: S) -> (Wire, impl Future<Output = ()> + Send + 'static)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
        });
        let driver = Driver {
            stream,
            shared: Arc::clone(&shared),
            wbuf: Vec::new(),
            written: 0,
            rbuf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
        };
        (Wire { shared }, driver)
    }

    /// Sends `packed` (one or more commands, already in RESP) and waits for `replies` replies.
    pub(crate) async fn send(&self, packed: &[u8], replies: usize) -> RedisResult<Reply> {
        let rx = self.queue(packed, replies)?;
        rx.await
            .unwrap_or_else(|_| Err(Ended::Io(io::ErrorKind::ConnectionAborted).error()))
    }

    /// One command; its reply.
    pub(crate) async fn one(&self, packed: &[u8]) -> RedisResult<Value> {
        match self.send(packed, 1).await? {
            Reply::One(v) => Ok(v),
            Reply::Many(mut v) => Ok(v.pop().unwrap_or(Value::Nil)),
        }
    }

    /// `replies` commands; their replies.
    pub(crate) async fn many(&self, packed: &[u8], replies: usize) -> RedisResult<Vec<Value>> {
        match self.send(packed, replies).await? {
            Reply::One(v) => Ok(vec![v]),
            Reply::Many(v) => Ok(v),
        }
    }

    fn queue(
        &self,
        packed: &[u8],
        replies: usize,
    ) -> RedisResult<oneshot::Receiver<RedisResult<Reply>>> {
        let (tx, rx) = oneshot::channel();
        let driver = {
            let mut state = locked(&self.shared.state);
            // Whatever ended it, a later call finds the connection gone (its owner replaces a
            // dropped connection); the cause went to the calls that were waiting.
            if state.ended.is_some() {
                return Err(Ended::Io(io::ErrorKind::NotConnected).error());
            }
            state.out.extend_from_slice(packed);
            state.waiting.push_back(Waiting {
                replies: replies.max(1),
                got: Vec::new(),
                tx,
            });
            state.driver.take()
        };
        if let Some(waker) = driver {
            waker.wake();
        }
        Ok(rx)
    }
}

/// Writes what callers queue, reads replies and hands them out.
struct Driver<S> {
    stream: S,
    shared: Arc<Shared>,
    /// The bytes being written, and how many of them are.
    wbuf: Vec<u8>,
    written: usize,
    /// Read bytes: `start..end` not yet parsed.
    rbuf: Vec<u8>,
    start: usize,
    end: usize,
}

impl<S> Drop for Driver<S> {
    fn drop(&mut self) {
        end(&self.shared, Ended::Io(io::ErrorKind::ConnectionAborted));
    }
}

/// Ends the connection: every waiting caller and every later one is told why.
fn end(shared: &Shared, why: Ended) {
    let (why, waiting) = {
        let mut state = locked(&shared.state);
        let why = *state.ended.get_or_insert(why);
        state.out = Vec::new();
        (why, std::mem::take(&mut state.waiting))
    };
    for w in waiting {
        let _ = w.tx.send(Err(why.error()));
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Future for Driver<S> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        loop {
            let wrote = match this.poll_write(cx) {
                Ok(w) => w,
                Err(kind) => return this.finish(kind),
            };
            let read = match this.poll_read(cx) {
                Ok(r) => r,
                Err(kind) => return this.finish(kind),
            };
            if !wrote && !read {
                return Poll::Pending;
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Driver<S> {
    fn finish(&mut self, why: Ended) -> Poll<()> {
        end(&self.shared, why);
        Poll::Ready(())
    }

    /// Writes what is queued; whether anything was written.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Result<bool, Ended> {
        if self.written == self.wbuf.len() {
            self.wbuf.clear();
            self.written = 0;
            let mut state = locked(&self.shared.state);
            if state.out.is_empty() {
                state.driver = Some(cx.waker().clone());
                return Ok(false);
            }
            std::mem::swap(&mut state.out, &mut self.wbuf);
        }
        let mut wrote = false;
        while self.written < self.wbuf.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.wbuf[self.written..]) {
                Poll::Ready(Ok(0)) => return Err(Ended::Io(io::ErrorKind::WriteZero)),
                Poll::Ready(Ok(n)) => {
                    self.written += n;
                    wrote = true;
                }
                Poll::Ready(Err(e)) => return Err(Ended::Io(e.kind())),
                Poll::Pending => break,
            }
        }
        Ok(wrote)
    }

    /// Reads what the server sent and hands out every whole reply; whether anything was read.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Result<bool, Ended> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
            // A buffer grown for one large reply goes back to its usual size once read.
            if self.rbuf.len() > 4 * READ_CHUNK {
                self.rbuf = vec![0; READ_CHUNK];
            }
        } else if self.end == self.rbuf.len() {
            if self.start > 0 {
                self.rbuf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
            } else {
                self.rbuf.resize(self.rbuf.len() * 2, 0);
            }
        }
        let mut buf = ReadBuf::new(&mut self.rbuf[self.end..]);
        match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len();
                if n == 0 {
                    return Err(Ended::Io(io::ErrorKind::UnexpectedEof));
                }
                self.end += n;
                self.hand_out()?;
                Ok(true)
            }
            Poll::Ready(Err(e)) => Err(Ended::Io(e.kind())),
            Poll::Pending => Ok(false),
        }
    }

    /// Parses every whole reply in the buffer and gives each to its caller.
    fn hand_out(&mut self) -> Result<(), Ended> {
        let mut done = Vec::new();
        {
            let mut state = locked(&self.shared.state);
            while self.start < self.end {
                let Some((value, used)) =
                    parse(&self.rbuf[self.start..self.end]).map_err(|_| Ended::NotResp)?
                else {
                    break;
                };
                self.start += used;
                if matches!(value, Value::Push { .. }) {
                    continue;
                }
                // A reply while nothing waits (a server that speaks first) answers nothing.
                let Some(front) = state.waiting.front_mut() else {
                    continue;
                };
                let reply = if front.replies == 1 {
                    Reply::One(value)
                } else {
                    front.got.push(value);
                    if front.got.len() < front.replies {
                        continue;
                    }
                    Reply::Many(std::mem::take(&mut front.got))
                };
                if let Some(w) = state.waiting.pop_front() {
                    done.push((w.tx, Ok(reply)));
                }
            }
        }
        for (tx, reply) in done {
            let _ = tx.send(reply);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection over an in-memory pipe, its driver spawned, and the server's end.
    fn connected() -> (Wire, tokio::io::DuplexStream) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (wire, driver) = Wire::new(client);
        tokio::spawn(driver);
        (wire, server)
    }

    async fn read_exactly(server: &mut tokio::io::DuplexStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        server.read_exact(&mut buf).await.unwrap();
        buf
    }

    #[tokio::test]
    async fn replies_reach_their_callers_in_order_even_past_a_caller_that_left() {
        let (wire, mut server) = connected();
        let first = tokio::spawn({
            let wire = wire.clone();
            async move { wire.one(b"*1\r\n$1\r\na\r\n").await }
        });
        tokio::task::yield_now().await;
        // A caller that gives up after its command was queued: its reply is read and dropped.
        let left = wire.one(b"*1\r\n$1\r\nb\r\n");
        drop(tokio::time::timeout(Duration::from_millis(1), left).await);
        let third = tokio::spawn({
            let wire = wire.clone();
            async move { wire.many(b"*1\r\n$1\r\nc\r\n*1\r\n$1\r\nd\r\n", 2).await }
        });
        let sent = read_exactly(&mut server, 44).await;
        assert_eq!(
            sent,
            b"*1\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n*1\r\n$1\r\nc\r\n*1\r\n$1\r\nd\r\n"
        );
        // Replies split across writes, the last one cut mid-frame.
        server.write_all(b":1\r\n:2\r\n$1\r").await.unwrap();
        server.write_all(b"\nx\r\n_\r\n").await.unwrap();
        assert_eq!(first.await.unwrap().unwrap(), Value::Int(1));
        let third = third.await.unwrap().unwrap();
        assert_eq!(third, vec![Value::BulkString(b"x".to_vec()), Value::Nil]);
    }

    #[tokio::test]
    async fn a_reply_larger_than_the_read_buffer_arrives_whole() {
        let (wire, mut server) = connected();
        let big = vec![b'x'; 5 * READ_CHUNK + 3];
        let waiting = tokio::spawn({
            let wire = wire.clone();
            async move {
                wire.many(b"*1\r\n$3\r\nGET\r\n*1\r\n$4\r\nPING\r\n", 2)
                    .await
            }
        });
        read_exactly(&mut server, 26).await;
        let mut reply = format!("${}\r\n", big.len()).into_bytes();
        reply.extend_from_slice(&big);
        reply.extend_from_slice(b"\r\n+PONG\r\n");
        for piece in reply.chunks(7_000) {
            server.write_all(piece).await.unwrap();
        }
        let replies = waiting.await.unwrap().unwrap();
        assert_eq!(replies[0], Value::BulkString(big));
        assert_eq!(replies[1], Value::SimpleString("PONG".to_owned()));
        // The connection goes on after it.
        let next = tokio::spawn(async move { wire.one(b"*1\r\n$4\r\nPING\r\n").await });
        read_exactly(&mut server, 14).await;
        server.write_all(b":5\r\n").await.unwrap();
        assert_eq!(next.await.unwrap().unwrap(), Value::Int(5));
    }

    #[tokio::test]
    async fn a_closed_stream_fails_every_waiting_and_later_call() {
        let (wire, server) = connected();
        let waiting = tokio::spawn({
            let wire = wire.clone();
            async move { wire.one(b"*1\r\n$4\r\nPING\r\n").await }
        });
        tokio::task::yield_now().await;
        drop(server);
        let e = waiting.await.unwrap().unwrap_err();
        assert!(e.is_connection_dropped(), "{e}");
        let e = wire.one(b"*1\r\n$4\r\nPING\r\n").await.unwrap_err();
        assert!(e.is_connection_dropped(), "{e}");
    }

    #[tokio::test]
    async fn bytes_that_are_not_resp_end_the_connection_as_a_parse_error() {
        let (wire, mut server) = connected();
        let waiting = tokio::spawn({
            let wire = wire.clone();
            async move { wire.one(b"*1\r\n$4\r\nPING\r\n").await }
        });
        // The call is on the wire before the server's bytes come.
        read_exactly(&mut server, 14).await;
        server.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await.unwrap();
        let e = waiting.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), redis::ErrorKind::Parse, "{e}");
        let later = wire.one(b"*1\r\n$4\r\nPING\r\n").await.unwrap_err();
        assert!(later.is_connection_dropped(), "{later}");
    }
}
