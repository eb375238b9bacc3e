//! What a node's memory policy can do to the keys this library keeps there: the vocabulary of
//! the eviction check, shared by the error types (`NodeError::Evicting`), the pure core, which
//! classifies a node (`core::health::classify_eviction`), and the status report. No I/O.

/// What a node's memory policy (`maxmemory`, `maxmemory-policy`, read from `INFO memory` on
/// every connect, or with `CONFIG GET` where `INFO` lacks them) can do to the keys this library keeps there.
///
/// Redis evicts keys when `maxmemory` is reached: under a `volatile-*` policy any key with a
/// ttl, lock keys included, before they expire (a lock then stands on fewer nodes than its
/// holder was told, without any restart); under `allkeys-*` any key, the fencing counters too
/// (tokens can repeat). `noeviction` (writes fail instead: acquisitions fail, safely) and
/// `maxmemory 0` (no limit) are safe.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EvictionRisk {
    /// No eviction: `maxmemory` is 0 or the policy is `noeviction`.
    None,
    /// A `volatile-*` policy with `maxmemory` set: lock keys can be evicted before they expire.
    LockKeys {
        /// The `maxmemory-policy`.
        policy: String,
    },
    /// An `allkeys-*` policy with `maxmemory` set: lock keys and fencing counters can be
    /// evicted.
    LockKeysAndCounters {
        /// The `maxmemory-policy`.
        policy: String,
    },
    /// Not known: the node has not been reached yet, or it refuses `CONFIG GET` (managed
    /// services often do).
    #[default]
    Unknown,
}

impl EvictionRisk {
    /// True when the node can evict lock keys (or counters).
    pub fn is_risky(&self) -> bool {
        matches!(
            self,
            EvictionRisk::LockKeys { .. } | EvictionRisk::LockKeysAndCounters { .. }
        )
    }
}

impl std::fmt::Display for EvictionRisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvictionRisk::None => f.write_str("no eviction"),
            EvictionRisk::LockKeys { policy } => write!(
                f,
                "maxmemory-policy {policy} with maxmemory set: lock keys can be evicted before they expire"
            ),
            EvictionRisk::LockKeysAndCounters { policy } => write!(
                f,
                "maxmemory-policy {policy} with maxmemory set: lock keys and fencing counters can be evicted"
            ),
            EvictionRisk::Unknown => {
                f.write_str("eviction policy unknown (neither INFO nor CONFIG GET gave it)")
            }
        }
    }
}
