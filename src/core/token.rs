//! Token choice: the [`FencingToken`] type, which counter a round's token is, and whether the
//! counters that lag behind it were raised on enough nodes. Pure: see [`crate::core`].

use std::fmt;

use super::quorum::quorum;

/// A fencing token: a number handed out with every acquisition of a key.
///
/// # Guarantee
///
/// A token is strictly greater than the token of every earlier holder of the same key, as long
/// as no node lost its counters: the nodes persist with `appendfsync always`, or a node that
/// restarted empty is seen restarting by the client's [`RestartGuard`](crate::RestartGuard)
/// (on by default), which keeps it out of quorums until its counters are restored from the
/// other nodes. With the guard off, a restart delayed past the ttl protects the lock but not the
/// counters. The argument, and its limits, are in `docs/safety.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token, e.g. one read back from storage or from `REDLOCK_TOKEN`.
    pub const fn new(raw: u64) -> Self {
        FencingToken(raw)
    }

    /// The raw number, to store beside the data it protects.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The token a fencing counter's reply (an `INCR`) stands for; a negative reply (none
    /// of a node's) reads as 0.
    pub(crate) const fn of_counter(counter: i64) -> Self {
        if counter > 0 {
            FencingToken(counter as u64)
        } else {
            FencingToken(0)
        }
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// The fencing token of a round: the largest counter among the nodes that said yes, and whether
/// a quorum of them already stands at it (if not, the lower ones must be raised).
pub(crate) fn fencing_max(counters: &[FencingToken], n: usize) -> Option<(FencingToken, bool)> {
    let max = *counters.iter().max()?;
    let at_max = counters.iter().filter(|&&c| c == max).count();
    Some((max, at_max >= quorum(n)))
}

/// Whether a round's token stands on a quorum after the raise: `at_max` yes-nodes already had
/// the token, `raised` more were brought up to it, out of `n` configured nodes.
pub(crate) fn raised_to_quorum(at_max: usize, raised: usize, n: usize) -> bool {
    at_max + raised >= quorum(n)
}
