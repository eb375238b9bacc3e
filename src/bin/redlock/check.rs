//! `redlock check KEY TOKEN` and `redlock break KEY [--value V]`: the token check a resource
//! (or a script guarding one) runs, and the operator's fenced revoke.

use quorumlock::{FencingToken, Redlock, TokenCheck};

use crate::fail;

/// The token is not current (superseded, not held, never issued); or `break` found nothing to
/// revoke.
pub(crate) const EXIT_NOT_CURRENT: u8 = 1;

/// Prints one line: `current`, or why not; exits 0 when current, 1 when not.
pub(crate) async fn check(locks: Redlock, key: &str, token: u64) -> u8 {
    let token = FencingToken::new(token);
    match locks.check_token(key, token).await {
        Ok(check) => {
            out!("{}", describe(key, token, &check));
            if check.is_current() {
                0
            } else {
                EXIT_NOT_CURRENT
            }
        }
        Err(e) => fail(&e),
    }
}

fn describe(key: &str, token: FencingToken, check: &TokenCheck) -> String {
    match check {
        TokenCheck::Current => format!("token {token} is current for {key:?}"),
        TokenCheck::Superseded { highest } => format!(
            "token {token} is superseded for {key:?}: the highest fencing counter is {highest} \
             (a later holder, or a break)"
        ),
        TokenCheck::NotHeld { highest } => format!(
            "token {token} is not current for {key:?}: nobody holds it on a quorum (highest \
             fencing counter {highest})"
        ),
        TokenCheck::NeverIssued { highest } => format!(
            "token {token} was never handed out for {key:?}: the highest fencing counter is \
             {highest}"
        ),
        _ => format!("token {token} is not current for {key:?}"),
    }
}

/// Revokes KEY's holder (or only `value`); prints what was done. Exits 0 when a holder's value
/// was deleted, 1 when nothing held KEY (nothing done).
pub(crate) async fn brk(locks: Redlock, key: &str, value: Option<&str>) -> u8 {
    let done = match value {
        Some(v) => locks.revoke_value(key, v).await,
        None => locks.revoke(key).await,
    };
    match done {
        Ok(r) if r.revoked() => {
            let value = r.value.as_deref().unwrap_or_default();
            let owner = r
                .owner
                .as_deref()
                .map(|o| format!(" (owner {o:?})"))
                .unwrap_or_default();
            out!(
                "revoked {key:?} from {value}{owner}: deleted on {} nodes, fencing counter raised \
                 to {} on {}; tokens below {} are refused by resources that check them",
                r.deleted,
                r.token,
                r.raised,
                r.token
            );
            0
        }
        Ok(r) => {
            match r.value {
                Some(v) => out!("{key:?}: no node holds {v}; nothing revoked"),
                None => out!("{key:?}: nobody holds it on a quorum; nothing revoked"),
            }
            EXIT_NOT_CURRENT
        }
        Err(e) => fail(&e),
    }
}
