//! The unit tests of `error`: error wording and classification.

use super::*;

/// Every `NodeError::kind()` word is in the metrics table of `docs/observability.md` (the label
/// values of `quorumlock_node_errors_total`). The match below has no wildcard: a new
/// variant fails to compile here until it is listed, and then until it is documented.
#[test]
fn every_node_error_kind_is_in_the_documented_metrics_table() {
    let guide = include_str!("../../docs/observability.md");
    let row = guide
        .lines()
        .find(|l| l.starts_with("| `quorumlock_node_errors_total`"))
        .expect("the metrics table's node errors row");
    let io = || redis::RedisError::from(std::io::Error::other("x"));
    let every = [
        NodeError::Timeout(Duration::ZERO),
        NodeError::Backlog(Duration::ZERO),
        NodeError::Refused(io()),
        NodeError::Dropped(io()),
        NodeError::HeldOut {
            remaining: Duration::ZERO,
        },
        NodeError::ClockJumped {
            forward: Duration::ZERO,
        },
        NodeError::Repairing,
        NodeError::SameServer {
            other: String::new(),
            run_id: String::new(),
        },
        NodeError::Evicting(crate::eviction::EvictionRisk::None),
        NodeError::Redis(io()),
        NodeError::HeldByAnother,
        NodeError::BadReply {
            expected: "",
            got: String::new(),
        },
        NodeError::NotRedis {
            closed_early: false,
        },
        NodeError::LostDataRecently {
            ago: Duration::ZERO,
        },
        NodeError::Denied {
            command: String::new(),
            reason: "",
        },
        NodeError::Unsupported {
            command: String::new(),
        },
        NodeError::Silent {
            for_: Duration::ZERO,
        },
    ];
    for e in &every {
        match e {
            NodeError::Timeout(_)
            | NodeError::Backlog(_)
            | NodeError::Silent { .. }
            | NodeError::Refused(_)
            | NodeError::Dropped(_)
            | NodeError::HeldOut { .. }
            | NodeError::ClockJumped { .. }
            | NodeError::Repairing
            | NodeError::SameServer { .. }
            | NodeError::Evicting(_)
            | NodeError::Redis(_)
            | NodeError::HeldByAnother
            | NodeError::BadReply { .. }
            | NodeError::NotRedis { .. }
            | NodeError::LostDataRecently { .. }
            | NodeError::Denied { .. }
            | NodeError::Unsupported { .. } => {}
        }
        assert!(
            row.contains(&format!("`{}`", e.kind())),
            "`{}` is not in docs/observability.md's metrics table: {row}",
            e.kind()
        );
    }
}

fn failure(cause: NodeError) -> NodeFailure {
    NodeFailure {
        node: "n".to_owned(),
        cause,
    }
}

fn denied() -> NodeFailure {
    failure(NodeError::Denied {
        command: "INCR".to_owned(),
        reason: "command not allowed",
    })
}

/// Refusals alone ruling out a quorum are `PermissionDenied` (not retried); a minority of
/// them beside other failures is a `NoQuorum` that names them.
#[test]
fn refusals_on_a_majority_are_permission_denied() {
    let e = Error::no_quorum("k", 1, 3, 2, vec![denied(), denied()]);
    assert!(e.is_permission_denied() && !e.is_retryable(), "{e}");
    assert!(
        e.to_string().contains("may not run INCR on 2 of 3 nodes"),
        "{e}"
    );
    let e = Error::no_quorum(
        "k",
        1,
        3,
        2,
        vec![denied(), failure(NodeError::Timeout(Duration::ZERO))],
    );
    assert!(e.is_no_quorum() && e.is_retryable(), "{e}");
    assert!(e.to_string().contains("may not run INCR"), "{e}");
    let e = Error::no_quorum("k", 4, 5, 3, vec![denied(), denied()]);
    assert!(
        e.is_no_quorum(),
        "two of five refusing leave a quorum possible: {e}"
    );
}

/// Calls still queued behind the client's own earlier calls that would have made the quorum:
/// the client is overloaded (no node named as failed); when even they could not have made it,
/// the round is a `NoQuorum` that lists them.
#[test]
fn a_backlog_that_kept_the_quorum_away_is_overloaded() {
    let backlog = || failure(NodeError::Backlog(Duration::from_millis(400)));
    let timeout = || failure(NodeError::Timeout(Duration::from_millis(50)));
    let e = Error::no_quorum("k", 1, 3, 2, vec![backlog(), backlog()]);
    assert!(e.is_overloaded() && e.is_retryable(), "{e}");
    assert_eq!(
        e.to_string(),
        "this client is overloaded: 2 of 3 nodes were still answering its earlier calls, not yet \
         this one on \"k\", after 400ms; the nodes are healthy (bound the operations in flight)"
    );
    let e = Error::no_quorum("k", 0, 3, 2, vec![backlog(), timeout(), timeout()]);
    assert!(
        e.is_no_quorum(),
        "one queued call cannot make a quorum of 2: {e}"
    );
    assert!(e.to_string().contains("the client's own backlog"), "{e}");
    // A refusal is no vote for us: a refusal and a queued call do not make 2.
    let e = Error::no_quorum(
        "k",
        1,
        3,
        2,
        vec![failure(NodeError::HeldByAnother), backlog(), timeout()],
    );
    assert!(e.is_no_quorum(), "{e}");
}

/// What no message for people may carry: a second line, a control character, Rust debug
/// text (`Some(`, `int(`, a struct's `{ `) or the `redis` crate's `- Kind` suffixes.
pub(crate) fn assert_plain(text: &str) {
    assert!(
        !text.chars().any(char::is_control),
        "control character in {text:?}"
    );
    for debug in [
        "Some(",
        "None",
        "int(",
        "{ ",
        "Okay",
        "- Parse",
        "- Io",
        "- InvalidClientConfig",
        "- AuthenticationFailed",
        "- Client",
        "- Extension",
        "ResponseError",
        "Incompatible type",
    ] {
        assert!(!text.contains(debug), "debug text {debug:?} in {text:?}");
    }
}

/// The worst a node can send, as `redis` errors: a parse error over several lines, an error
/// reply with escapes and newlines, a failed DNS lookup, the crate's own client errors.
fn hostile() -> Vec<redis::RedisError> {
    vec![
        redis::parse_redis_value(b"\xff\x00\r\n").unwrap_err(),
        redis::parse_redis_value(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap_err(),
        redis::parse_redis_value(b"-ERR a\x1b[2J\x07b\r\n")
            .and_then(redis::Value::extract_error)
            .unwrap_err(),
        redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n")
            .and_then(redis::Value::extract_error)
            .unwrap_err(),
        redis::RedisError::from(std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        )),
        redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )),
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "Redis URL did not parse",
        )),
        redis::Client::open("redis://127.0.0.1:99999").unwrap_err(),
        redis::RedisError::from((redis::ErrorKind::Client, "x", "a\nb".to_owned())),
    ]
}

/// Every variant of `NodeError`, from the hostile errors where it carries one.
fn every_node_error() -> Vec<NodeError> {
    let mut nodes = Vec::new();
    for e in hostile() {
        nodes.push(NodeError::from_redis(e.clone()));
        nodes.push(NodeError::Refused(e.clone()));
        nodes.push(NodeError::Dropped(e.clone()));
        nodes.push(NodeError::Redis(e));
    }
    let reply = redis::Value::Array(vec![redis::Value::Int(0), redis::Value::Nil]);
    nodes.extend([
        NodeError::Timeout(Duration::from_millis(250)),
        NodeError::HeldOut {
            remaining: Duration::from_secs(3),
        },
        NodeError::Repairing,
        NodeError::SameServer {
            other: "redis://h:1".to_owned(),
            run_id: "ab\r\ncd".to_owned(),
        },
        NodeError::Evicting(crate::eviction::EvictionRisk::Unknown),
        NodeError::HeldByAnother,
        NodeError::unexpected("an integer", &reply),
        NodeError::NotRedis { closed_early: true },
        NodeError::LostDataRecently {
            ago: Duration::from_secs(1),
        },
        NodeError::Denied {
            command: "GET\x1b[1m".to_owned(),
            reason: "command not allowed",
        },
    ]);
    nodes
}

/// Every variant of `Error` and its argument errors, carrying `failures` where it has any.
fn every_client_error(failures: &[NodeFailure]) -> Vec<Error> {
    vec![
        Error::Held {
            key: "k\x1b".into(),
            held: 3,
            nodes: 5,
            needed: 3,
        },
        Error::no_quorum("k", 1, 5, 3, failures.to_vec()),
        Error::no_quorum("k", 1, 3, 2, vec![denied(), denied()]),
        Error::WrongType {
            key: "k".into(),
            kind: "hash\n".into(),
            nodes: 2,
        },
        Error::ValidityExpired {
            key: "k".into(),
            elapsed: Duration::from_millis(3),
            ttl: Duration::from_millis(3),
        },
        Error::Lost {
            key: "k".into(),
            reason: LostReason::Unreachable {
                failures: failures.to_vec(),
            },
        },
        Error::Lost {
            key: "k".into(),
            reason: LostReason::NotOwner {
                owned: 1,
                needed: 3,
            },
        },
        ArgumentError::TtlTooShort {
            ttl: Duration::from_millis(3),
            drift: Duration::from_millis(2),
            min: Duration::from_millis(13),
        }
        .into(),
        ArgumentError::TtlTooLong(Duration::from_secs(100 * 86400)).into(),
        ArgumentError::InvalidKey {
            key: "}\n".into(),
            reason: "r",
        }
        .into(),
        ArgumentError::InvalidValue { reason: "r" }.into(),
        ArgumentError::Permits {
            permits: 0,
            max: 1000,
        }
        .into(),
    ]
}

/// Every variant of `ConfigError`, from the hostile errors where it carries one.
fn every_config_error() -> Vec<ConfigError> {
    let mut configs = vec![
        ConfigError::NoNodes,
        ConfigError::DuplicateNode("redis://h:1".into()),
        ConfigError::DriftFactor(0.7),
        ConfigError::FencingRequired,
        ConfigError::ZeroDuration(Setting::NodeTimeout),
        ConfigError::TooLong {
            name: Setting::MaxTtl,
            value: Duration::from_secs(9),
            max: Duration::from_secs(1),
        },
        ConfigError::InvalidOwner {
            owner: "a\nb".into(),
            reason: "r",
        },
        ConfigError::InvalidPrefix {
            prefix: "a\tb".into(),
            reason: "r",
        },
    ];
    for e in hostile() {
        configs.push(ConfigError::InvalidUrl {
            url: "redis://127.0.0.1:99999".into(),
            source: e.clone(),
        });
        configs.push(ConfigError::Tls {
            url: "rediss://h:1".into(),
            source: e,
        });
    }
    configs
}

/// Every variant of every public error, built from the worst a node can send, displays as
/// one line of words.
#[test]
fn every_error_displays_as_one_plain_line() {
    let nodes = every_node_error();
    let failures: Vec<NodeFailure> = nodes.iter().cloned().map(failure).collect();
    let mut texts: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    texts.extend(
        every_client_error(&failures)
            .iter()
            .map(ToString::to_string),
    );
    texts.extend(
        every_config_error()
            .into_iter()
            .map(|e| Error::from(e).to_string()),
    );
    for text in &texts {
        assert_plain(text);
    }
    let not_redis = NodeError::from_redis(hostile().remove(0));
    assert_eq!(not_redis.kind(), "bad_reply");
    assert_eq!(
        not_redis.to_string(),
        "not a Redis server (unexpected reply)"
    );
}

/// A timeout whose length the call does not know (the connection's own response timeout) says
/// "timed out", never "timed out after 0µs".
#[test]
fn a_timeout_of_unknown_length_says_no_length() {
    assert_eq!(NodeError::Timeout(Duration::ZERO).to_string(), "timed out");
    assert_eq!(
        NodeError::Timeout(Duration::from_millis(250)).to_string(),
        "timed out after 250ms"
    );
}
