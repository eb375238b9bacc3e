//! Fencing tokens and the resource-side checks that make them useful.
//!
//! A lock cannot stop a holder that was paused (GC, VM stall) past its validity from acting as if
//! it still held the lock: the holder cannot know it was paused. What can be done is to make the
//! *resource* refuse it. Every acquisition carries a [`FencingToken`] that only grows; the holder
//! sends it with every write, and the resource rejects any token below the highest it has seen.
//!
//! A resource can only refuse a stale token once it has seen a newer one. Between a new
//! holder's acquisition and its first write, a paused earlier holder that wakes still writes
//! with the highest token the resource knows, and is accepted. Where the effect must not happen
//! twice (a payment, an e-mail), **claim, then act**: the new holder first raises the
//! resource's highest token to its own without writing ([`fenced_claim`], [`FenceGate::admit`],
//! or the SQL claim below), and only then does its work; every later write or claim with a lower
//! token is refused from that moment.
//!
//! Three ready forms of the check:
//! - data in Redis: [`fenced_claim`] and [`fenced_set`] (Lua scripts: compare and raise, or
//!   compare and write, in one step);
//! - data in your process or store: [`FenceGate`];
//! - data in SQL: a claim row per resource and conditional updates, shown in `docs/safety.md`:
//!   claim with `UPDATE fence SET max_token = $1 WHERE name = $2 AND max_token <= $1` (zero
//!   rows updated: a newer holder claimed first, do not act), then act only where the token is
//!   still the highest:
//!   `UPDATE payouts SET state = 'paid' WHERE id = $3 AND (SELECT max_token FROM fence WHERE
//!   name = $2) = $1`.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::ConnectionLike;

use crate::client::side::fenced_write;
use crate::core::token::FencingToken;

/// A write refused because a newer holder has already written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {token}: a holder with token {highest} has already written")]
#[non_exhaustive]
pub struct StaleToken {
    /// The token that was refused.
    pub token: FencingToken,
    /// The highest token the resource has accepted.
    pub highest: FencingToken,
}

/// An in-process fencing check for a resource you guard yourself (a file, an in-memory store, a
/// connection to a system without conditional writes).
///
/// [`admit`](Self::admit) accepts a token at least as high as every token admitted before (so
/// one holder may write many times) and refuses lower ones. Admitting is also the claim: a new
/// holder that admits its token before it acts shuts out every lower token from then on.
///
/// ```
/// use quorumlock::{FenceGate, FencingToken};
///
/// let gate = FenceGate::new();
/// assert!(gate.admit(FencingToken::new(17)).is_ok()); // worker A
/// assert!(gate.admit(FencingToken::new(18)).is_ok()); // worker B took over
/// let late = gate.admit(FencingToken::new(17));       // A wakes from its pause
/// assert_eq!(late.unwrap_err().highest, FencingToken::new(18));
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: AtomicU64,
}

impl FenceGate {
    /// A gate that has seen no token.
    pub const fn new() -> Self {
        FenceGate {
            highest: AtomicU64::new(0),
        }
    }

    /// Admits `token` if no higher token was admitted before, and remembers it.
    ///
    /// # Errors
    ///
    /// [`StaleToken`] when a higher token was admitted: the caller's lock was taken over.
    pub fn admit(&self, token: FencingToken) -> Result<(), StaleToken> {
        let prev = self.highest.fetch_max(token.get(), Ordering::AcqRel);
        if token.get() < prev {
            Err(StaleToken {
                token,
                highest: FencingToken::new(prev),
            })
        } else {
            Ok(())
        }
    }

    /// The highest token admitted so far.
    pub fn highest(&self) -> FencingToken {
        FencingToken::new(self.highest.load(Ordering::Acquire))
    }
}

/// The result of [`fenced_set`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencedWrite {
    /// The value was written; the resource now remembers this token.
    Written,
    /// Refused: the resource has seen `highest`, above the writer's token.
    Stale {
        /// The highest token the resource has seen.
        highest: FencingToken,
    },
}

impl FencedWrite {
    /// Whether the value was written: `false` means a newer holder wrote first, and the writer
    /// must stop acting on the lock. Lets callers branch without a wildcard arm.
    pub fn is_written(&self) -> bool {
        matches!(self, FencedWrite::Written)
    }

    /// The highest token the resource had seen, when the write was refused.
    pub fn stale_by(&self) -> Option<FencingToken> {
        match self {
            FencedWrite::Written => None,
            FencedWrite::Stale { highest } => Some(*highest),
        }
    }
}

/// Writes `value` to `data_key` on your own Redis only if `token` is at least as high as every
/// token that wrote there before (checked and written atomically by a Lua script).
///
/// The highest token is kept at `"{data_key}:fence"`; put a hash tag in `data_key` (e.g.
/// `"{payout:42}"`) if the resource lives in Redis Cluster.
///
/// ```no_run
/// # async fn demo(conn: &mut quorumlock::redis::aio::MultiplexedConnection, lock: &quorumlock::Lock) -> redis::RedisResult<()> {
/// use quorumlock::fenced_set;
/// let write = fenced_set(conn, "payout:42:result", lock.token(), "paid").await?;
/// if let Some(highest) = write.stale_by() {
///     eprintln!("lost the lock to token {highest}; not writing");
/// }
/// # Ok(()) }
/// ```
///
/// `conn` is a connection of the [`redis`](crate::redis) crate this crate re-exports (a
/// `redis` of another major version would not implement its `ConnectionLike`).
///
/// # Errors
///
/// The connection's [`redis::RedisError`].
///
/// # Cancellation safety
///
/// Dropping the future may leave the write sent; it is still checked on the server.
pub async fn fenced_set<C: ConnectionLike + Send>(
    conn: &mut C,
    data_key: &str,
    token: FencingToken,
    value: impl redis::ToRedisArgs + Send + Sync,
) -> redis::RedisResult<FencedWrite> {
    let (written, highest) = fenced_write(conn, data_key, token, Some(value)).await?;
    Ok(if written {
        FencedWrite::Written
    } else {
        FencedWrite::Stale { highest }
    })
}

/// The result of [`fenced_claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceClaim {
    /// Claimed: the resource's highest token is now this token, and every later write or claim
    /// with a lower one is refused.
    Claimed,
    /// Refused: the resource has seen `highest`, above the claimer's token.
    Stale {
        /// The highest token the resource has seen.
        highest: FencingToken,
    },
}

impl FenceClaim {
    /// Whether the claim stands: `false` means a newer holder claimed or wrote first, and the
    /// claimer must not act.
    pub fn is_claimed(&self) -> bool {
        matches!(self, FenceClaim::Claimed)
    }

    /// The highest token the resource had seen, when the claim was refused.
    pub fn stale_by(&self) -> Option<FencingToken> {
        match self {
            FenceClaim::Claimed => None,
            FenceClaim::Stale { highest } => Some(*highest),
        }
    }
}

/// Claims the resource behind `data_key` on your own Redis for `token`: raises its highest
/// token seen (the one [`fenced_set`] keeps at `"{data_key}:fence"`) to `token` without writing
/// any data, if no higher token claimed or wrote before. From then on every [`fenced_set`] and
/// every claim with a lower token is refused.
///
/// Call it right after acquiring, before any effect that must not happen twice: **claim, then
/// act**. Without the claim, a holder that was paused past its lease and wakes before the new
/// holder's first write is still accepted (the resource has not seen the newer token yet), and
/// both act. A claim may be repeated with the same token (a retry after a network error).
///
/// ```no_run
/// # async fn demo(conn: &mut quorumlock::redis::aio::MultiplexedConnection, lock: &quorumlock::Lock) -> redis::RedisResult<()> {
/// use quorumlock::{fenced_claim, fenced_set};
/// let claim = fenced_claim(conn, "{payout:42}", lock.token()).await?;
/// if !claim.is_claimed() {
///     return Ok(()); // a newer holder has the batch
/// }
/// // ... prepare the payout: an older holder waking now is refused ...
/// let write = fenced_set(conn, "{payout:42}", lock.token(), "paid").await?;
/// assert!(write.is_written() || write.stale_by().is_some());
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The connection's [`redis::RedisError`].
///
/// # Cancellation safety
///
/// Dropping the future may leave the claim sent; it is still checked on the server.
pub async fn fenced_claim<C: ConnectionLike + Send>(
    conn: &mut C,
    data_key: &str,
    token: FencingToken,
) -> redis::RedisResult<FenceClaim> {
    let (claimed, highest) = fenced_write(conn, data_key, token, None::<&str>).await?;
    Ok(if claimed {
        FenceClaim::Claimed
    } else {
        FenceClaim::Stale { highest }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_admits_equal_and_higher_tokens_only() {
        let gate = FenceGate::new();
        gate.admit(FencingToken::new(3)).unwrap();
        gate.admit(FencingToken::new(3)).unwrap();
        gate.admit(FencingToken::new(5)).unwrap();
        let err = gate.admit(FencingToken::new(4)).unwrap_err();
        assert_eq!(err.highest, FencingToken::new(5));
        assert_eq!(gate.highest(), FencingToken::new(5));
    }
}
