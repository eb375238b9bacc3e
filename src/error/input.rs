//! What the caller gave that cannot work: a per-call argument ([`ArgumentError`]) and a
//! client's configuration ([`ConfigError`], naming the [`Setting`] at fault).

use std::fmt;
use std::time::Duration;

use super::text::{RedisText, UrlText, one_line};
use super::{fine, humanize};

/// A per-call argument that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentError {
    /// The ttl leaves too little validity once clock drift is subtracted: less than a round
    /// trip to the nodes (10 ms), so the lock would be gone before its holder could use or
    /// extend it. `min` is the shortest ttl that works (13 ms at the default drift factor).
    #[error(
        "ttl {} is too short: at least {} is needed (its clock-drift allowance of {} plus a 10ms round trip)",
        humanize(*.ttl), humanize(*.min), fine(*.drift)
    )]
    TtlTooShort {
        /// The ttl asked for.
        ttl: Duration,
        /// The drift allowance for it.
        drift: Duration,
        /// The shortest ttl accepted.
        min: Duration,
    },
    /// The ttl is above [`RedlockBuilder::MAX_TTL`](crate::RedlockBuilder::MAX_TTL) (49 days).
    #[error("ttl {0:?} is too long (at most 49 days)")]
    TtlTooLong(Duration),
    /// The key is empty, or starts with `}` (which would put the lock and its fencing counter in
    /// different Redis Cluster hash slots).
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The key given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A semaphore's permit count is 0 or above
    /// [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
    #[error("a semaphore takes 1..={max} permits, not {permits}")]
    Permits {
        /// The count given.
        permits: u32,
        /// The largest count accepted.
        max: u32,
    },
    /// The lock value given to [`Redlock::resume`](crate::Redlock::resume) cannot be one this
    /// library wrote: empty, longer than 1024 bytes, or holding a space or a control character.
    #[error("invalid lock value: {reason}")]
    InvalidValue {
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A duration setting named in a [`ConfigError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Setting {
    /// `RedlockBuilder::node_timeout`.
    NodeTimeout,
    /// `RedlockBuilder::connect_timeout`.
    ConnectTimeout,
    /// The fixed part of `RedlockBuilder::retry_delay`.
    RetryDelay,
    /// The random part of `RedlockBuilder::retry_delay`.
    RetryJitter,
    /// `RedlockBuilder::max_ttl`.
    MaxTtl,
    /// `ElectionBuilder::ttl`.
    ElectionTtl,
    /// `ElectionBuilder::poll_interval`.
    ElectionPollInterval,
    /// `RunOnceBuilder::marker_ttl`.
    TickMarkerTtl,
    /// `Schedule::every`.
    SchedulePeriod,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Setting::NodeTimeout => "node timeout",
            Setting::ConnectTimeout => "connect timeout",
            Setting::RetryDelay => "retry delay",
            Setting::RetryJitter => "retry jitter",
            Setting::MaxTtl => "max ttl",
            Setting::ElectionTtl => "election ttl",
            Setting::ElectionPollInterval => "election poll interval",
            Setting::TickMarkerTtl => "tick marker ttl",
            Setting::SchedulePeriod => "schedule period",
        })
    }
}

/// Why a client could not be built.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No node URLs were given.
    #[error("no nodes given: a Redlock needs at least one Redis master (5 is the usual choice)")]
    NoNodes,
    /// A node URL could not be parsed (or names a scheme this build does not support, such as
    /// `rediss://` without the `tls` feature).
    #[error("invalid node URL {url:?}: {}", UrlText(.url, .source))]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// The parser's reason.
        #[source]
        source: redis::RedisError,
    },
    /// The TLS certificates given for a `rediss://` node could not be used.
    #[error("TLS setup for node {url:?} failed: {}", RedisText(.source))]
    Tls {
        /// The URL, password redacted.
        url: String,
        /// The reason.
        #[source]
        source: redis::RedisError,
    },
    /// The same node was given twice; it would count twice toward a quorum.
    #[error("node {0} is listed twice; each node must be an independent master")]
    DuplicateNode(String),
    /// The drift factor must be in `[0, 0.5)`.
    #[error("drift factor {0} must be at least 0 and below 0.5")]
    DriftFactor(f64),
    /// Leader election and run-once scheduling need fencing tokens, and the client was built
    /// with `fencing(false)` or `compat(true)`.
    #[error(
        "elections and run-once jobs need fencing tokens; build the client without .fencing(false) or .compat(true)"
    )]
    FencingRequired,
    /// (Feature `blocking`.) The blocking client's runtime could not start, or a blocking call
    /// was made from inside an async runtime (use the async client there).
    #[error("blocking client: {0}")]
    Runtime(String),
    /// The key prefix given to [`RedlockBuilder::key_prefix`](crate::RedlockBuilder::key_prefix)
    /// cannot be used.
    #[error("invalid key prefix {prefix:?}: {reason}")]
    InvalidPrefix {
        /// The prefix given.
        prefix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The owner name given to [`RedlockBuilder::owner`](crate::RedlockBuilder::owner) cannot
    /// be used: empty, longer than 128 bytes, or holding a control character.
    #[error("invalid owner name {owner:?}: {reason}")]
    InvalidOwner {
        /// The name given.
        owner: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A timeout that must be positive is zero.
    #[error("{0} must be greater than zero")]
    ZeroDuration(Setting),
    /// A schedule's cron expression does not parse.
    #[error("invalid cron expression {expression:?}: {}", one_line(.reason))]
    Cron {
        /// The expression.
        expression: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A duration is beyond what the setting can sensibly take.
    #[error("{name} {value:?} is too long (at most {max:?})")]
    TooLong {
        /// The setting.
        name: Setting,
        /// The value given.
        value: Duration,
        /// The largest accepted value.
        max: Duration,
    },
}
