//! The unit tests of `error`: error wording and classification.

use super::*;

/// Every `NodeError::kind()` word is in the metrics table of `docs/design.md` (the label
/// values of `quorumlock_node_errors_total`). The match below has no wildcard: a new
/// variant fails to compile here until it is listed, and then until it is documented.
#[test]
fn every_node_error_kind_is_in_the_documented_metrics_table() {
    let design = include_str!("../../docs/design.md");
    let row = design
        .lines()
        .find(|l| l.starts_with("| `quorumlock_node_errors_total`"))
        .expect("the metrics table's node errors row");
    let io = || redis::RedisError::from(std::io::Error::other("x"));
    let every = [
        NodeError::Timeout(Duration::ZERO),
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
        NodeError::BadReply(String::new()),
        NodeError::LostDataRecently {
            ago: Duration::ZERO,
        },
        NodeError::Denied {
            command: String::new(),
            reason: "",
        },
    ];
    for e in &every {
        match e {
            NodeError::Timeout(_)
            | NodeError::Refused(_)
            | NodeError::Dropped(_)
            | NodeError::HeldOut { .. }
            | NodeError::ClockJumped { .. }
            | NodeError::Repairing
            | NodeError::SameServer { .. }
            | NodeError::Evicting(_)
            | NodeError::Redis(_)
            | NodeError::HeldByAnother
            | NodeError::BadReply(_)
            | NodeError::LostDataRecently { .. }
            | NodeError::Denied { .. } => {}
        }
        assert!(
            row.contains(&format!("`{}`", e.kind())),
            "`{}` is not in docs/design.md's metrics table: {row}",
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
