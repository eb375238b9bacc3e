//! A fault-injecting TCP proxy for tests: put one in front of a Redis node and the link between a
//! client and that node can be slowed down, cut, or reset while both ends keep running.
//!
//! - **latency**: every chunk of bytes is held for a fixed delay (each direction), order kept;
//! - **blackhole**: bytes stop flowing both ways; connections stay open and new ones are accepted
//!   by the kernel but carry nothing. On heal, what was held is delivered (TCP would retransmit);
//! - **reset**: every open connection is closed with a TCP RST, on both sides (one-shot);
//! - **partition per client**: a [`ProxyNet`] gives each client its own proxy to each node, so
//!   different clients can see different sets of nodes.
//!
//! All on 127.0.0.1, on tokio. Dropping a proxy stops it and closes its connections.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// How long the proxy waits for its upstream to accept a connection.
const UPSTREAM_CONNECT: Duration = Duration::from_secs(1);

/// The faults a link can have at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Added to every chunk, each direction.
    pub latency: Duration,
    /// Bytes stop flowing (connections stay open).
    pub blackhole: bool,
}

#[derive(Debug)]
struct Shared {
    /// Where new connections go (see [`Proxy::retarget`]).
    upstream: Mutex<SocketAddr>,
    faults: watch::Sender<Faults>,
    /// Cancelled (and replaced) by a reset: every connection opened before dies with an RST.
    resets: Mutex<CancellationToken>,
    /// Cancelled when the proxy is dropped.
    closed: CancellationToken,
    open: AtomicUsize,
    accepted: AtomicUsize,
}

/// One proxy: listens on a free loopback port and forwards to `upstream`.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _accept: AbortOnDropHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free port of 127.0.0.1.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub async fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (faults, _) = watch::channel(Faults::default());
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            faults,
            resets: Mutex::new(CancellationToken::new()),
            closed: CancellationToken::new(),
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Proxy {
            addr,
            shared,
            _accept: AbortOnDropHandle::new(task),
        })
    }

    /// Starts a proxy in front of a `redis://host:port` URL.
    ///
    /// # Errors
    ///
    /// When the URL has no socket address or no port can be bound.
    pub async fn for_url(url: &str) -> io::Result<Proxy> {
        Proxy::start(socket_addr(url)?).await
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The proxy's own address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The faults now in force.
    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// Replaces the faults in force.
    pub fn set(&self, faults: Faults) {
        self.shared.faults.send_replace(faults);
    }

    /// Sets the added latency (each direction).
    pub fn set_latency(&self, latency: Duration) {
        self.shared.faults.send_modify(|f| f.latency = latency);
    }

    /// Starts or stops the blackhole.
    pub fn set_blackhole(&self, on: bool) {
        self.shared.faults.send_modify(|f| f.blackhole = on);
    }

    /// Removes every fault (held bytes then flow).
    pub fn heal(&self) {
        self.set(Faults::default());
    }

    /// Closes every open connection with an RST on both sides. New connections work as before.
    pub fn reset(&self) {
        let mut resets = self.shared.resets.lock().unwrap_or_else(|e| e.into_inner());
        resets.cancel();
        *resets = CancellationToken::new();
    }

    /// Sends new connections to `upstream` and resets every open one, as an address moved to
    /// another server does (a virtual IP taken over, a DNS name repointed).
    pub fn retarget(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = upstream;
        self.reset();
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.closed.cancel();
    }
}

/// The socket address of a `redis://host:port[/db]` URL.
///
/// # Errors
///
/// When the URL has no `host:port` that resolves.
pub fn socket_addr(url: &str) -> io::Result<SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = hostport.rsplit_once('@').map_or(hostport, |(_, h)| h);
    std::net::ToSocketAddrs::to_socket_addrs(hostport)?
        .next()
        .ok_or_else(|| io::Error::other(format!("no address in {url}")))
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.closed.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let reset = shared
            .resets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .child_token();
        tokio::spawn(serve(client, Arc::clone(&shared), reset));
    }
}

/// One proxied connection: connects upstream, then pumps both ways until either side closes,
/// the link is reset, or the proxy is dropped.
async fn serve(client: TcpStream, shared: Arc<Shared>, reset: CancellationToken) {
    let target = *shared.upstream.lock().unwrap_or_else(|e| e.into_inner());
    let upstream = tokio::select! {
        _ = reset.cancelled() => None,
        _ = shared.closed.cancelled() => None,
        u = tokio::time::timeout(UPSTREAM_CONNECT, TcpStream::connect(target)) => u.ok().and_then(Result::ok),
    };
    let Some(upstream) = upstream else {
        // Like a closed port behind a firewall that rejects: the client sees a reset.
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    shared.open.fetch_add(1, Ordering::Relaxed);
    let done = CancellationToken::new();
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let up = pump(cr, uw, Arc::clone(&shared), reset.clone(), done.clone());
    let down = pump(ur, cw, Arc::clone(&shared), reset, done);
    tokio::join!(up, down);
    shared.open.fetch_sub(1, Ordering::Relaxed);
}

/// Copies `from` to `to` under the link's faults. Ends (and ends the other direction) on EOF,
/// error, reset or proxy drop; a reset closes the reading socket with an RST.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    reset: CancellationToken,
    done: CancellationToken,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut faults = shared.faults.subscribe();
    let writer = {
        let mut faults = shared.faults.subscribe();
        let (reset, done, closed) = (reset.clone(), done.clone(), shared.closed.clone());
        async move {
            loop {
                let item = tokio::select! {
                    _ = reset.cancelled() => break,
                    _ = done.cancelled() => break,
                    _ = closed.cancelled() => break,
                    item = rx.recv() => item,
                };
                let Some((due, bytes)) = item else {
                    let _ = to.shutdown().await;
                    break;
                };
                let delivered = async {
                    tokio::time::sleep_until(due).await;
                    flowing(&mut faults).await;
                    to.write_all(&bytes).await
                };
                let ok = tokio::select! {
                    _ = reset.cancelled() => false,
                    _ = done.cancelled() => false,
                    _ = closed.cancelled() => false,
                    r = delivered => r.is_ok(),
                };
                if !ok {
                    break;
                }
            }
            if reset.is_cancelled() {
                let _ = AsRef::<TcpStream>::as_ref(&to).set_zero_linger();
            }
            done.cancel();
        }
    };
    let reader = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let read = async {
                flowing(&mut faults).await;
                from.read(&mut buf).await
            };
            let n = tokio::select! {
                _ = reset.cancelled() => break,
                _ = done.cancelled() => break,
                _ = shared.closed.cancelled() => break,
                r = read => r,
            };
            match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = Instant::now() + faults.borrow().latency;
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        if reset.is_cancelled() {
            let _ = AsRef::<TcpStream>::as_ref(&from).set_zero_linger();
        }
        drop(tx);
    };
    tokio::join!(reader, writer);
}

/// Waits while the link is blackholed.
async fn flowing(faults: &mut watch::Receiver<Faults>) {
    let _ = faults.wait_for(|f| !f.blackhole).await;
}

/// One proxy per (client, node): client `c` reaches node `n` only through `link(c, n)`, so a
/// fault can hit one client's view of a node, every client's view of it, or any mix.
#[derive(Debug)]
pub struct ProxyNet {
    links: Vec<Vec<Proxy>>,
}

impl ProxyNet {
    /// Proxies for `clients` clients in front of each node URL.
    ///
    /// # Errors
    ///
    /// As [`Proxy::for_url`].
    pub async fn start(clients: usize, node_urls: &[String]) -> io::Result<ProxyNet> {
        let mut links = Vec::with_capacity(clients);
        for _ in 0..clients {
            let mut row = Vec::with_capacity(node_urls.len());
            for url in node_urls {
                row.push(Proxy::for_url(url).await?);
            }
            links.push(row);
        }
        Ok(ProxyNet { links })
    }

    /// How many clients.
    pub fn clients(&self) -> usize {
        self.links.len()
    }

    /// How many nodes.
    pub fn nodes(&self) -> usize {
        self.links.first().map_or(0, Vec::len)
    }

    /// The node URLs client `c` must use.
    pub fn urls(&self, c: usize) -> Vec<String> {
        self.links[c].iter().map(Proxy::url).collect()
    }

    /// The link from client `c` to node `n`.
    pub fn link(&self, c: usize, n: usize) -> &Proxy {
        &self.links[c][n]
    }

    /// Every client's link to node `n`.
    pub fn to_node(&self, n: usize) -> impl Iterator<Item = &Proxy> {
        self.links.iter().map(move |row| &row[n])
    }

    /// Client `c` sees only the nodes in `visible`; its links to the others are blackholed.
    pub fn partition(&self, c: usize, visible: &[usize]) {
        for (n, link) in self.links[c].iter().enumerate() {
            link.set_blackhole(!visible.contains(&n));
        }
    }

    /// Removes every fault on every link.
    pub fn heal(&self) {
        for link in self.links.iter().flatten() {
            link.heal();
        }
    }
}
