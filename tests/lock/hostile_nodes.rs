//! Everything a node can send (h01): fake nodes on loopback ports that are connected to as a
//! Redis server (or not even that) and then answer the lock's commands with arbitrary RESP2
//! and RESP3 frames, truncated frames or arbitrary bytes. Whatever they send, acquire, extend,
//! release and status end (bounded: a hang fails the case) in a typed error whose `Display` is
//! one line without control characters, or in a result the replies justify: a lock is granted
//! only from replies of the acquire script's shape (a positive integer, or `OK`).
//!
//! The case count is small in the suite; `PROPTEST_CASES=2000` runs the longer profile.

use std::time::Duration;

use proptest::prelude::*;
use quorumlock::{Error, Redlock, RestartGuard};
use redis::Value;

#[path = "../support/fake_node.rs"]
mod fake_node;

use fake_node::ScriptedNode;

/// Cases in the suite, unless `PROPTEST_CASES` asks for more.
const SUITE_CASES: u32 = 128;
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(150);
/// No operation may take this long, whatever the nodes send: a hang, not a slow round.
const HANG: Duration = Duration::from_secs(5);

fn line(prefix: char, text: &str) -> Vec<u8> {
    format!("{prefix}{text}\r\n").into_bytes()
}

fn sized(prefix: char, body: &[u8]) -> Vec<u8> {
    let mut out = format!("{prefix}{}\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
    out
}

fn aggregate(prefix: char, count: usize, items: Vec<Vec<u8>>) -> Vec<u8> {
    let mut out = format!("{prefix}{count}\r\n").into_bytes();
    for item in items {
        out.extend(item);
    }
    out
}

/// One RESP2 or RESP3 frame, well formed or hostile (huge lengths, deep nesting).
fn frame() -> impl Strategy<Value = Vec<u8>> {
    // A node's own words are quoted in messages: no brackets, so that Rust debug text (which
    // has them) stays told apart from what the node said.
    let text = "[ -'*-z|~\x07\x1b]{0,12}";
    let leaf = prop_oneof![
        text.prop_map(|s| line('+', &s)),
        text.prop_map(|s| line('-', &s)),
        Just(b"+OK\r\n".to_vec()),
        Just(b"-NOSCRIPT No matching script\r\n".to_vec()),
        Just(b"-WRONGTYPE Operation against a key\r\n".to_vec()),
        (-2i64..4).prop_map(|i| line(':', &i.to_string())),
        any::<i64>().prop_map(|i| line(':', &i.to_string())),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(|b| sized('$', &b)),
        Just(b"$-1\r\n".to_vec()),
        Just(b"*-1\r\n".to_vec()),
        Just(b"_\r\n".to_vec()),
        any::<f64>().prop_map(|f| line(',', &f.to_string())),
        any::<bool>().prop_map(|b| line('#', if b { "t" } else { "f" })),
        "[0-9]{1,40}".prop_map(|n| line('(', &n)),
        text.prop_map(|s| sized('=', format!("txt:{s}").as_bytes())),
        text.prop_map(|s| sized('!', s.as_bytes())),
        Just(b"$999999999999\r\n".to_vec()),
        Just(b"*999999999999\r\n".to_vec()),
        Just([b"*1\r\n".repeat(5000), b":1\r\n".to_vec()].concat()),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|items| aggregate(
                '*',
                items.len(),
                items
            )),
            prop::collection::vec(inner.clone(), 0..4).prop_map(|items| aggregate(
                '~',
                items.len(),
                items
            )),
            prop::collection::vec(inner.clone(), 1..4).prop_map(|items| aggregate(
                '>',
                items.len(),
                items
            )),
            prop::collection::vec((inner.clone(), inner.clone()), 0..3).prop_map(|pairs| {
                let n = pairs.len();
                aggregate(
                    '%',
                    n,
                    pairs.into_iter().map(|(k, v)| [k, v].concat()).collect(),
                )
            }),
            (inner.clone(), inner.clone(), inner).prop_map(|(k, v, data)| [
                aggregate('|', 1, vec![k, v]),
                data
            ]
            .concat()),
        ]
    })
}

/// What a fake node answers with: a frame, a frame cut short, or arbitrary bytes.
fn reply() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => frame(),
        1 => (frame(), any::<prop::sample::Index>()).prop_map(|(f, at)| {
            let cut = at.index(f.len().max(1));
            f[..cut].to_vec()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..48),
    ]
}

/// One line of words: no line break, no control character, no Rust debug text.
fn assert_one_line(what: &str, e: &dyn std::fmt::Display) {
    let text = e.to_string();
    assert!(
        !text.chars().any(char::is_control),
        "{what}: a control character in {text:?}"
    );
    for debug in [
        "Some(",
        "int(",
        "{ ",
        "- Parse",
        "- Io",
        "- Client",
        "ResponseError",
    ] {
        assert!(
            !text.contains(debug),
            "{what}: debug text {debug:?} in {text:?}"
        );
    }
}

/// Whether `reply`, as the client parses it, is a yes of the acquire script: a positive
/// integer or `OK`.
fn grants(reply: &[u8]) -> bool {
    matches!(redis::parse_redis_value(reply), Ok(Value::Int(n)) if n > 0)
        || matches!(redis::parse_redis_value(reply), Ok(Value::Okay))
}

async fn one_case(reply: Vec<u8>, handshake: bool, version: &'static str) {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(ScriptedNode::start(reply.clone(), handshake, version).await);
    }
    let locks = Redlock::builder(nodes.iter().map(ScriptedNode::url))
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .restart_guard(RestartGuard::Off)
        .retry_count(0)
        .build()
        .expect("valid config");
    let reply_text = String::from_utf8_lossy(&reply).into_owned();
    let acquired = within(
        "acquire",
        &reply_text,
        locks.try_acquire("k", Duration::from_secs(2)),
    )
    .await;
    match acquired {
        Ok(lock) => {
            assert!(
                handshake && grants(&reply),
                "granted from a reply not of the acquire's shape: {reply_text:?}"
            );
            let extended = within("extend", &reply_text, lock.extend(Duration::from_secs(2))).await;
            if let Err(e) = &extended {
                assert_one_line("extend", e);
            }
            let released = within("release", &reply_text, lock.release()).await;
            if let Err(e) = &released {
                assert_one_line("release", e);
            }
        }
        Err(e) => {
            assert!(
                !matches!(e, Error::InvalidArgument(_) | Error::Config(_)),
                "{e}"
            );
            assert_one_line("acquire", &e);
        }
    }
    let status = within("status", &reply_text, locks.status("k")).await;
    match status {
        Ok(status) => {
            for node in &status.nodes {
                if let Err(cause) = &node.state {
                    assert_one_line("status", cause);
                }
            }
            if let Err(e) = status.require_quorum() {
                assert_one_line("status quorum", &e);
            }
        }
        Err(e) => assert_one_line("status", &e),
    }
}

/// `op`'s outcome; a failure of the case naming `what` and the reply if it hangs.
async fn within<T>(what: &str, reply: &str, op: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(HANG, op).await {
        Ok(outcome) => outcome,
        Err(_) => panic!("{what} did not end within {HANG:?}; the nodes answered {reply:?}"),
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SUITE_CASES)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn h01_whatever_a_node_sends_ends_in_one_line_or_a_justified_result(
        reply in reply(),
        handshake in prop::bool::weighted(0.8),
        version in prop::sample::select(vec!["6.2.14", "7.2.4"]),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(one_case(reply, handshake, version));
    }
}

/// The shapes the oracle grants from, and a few it must not.
#[test]
fn h02_the_oracle_grants_only_the_acquire_shapes() {
    assert!(grants(b":1\r\n") && grants(b"+OK\r\n") && grants(b":7\r\n"));
    for no in [
        &b":0\r\n"[..],
        b"$1\r\n1\r\n",
        b"#t\r\n",
        b",1\r\n",
        b"*1\r\n:1\r\n",
        b"(1\r\n",
    ] {
        assert!(!grants(no), "{:?}", String::from_utf8_lossy(no));
    }
}

/// The fake nodes are Redis enough for the property to reach the lock's replies: answered `1`
/// by a Redis 6 (the script form), the acquire is granted, extended and released.
#[tokio::test]
async fn h03_the_fake_nodes_reach_the_lock_replies() {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(ScriptedNode::start(b":1\r\n".to_vec(), true, "6.2.14").await);
    }
    let locks = Redlock::builder(nodes.iter().map(ScriptedNode::url))
        .node_timeout(Duration::from_secs(2))
        .restart_guard(RestartGuard::Off)
        .build()
        .unwrap();
    let lock = locks
        .try_acquire("k", Duration::from_secs(2))
        .await
        .unwrap();
    lock.extend(Duration::from_secs(2)).await.unwrap();
    lock.release().await.unwrap();
}
