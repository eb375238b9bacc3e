//! Key layout and lock identity: the Redis keys of a user key (the lock and its fencing
//! counter, sharing one hash tag so they live in one Redis Cluster slot), the check that a user
//! key can be laid out, and the random value that identifies one acquisition. Pure: see
//! [`crate::core`].

use crate::error::ArgumentError;

/// A `SCAN MATCH` pattern for every fencing counter (braces are not special in Redis globs).
pub(crate) const FENCE_PATTERN: &str = "quorumlock:{*}:fence";

/// The lock key for a user key.
pub(crate) fn lock_key(key: &str) -> String {
    format!("quorumlock:{{{key}}}")
}

/// The fencing counter key for a user key (same hash slot as the lock key).
pub(crate) fn fence_key(key: &str) -> String {
    format!("quorumlock:{{{key}}}:fence")
}

/// The waiters marker of a lock key (`quorumlock:{K}:waiters`, same hash slot), which is also
/// the name of its pub/sub channel: present (with a short expiry) while some client waits for
/// the lock, so that a release publishes a notice on that channel only then.
pub(crate) fn waiters_key_of(lock_key: &str) -> String {
    format!("{lock_key}{WAITERS_SUFFIX}")
}

/// What [`waiters_key_of`] appends to a lock key.
pub(crate) const WAITERS_SUFFIX: &str = ":waiters";

/// Checks that `key` can be laid out: not empty, and not starting with `}` (which would break
/// the hash tag shared with its fencing counter).
pub(crate) fn check_key(key: &str) -> Result<(), ArgumentError> {
    let reason = if key.is_empty() {
        "it is empty"
    } else if key.starts_with('}') {
        "it starts with '}', which breaks the hash tag shared with its fencing counter"
    } else {
        return Ok(());
    };
    Err(ArgumentError::InvalidKey {
        key: key.to_owned(),
        reason,
    })
}

/// A fresh 128-bit random owner value, as 32 hex digits: what identifies one acquisition on the
/// nodes (only its owner can extend or release it).
pub(crate) fn new_value() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_and_fence_keys_share_a_hash_tag_even_with_braces_in_the_key() {
        for key in ["job", "a}b", "{x}", "x{}", "a{b}c"] {
            let (l, f) = (lock_key(key), fence_key(key));
            assert!(f.starts_with(&l), "{l} / {f}");
            assert_eq!(hash_tag(&l), hash_tag(&f), "{key}");
        }
    }

    /// Redis Cluster's rule: the part between the first `{` and the next `}` if non-empty.
    fn hash_tag(k: &str) -> &str {
        if let Some(open) = k.find('{')
            && let Some(close) = k[open + 1..].find('}')
            && close > 0
        {
            return &k[open + 1..open + 1 + close];
        }
        k
    }

    #[test]
    fn invalid_keys_are_refused() {
        assert!(check_key("").is_err());
        assert!(check_key("}x").is_err());
        assert!(check_key("x}").is_ok());
    }
}
