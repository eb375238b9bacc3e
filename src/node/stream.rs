//! A node connection's own stream (plain TCP and Unix sockets): the socket connected here with
//! the client's TCP settings, carrying the crate's own connection (`wire.rs`), and watched for
//! what replies alone do not tell: whether bytes written to the server have gone unanswered,
//! since when, and whether an answer is already waiting in the kernel unread.
//!
//! That is the breaker's silence signal ([`Hearing::silent_for`]): a server is *silent* when
//! bytes were written to it a whole node timeout ago, nothing at all was read from it since,
//! and nothing is waiting unread in the kernel's receive buffer. Waiting bytes prove the server
//! spoke, however long this client's own tasks wait for their turn to read them, so a busy
//! runtime never makes a healthy server look silent. `rediss://` connections keep redis-rs's
//! own path (its TLS layer owns the socket) and have no such signal.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::io::tcp::socket2::{SockRef, Socket};
use redis::{ConnectionAddr, ConnectionInfo, RedisResult};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::link::{Single, handshake};
use super::wire::Wire;
use crate::core::lock;

/// What the watched stream of one connection has heard from its server.
#[derive(Debug)]
pub(crate) struct Hearing {
    /// The origin of `unanswered`.
    origin: Instant,
    /// When the first write since the last read was made, in nanoseconds after `origin` plus
    /// one; `0`: nothing written since the last read (every write answered, as far as bytes
    /// tell).
    unanswered: AtomicU64,
    /// The same socket (a duplicate descriptor), for a peek at what waits unread; `None` once
    /// the stream is dropped (the socket is then closed with it).
    socket: Mutex<Option<Socket>>,
}

impl Hearing {
    fn new(socket: Option<Socket>) -> Self {
        Hearing {
            origin: Instant::now(),
            unanswered: AtomicU64::new(0),
            socket: Mutex::new(socket),
        }
    }

    /// How long the server has been silent, when it has been for `window` or more: bytes
    /// written to it that long ago, nothing read from it since, and nothing waiting unread in
    /// the kernel. `None` otherwise (answering, idle, or its answer waits to be read).
    pub(crate) fn silent_for(&self, window: Duration) -> Option<Duration> {
        let since = self.unanswered.load(Ordering::Relaxed);
        if since == 0 {
            return None;
        }
        let waited = self
            .origin
            .elapsed()
            .saturating_sub(Duration::from_nanos(since - 1));
        (waited >= window && !self.waiting_unread()).then_some(waited)
    }

    /// Whether the kernel holds bytes from the server not yet read (or the end of the stream,
    /// or an error: the connection's reader learns of it, the server is not silent).
    fn waiting_unread(&self) -> bool {
        let socket = lock(&self.socket);
        let Some(socket) = socket.as_ref() else {
            return true;
        };
        let mut byte = [MaybeUninit::uninit()];
        // The descriptor shares the stream's non-blocking mode: no bytes is `WouldBlock`.
        !matches!(socket.peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn wrote(&self) {
        if self.unanswered.load(Ordering::Relaxed) == 0 {
            let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            self.unanswered.store(now + 1, Ordering::Relaxed);
        }
    }

    fn read(&self) {
        if self.unanswered.load(Ordering::Relaxed) != 0 {
            self.unanswered.store(0, Ordering::Relaxed);
        }
    }
}

/// A socket whose reads and writes are recorded in its [`Hearing`].
struct Watched<S> {
    inner: S,
    hearing: Arc<Hearing>,
}

impl<S> Drop for Watched<S> {
    fn drop(&mut self) {
        // The duplicate descriptor goes with the stream: it must not keep the socket open.
        lock(&self.hearing.socket).take();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.hearing.read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.hearing.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.hearing.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A watched connection: its [`Hearing`], and its driver task, which ends with this (the
/// connection's calls then fail as on a dropped connection).
#[derive(Debug)]
pub(crate) struct Watch {
    hearing: Arc<Hearing>,
    driver: tokio::task::AbortHandle,
}

impl Watch {
    /// See [`Hearing::silent_for`].
    pub(crate) fn silent_for(&self, window: Duration) -> Option<Duration> {
        self.hearing.silent_for(window)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Connects to `info`'s server (plain TCP with its TCP settings, or a Unix socket) and sets up
/// the crate's connection over the watched socket, with `info`'s handshake (`AUTH`, `HELLO`,
/// `SELECT` as the URL says). `None` for a `rediss://` address: the caller connects through
/// redis-rs.
pub(crate) async fn open_watched(info: &ConnectionInfo) -> Option<RedisResult<(Single, Watch)>> {
    Some(match info.addr() {
        ConnectionAddr::Tcp(host, port) => match connect_tcp(host, *port, info).await {
            Ok(stream) => multiplex(stream, info).await,
            Err(e) => Err(e.into()),
        },
        ConnectionAddr::Unix(path) => match tokio::net::UnixStream::connect(path).await {
            Ok(stream) => multiplex(stream, info).await,
            Err(e) => Err(e.into()),
        },
        _ => return None,
    })
}

/// The connection over `stream`, watched with a duplicate of its descriptor for the peek (none
/// if the system refuses one: the server then never counts as silent); its driver spawned.
async fn multiplex<S>(stream: S, info: &ConnectionInfo) -> RedisResult<(Single, Watch)>
where
    S: AsFd + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let socket = SockRef::from(&stream).try_clone().ok();
    let hearing = Arc::new(Hearing::new(socket));
    let stream = Watched {
        inner: stream,
        hearing: Arc::clone(&hearing),
    };
    let (wire, driver) = Wire::new(stream);
    let watch = Watch {
        hearing,
        driver: tokio::spawn(driver).abort_handle(),
    };
    handshake(&wire, info.redis_settings()).await?;
    Ok((Single::Wire(wire, info.redis_settings().db()), watch))
}

/// A TCP connection to `host:port` (each address the name resolves to, in order, until one
/// connects), with `info`'s TCP settings: no-delay, keepalive and the user timeout.
async fn connect_tcp(
    host: &str,
    port: u16,
    info: &ConnectionInfo,
) -> io::Result<tokio::net::TcpStream> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => {
                let settings = info.tcp_settings();
                stream.set_nodelay(settings.nodelay())?;
                let sock = SockRef::from(&stream);
                if let Some(keepalive) = settings.keepalive() {
                    sock.set_tcp_keepalive(keepalive)?;
                }
                #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
                sock.set_tcp_user_timeout(settings.user_timeout())?;
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("the host name resolved to no address")))
}
