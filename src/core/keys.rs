//! Key layout: the Redis keys of a user key (the lock, and the fencing counter bucket it shares
//! with the other lock keys of its Redis Cluster hash slot), and the check that a user key and a
//! key prefix can be laid out (the value a lock key holds: [`super::value`]). Pure: see
//! [`crate::core`].
//!
//! # Layout (prefix `P`, `quorumlock` by default)
//!
//! | key | what |
//! | --- | --- |
//! | `P:{K}` | the lock on user key `K` (in compat mode: `K` itself, as other Redlock clients) |
//! | `P:fence:{T}` | the fencing counter of every lock key in Cluster slot `s`, where `T` = [`slot_tag`]`(s)` |
//!
//! A lock key and its counter are in one hash slot (the tag `T` hashes to the lock key's
//! slot), so the scripts that touch both run on a Redis Cluster too, and a node holds at most
//! 16384 counters however many names are locked.

use std::sync::{Arc, LazyLock};

use crate::error::{ArgumentError, ConfigError};

/// The number of Redis Cluster hash slots: the bound on fencing counters per node.
pub(crate) const SLOTS: u16 = 16384;

/// The default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "quorumlock";

/// The longest key prefix accepted.
pub(crate) const MAX_PREFIX_LEN: usize = 64;

/// The characters of slot tags, in enumeration order.
const TAG_ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The Redis Cluster hash slot of a key: CRC16 (XMODEM) of its hash tag (the part between the
/// first `{` and the next `}` when non-empty), else of the whole key, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % SLOTS
}

/// Redis Cluster's hash tag rule.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The tag of every slot, computed once: for slot `s`, the first string in the order (length
/// 1, 2, 3, then 4; within a length, lexicographic over [`TAG_ALPHABET`]) whose CRC16 modulo
/// 16384 is `s`. This order is part of the key layout: every client of a namespace must pick
/// the same counter for a lock key, so it never changes.
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags: Vec<Option<String>> = vec![None; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let n = TAG_ALPHABET.len();
    'lengths: for len in 1..=4u32 {
        let mut buf = vec![0u8; len as usize];
        for index in 0..n.pow(len) {
            let mut rest = index;
            for b in buf.iter_mut().rev() {
                *b = TAG_ALPHABET[rest % n];
                rest /= n;
            }
            let s = usize::from(slot(&buf));
            if tags[s].is_none() {
                tags[s] = Some(String::from_utf8_lossy(&buf).into_owned());
                missing -= 1;
                if missing == 0 {
                    break 'lengths;
                }
            }
        }
    }
    // Length 3 already covers every slot (checked by a test); 4 is a margin.
    tags.into_iter().map(Option::unwrap_or_default).collect()
});

/// The short tag whose hash slot is `slot` (see [`TAGS`] for how it is chosen).
pub(crate) fn slot_tag(slot: u16) -> &'static str {
    &TAGS[usize::from(slot % SLOTS)]
}

/// Where a client's keys live: its prefix, and whether it locks plain resource names
/// (compat mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    prefix: Arc<str>,
    compat: bool,
}

impl Default for KeyLayout {
    fn default() -> Self {
        KeyLayout {
            prefix: DEFAULT_PREFIX.into(),
            compat: false,
        }
    }
}

impl KeyLayout {
    /// A layout with a checked prefix (see [`check_prefix`]).
    pub(crate) fn new(prefix: &str, compat: bool) -> Result<Self, ConfigError> {
        check_prefix(prefix)?;
        Ok(KeyLayout {
            prefix: prefix.into(),
            compat,
        })
    }

    /// Whether this is compat mode: the lock is the plain resource name, and calls name only
    /// that key, as other Redlock clients do (no counter, no waiters marker: an ACL limited to
    /// the resource key is enough, and on a Redis Cluster no call spans two slots).
    pub(crate) fn is_compat(&self) -> bool {
        self.compat
    }

    /// The lock key for a user key: `P:{K}`, or `K` in compat mode.
    pub(crate) fn lock_key(&self, key: &str) -> String {
        if self.compat {
            key.to_owned()
        } else {
            format!("{}:{{{key}}}", self.prefix)
        }
    }

    /// The fencing counter for a user key: the bucket of its lock key's hash slot.
    pub(crate) fn fence_key(&self, key: &str) -> String {
        let tag = slot_tag(slot(self.lock_key(key).as_bytes()));
        format!("{}:fence:{{{tag}}}", self.prefix)
    }

    /// Every key of one lock, laid out once in one buffer (one allocation per lock, not one
    /// per key, per round or per node): the lock key, its waiters marker and the fencing
    /// counter. The same strings as [`lock_key`](Self::lock_key), [`fence_key`](Self::fence_key)
    /// and [`waiters_key_of`].
    pub(crate) fn lock_keys(&self, key: &str) -> LockKeys {
        let prefix: &str = &self.prefix;
        let lock_len = if self.compat {
            key.len()
        } else {
            prefix.len() + key.len() + 3
        };
        let mut buf = String::with_capacity(lock_len + WAITERS_SUFFIX.len() + prefix.len() + 13);
        push_lock_key(&mut buf, prefix, key, self.compat);
        buf.push_str(WAITERS_SUFFIX);
        let waiters = buf.len();
        let fence_start = buf.len();
        let tag = slot_tag(slot(&buf.as_bytes()[..lock_len]));
        buf.push_str(prefix);
        buf.push_str(":fence:{");
        buf.push_str(tag);
        buf.push('}');
        LockKeys {
            buf,
            key: if self.compat {
                0..key.len()
            } else {
                prefix.len() + 2..prefix.len() + 2 + key.len()
            },
            lock: lock_len,
            waiters,
            fence: fence_start,
        }
    }

    /// A `SCAN MATCH` glob for the fencing counters (`P:fence:*`; it may match other keys:
    /// filter with [`Self::is_counter`]).
    pub(crate) fn counter_glob(&self) -> String {
        format!("{}:fence:*", self.prefix)
    }

    /// The `SCAN` glob of the lock keys whose user key starts with `user_prefix` (`P:{PREFIX*`),
    /// the glob's special characters in the prefix escaped. Also matches the other keys of a
    /// lock's slot tag (waiters and revoke markers, an election's record, run-once markers):
    /// [`user_key_of`](Self::user_key_of) tells lock keys apart.
    pub(crate) fn lock_glob(&self, user_prefix: &str) -> String {
        let mut glob = format!("{}:{{", self.prefix);
        for c in user_prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                glob.push('\\');
            }
            glob.push(c);
        }
        glob.push('*');
        glob
    }

    /// The user key of a lock key found by a scan (`P:{K}` gives `K`); `None` for the other
    /// keys of the namespace: counters, markers (`P:{K}:waiters`, `P:{K}:revoked`), an
    /// election's record, run-once markers, whose names do not end at the tag's `}`.
    pub(crate) fn user_key_of(&self, lock_key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(lock_key).ok()?;
        let inner = key
            .strip_prefix(self.prefix.as_ref())?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        (check_key(inner).is_ok()).then(|| inner.to_owned())
    }

    /// The restart guard's durability marker of this namespace (`P:durability-marker`; see
    /// `node/health.rs`). Not a counter.
    pub(crate) fn durability_marker(&self) -> String {
        format!("{}:durability-marker", self.prefix)
    }

    /// Whether a key is a fencing counter of this namespace: a bucket (`P:fence:{T}`, `T` a
    /// slot tag). Lock keys of this namespace start with `P:{`, so none is a counter.
    pub(crate) fn is_counter(&self, key: &[u8]) -> bool {
        let Some(tag) = key
            .strip_prefix(self.prefix.as_bytes())
            .and_then(|r| r.strip_prefix(b":fence:{"))
            .and_then(|t| t.strip_suffix(b"}"))
        else {
            return false;
        };
        !tag.is_empty()
            && tag.len() <= 4
            && tag.iter().all(|b| TAG_ALPHABET.contains(b))
            && slot_tag(slot(tag)).as_bytes() == tag
    }
}

/// Checks a key prefix: 1 to 64 characters among ASCII letters, digits, `-`, `_` and `.`. No
/// `:` (so one namespace's keys can never be another's), no braces (hash tags) and no glob
/// characters (the repair's `SCAN MATCH`).
pub(crate) fn check_prefix(prefix: &str) -> Result<(), ConfigError> {
    let reason = if prefix.is_empty() {
        "it is empty"
    } else if prefix.len() > MAX_PREFIX_LEN {
        "it is longer than 64 characters"
    } else if !prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        "only ASCII letters, digits, '-', '_' and '.' are allowed"
    } else {
        return Ok(());
    };
    Err(ConfigError::InvalidPrefix {
        prefix: prefix.to_owned(),
        reason,
    })
}

/// The waiters marker of a lock key (`quorumlock:{K}:waiters`, same hash slot), which is also
/// the name of its pub/sub channel: present (with a short expiry) while some client waits for
/// the lock, so that a release publishes a notice on that channel only then.
pub(crate) fn waiters_key_of(lock_key: &str) -> String {
    format!("{lock_key}{WAITERS_SUFFIX}")
}

/// What [`waiters_key_of`] appends to a lock key.
pub(crate) const WAITERS_SUFFIX: &str = ":waiters";

/// The revoke marker of a lock key (`quorumlock:{K}:revoked`, same hash slot): the value a
/// revoke took away, kept about as long as that value would have lived, so that its holder's
/// failed extension can tell a revoke from an expiry.
pub(crate) fn revoked_key_of(lock_key: &str) -> String {
    format!("{lock_key}{REVOKED_SUFFIX}")
}

/// What [`revoked_key_of`] appends to a lock key.
pub(crate) const REVOKED_SUFFIX: &str = ":revoked";

/// Appends the lock key of `key` (`P:{K}`, or `K` in compat mode) to `buf`.
fn push_lock_key(buf: &mut String, prefix: &str, key: &str, compat: bool) {
    if compat {
        buf.push_str(key);
    } else {
        buf.push_str(prefix);
        buf.push_str(":{");
        buf.push_str(key);
        buf.push('}');
    }
}

/// The keys of one lock, in one buffer: `lock + ":waiters"`, then the fencing counter (see
/// [`KeyLayout::lock_keys`]).
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    buf: String,
    /// The user key: inside the lock key.
    key: std::ops::Range<usize>,
    /// Where the lock key ends (it starts the buffer), and the waiters marker (which extends it).
    lock: usize,
    waiters: usize,
    /// Where the fencing counter starts (it ends the buffer).
    fence: usize,
}

impl LockKeys {
    /// The user key.
    pub(crate) fn key(&self) -> &str {
        &self.buf[self.key.clone()]
    }

    /// The lock key: `P:{K}`, or `K` in compat mode.
    pub(crate) fn lock(&self) -> &str {
        &self.buf[..self.lock]
    }

    /// The fencing counter of the lock key's hash slot.
    pub(crate) fn fence(&self) -> &str {
        &self.buf[self.fence..]
    }

    /// The waiters marker, also the channel of release notices (see [`waiters_key_of`]).
    pub(crate) fn waiters(&self) -> &str {
        &self.buf[..self.waiters]
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_slot_has_a_tag_of_at_most_three_characters_that_hashes_to_it() {
        for s in 0..SLOTS {
            let tag = slot_tag(s);
            assert!(!tag.is_empty() && tag.len() <= 3, "slot {s}: {tag:?}");
            assert_eq!(slot(tag.as_bytes()), s, "{tag}");
        }
    }

    #[test]
    fn crc16_and_tags_match_redis() {
        // `CLUSTER KEYSLOT` of a Redis 7 node (and the specification's check value).
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"somekey"), 11058);
        assert_eq!(slot(b"foo{hash_tag}"), 2515);
        assert_eq!(slot(b"{user1000}.following"), 3443);
        assert_eq!(slot(b"quorumlock:{job}"), 2906);
        assert_eq!(slot(b"foo{}{bar}"), 8363); // an empty tag: the whole key is hashed
        // The layout is pinned: a change would split one name's counter in two.
        assert_eq!(slot_tag(slot(b"0")), "0");
        let tags: Vec<&str> = [0, 1, 12182, 16383].into_iter().map(slot_tag).collect();
        assert_eq!(tags, PINNED_TAGS);
    }

    const PINNED_TAGS: [&str; 4] = ["06S", "Qi", "9Le", "6ZJ"];

    #[test]
    fn lock_and_fence_keys_share_a_hash_slot_even_with_braces_in_the_key() {
        for compat in [false, true] {
            let layout = KeyLayout::new("app.locks", compat).unwrap();
            for key in ["job", "a}b", "{x}", "x{}", "a{b}c", "payout-42"] {
                let (l, f) = (layout.lock_key(key), layout.fence_key(key));
                assert_eq!(slot(l.as_bytes()), slot(f.as_bytes()), "{l} / {f}");
                assert!(layout.is_counter(f.as_bytes()), "{f}");
                assert!(!layout.is_counter(l.as_bytes()) || compat, "{l}");
            }
        }
        let default = KeyLayout::default();
        assert_eq!(default.lock_key("job"), "quorumlock:{job}");
        assert_eq!(KeyLayout::new("x", true).unwrap().lock_key("job"), "job");
    }

    proptest! {
        #[test]
        fn lock_keys_are_the_keys_of_the_layout(key in "[^}].{0,20}", prefix in "[a-z_.-]{1,8}", compat: bool) {
            let layout = KeyLayout::new(&prefix, compat).unwrap();
            let keys = layout.lock_keys(&key);
            prop_assert_eq!(keys.key(), key.as_str());
            prop_assert_eq!(keys.lock(), layout.lock_key(&key));
            prop_assert_eq!(keys.fence(), layout.fence_key(&key));
            prop_assert!(layout.is_counter(keys.fence().as_bytes()));
            prop_assert_eq!(keys.waiters(), waiters_key_of(&layout.lock_key(&key)));
        }

        #[test]
        fn a_lock_key_is_never_a_counter(key in "[^}].{0,20}") {
            let layout = KeyLayout::default();
            prop_assert!(!layout.is_counter(layout.lock_key(&key).as_bytes()));
            let f = layout.fence_key(&key);
            prop_assert_eq!(slot(layout.lock_key(&key).as_bytes()), slot(f.as_bytes()));
        }
    }

    #[test]
    fn other_keys_of_the_namespace_are_not_counters() {
        let layout = KeyLayout::default();
        for key in [
            "quorumlock:{job}",
            "quorumlock:{job}:leader",
            "quorumlock:{job}:tick:7",
            "quorumlock:fence:{zzzz}",
            "quorumlock:fence:{}",
            "quorumlock:{}:fence",
            "quorumlock:{job}:fence",
            "quorumlock:fence:migrated",
            "other:{job}:fence",
            "quorumlock:durability-marker",
        ] {
            assert!(!layout.is_counter(key.as_bytes()), "{key}");
        }
    }

    #[test]
    fn prefixes_are_checked() {
        for ok in ["quorumlock", "app-1", "a.b_c", &"x".repeat(64)] {
            assert!(check_prefix(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a:b", "a{b", "a*", "a b", "é", &"x".repeat(65)] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scans_find_lock_keys_only() {
        let layout = KeyLayout::new("ql", false).unwrap();
        assert_eq!(layout.lock_glob("job*[1]"), "ql:{job\\*\\[1\\]*");
        assert_eq!(
            layout.user_key_of(b"ql:{nightly}").as_deref(),
            Some("nightly")
        );
        assert_eq!(
            layout.user_key_of(b"ql:{a:permit:2}").as_deref(),
            Some("a:permit:2")
        );
        for other in [
            &b"ql:{nightly}:waiters"[..],
            b"ql:{nightly}:revoked",
            b"ql:{e}:leader",
            b"ql:{job}:tick:7",
            b"ql:fence:{3x}",
            b"ql:durability-marker",
            b"other:{x}",
        ] {
            assert_eq!(layout.user_key_of(other), None, "{other:?}");
        }
        let keys = layout.lock_keys("nightly");
        assert_eq!(
            layout.user_key_of(keys.lock().as_bytes()).as_deref(),
            Some("nightly")
        );
    }

    #[test]
    fn invalid_keys_are_refused() {
        assert!(check_key("").is_err());
        assert!(check_key("}x").is_err());
        assert!(check_key("x}").is_ok());
    }
}
