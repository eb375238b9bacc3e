//! The one self-healing pub/sub loop of the crate: a subscription to one node kept up for as
//! long as its task lives, for the waiters' release notices (`client/wait.rs`) and the
//! election's notices (`election/notices.rs`). It opens a pub/sub connection
//! ([`Node::open_pubsub`]), lets its [`Subscriber`] subscribe, hands it every message, checks
//! the connection with a `PING` every [`KEEPALIVE_EVERY`], and when it breaks, stops answering
//! or could not be made, starts again after [`resubscribe_pause`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};

use super::Node;
use crate::core::timing;

/// How often a pub/sub connection is checked with a `PING`: a connection that carries nothing
/// while nobody publishes would look healthy for ever after its node hung (or was cut off
/// without a FIN or RST).
pub(crate) const KEEPALIVE_EVERY: Duration = Duration::from_secs(2);

/// How a subscription that broke is re-established: the crate's backoff from this base and
/// jitter (doubling up to 1 s), whatever the retry delay of the client's acquisitions.
const RESUBSCRIBE: Duration = Duration::from_millis(100);

/// The pause before re-establishing a subscription after `failures` failed attempts in a row
/// (0 after one that had worked): the crate's one retry policy (`core::timing::backoff`) from
/// [`RESUBSCRIBE`], 100 ms doubling up to 1 s, plus up to 100 ms of jitter.
pub(crate) fn resubscribe_pause(failures: u32) -> Duration {
    timing::backoff(RESUBSCRIBE, RESUBSCRIBE, failures, rand::random::<f64>())
}

/// What a subscription does with its connection: the part of [`keep_subscribed`] that differs
/// between its users.
pub(crate) trait Subscriber: Send {
    /// Subscribes a fresh connection through its `sink`, within `timeout`: `Err(why)` when it
    /// could not (the connection is then dropped and made again).
    fn subscribe(
        &mut self,
        sink: &mut PubSubSink,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), String>> + Send;

    /// One message received on the subscription.
    fn message(&mut self, msg: redis::Msg);

    /// The subscription ended (or could not be made) for `why`; it is made again after a pause.
    fn lost(&mut self, why: &str);
}

/// Keeps `subscriber` subscribed on `node` for as long as the returned future is polled (it
/// never ends; its task is aborted).
pub(crate) async fn keep_subscribed(node: Arc<Node>, mut subscriber: impl Subscriber) {
    let timeout = node.connect_timeout();
    let mut failures = 0u32;
    loop {
        let why = match tokio::time::timeout(timeout, node.open_pubsub()).await {
            Ok(Ok(pubsub)) => {
                let (mut sink, mut messages) = pubsub.split();
                match subscriber.subscribe(&mut sink, timeout).await {
                    Ok(()) => {
                        failures = 0;
                        listen(&mut subscriber, &mut sink, &mut messages, timeout).await
                    }
                    Err(why) => why,
                }
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connect timed out".to_owned(),
        };
        subscriber.lost(&why);
        let pause = resubscribe_pause(failures);
        failures = failures.saturating_add(1);
        tokio::time::sleep(pause).await;
    }
}

/// Hands each message to the subscriber until the connection breaks or a `PING` goes
/// unanswered within `timeout`; returns why it ended.
async fn listen(
    subscriber: &mut impl Subscriber,
    sink: &mut PubSubSink,
    messages: &mut PubSubStream,
    timeout: Duration,
) -> String {
    let keepalive = async {
        loop {
            tokio::time::sleep(KEEPALIVE_EVERY).await;
            match tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return format!("PING failed: {e}"),
                Err(_) => return format!("no answer to PING within {timeout:?}"),
            }
        }
    };
    tokio::pin!(keepalive);
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(msg) => subscriber.message(msg),
                None => return "connection closed".to_owned(),
            },
            why = &mut keepalive => return why,
        }
    }
}
