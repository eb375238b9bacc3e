//! The fault-injecting proxy does what it claims; otherwise a broken proxy would make every
//! network case pass without testing anything.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

use crate::proxy::{Proxy, ProxyNet};
use crate::support::cluster;

async fn connect(p: &Proxy) -> TcpStream {
    TcpStream::connect(p.addr())
        .await
        .expect("connect to the proxy")
}

/// One PING on `s`: Ok(true) for PONG, Ok(false) when the connection closed or failed, Err on
/// timeout.
async fn ping(s: &mut TcpStream, within: Duration) -> Result<bool, tokio::time::error::Elapsed> {
    timeout(within, async {
        if s.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).await.is_ok() && &buf == b"+PONG\r\n"
    })
    .await
}

/// A reply a healthy link gives within this much, even on a loaded 2-core box.
const PROMPT: Duration = Duration::from_secs(2);
/// How long a ping through a cut link is given to (wrongly) get through.
const SILENCE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn latency_delays_every_reply_until_healed() {
    let c = cluster(1);
    let p = Proxy::for_url(&c.urls()[0]).await.unwrap();
    let mut s = connect(&p).await;
    assert_eq!(ping(&mut s, Duration::from_secs(10)).await, Ok(true));
    // Each way more than the healed bound: a heal that did not remove the latency fails below.
    let delay = PROMPT + Duration::from_millis(500);
    p.set_latency(delay);
    let t = Instant::now();
    assert_eq!(ping(&mut s, Duration::from_secs(20)).await, Ok(true));
    assert!(
        t.elapsed() >= delay * 2,
        "{delay:?} each way: {:?}",
        t.elapsed()
    );
    p.heal();
    let t = Instant::now();
    assert_eq!(ping(&mut s, Duration::from_secs(10)).await, Ok(true));
    assert!(t.elapsed() < PROMPT, "healed: {:?}", t.elapsed());
}

#[tokio::test]
async fn blackhole_stalls_without_closing_and_delivers_on_heal() {
    let c = cluster(1);
    let p = Proxy::for_url(&c.urls()[0]).await.unwrap();
    let mut s = connect(&p).await;
    assert_eq!(ping(&mut s, Duration::from_secs(5)).await, Ok(true));
    p.set_blackhole(true);
    assert!(
        ping(&mut s, SILENCE).await.is_err(),
        "no reply through a blackhole"
    );
    assert_eq!(p.open_connections(), 1, "the connection stays open");
    // A new connection is accepted but carries nothing either.
    let mut fresh = connect(&p).await;
    assert!(ping(&mut fresh, SILENCE).await.is_err());
    p.heal();
    // What was held flows: the reply to the PING that timed out arrives now.
    let mut buf = [0u8; 7];
    timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"+PONG\r\n", "the stalled PING is delivered on heal");
    assert_eq!(ping(&mut s, Duration::from_secs(5)).await, Ok(true));
}

#[tokio::test]
async fn reset_closes_every_connection_and_new_ones_work() {
    let c = cluster(1);
    let p = Proxy::for_url(&c.urls()[0]).await.unwrap();
    let mut a = connect(&p).await;
    let mut b = connect(&p).await;
    assert_eq!(ping(&mut a, Duration::from_secs(5)).await, Ok(true));
    assert_eq!(ping(&mut b, Duration::from_secs(5)).await, Ok(true));
    p.reset();
    assert_eq!(ping(&mut a, Duration::from_secs(5)).await, Ok(false));
    assert_eq!(ping(&mut b, Duration::from_secs(5)).await, Ok(false));
    crate::support::wait_until(crate::support::WAIT, "connections closed", || async {
        p.open_connections() == 0
    })
    .await;
    let mut fresh = connect(&p).await;
    assert_eq!(ping(&mut fresh, Duration::from_secs(5)).await, Ok(true));
}

#[tokio::test]
async fn a_partition_gives_each_client_its_own_view() {
    let c = cluster(3);
    let net = ProxyNet::start(2, &c.urls()).await.unwrap();
    net.partition(0, &[0, 1]);
    net.partition(1, &[1, 2]);
    // A reachable node answers within PROMPT; a cut one stays silent for SILENCE.
    let answers = |client: usize, node: usize, within: Duration| {
        let p = net.link(client, node);
        async move {
            let mut s = connect(p).await;
            ping(&mut s, within).await == Ok(true)
        }
    };
    let reaches = |c, n| answers(c, n, PROMPT);
    let cut = |c, n| async move { !answers(c, n, SILENCE).await };
    assert!(reaches(0, 0).await && reaches(0, 1).await && cut(0, 2).await);
    assert!(cut(1, 0).await && reaches(1, 1).await && reaches(1, 2).await);
    net.heal();
    assert!(reaches(0, 2).await && reaches(1, 0).await);
}
