//! Checking a fencing token against the lock nodes: [`Redlock::is_current`](crate::Redlock::is_current),
//! [`Redlock::check_token`](crate::Redlock::check_token) and [`TokenCheck`].

use super::Engine;
use super::status::LockStatus;
use crate::core::quorum::HolderView;
use crate::core::token::FencingToken;
use crate::error::{ConfigError, Error};

/// What a quorum of lock nodes says about a fencing token, from [`Redlock::check_token`](crate::Redlock::check_token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenCheck {
    /// The key is held on a quorum and the highest counter read is exactly this token: no
    /// later acquisition or revoke has happened.
    Current,
    /// A counter above the token: a later holder, or a revoke ([`Redlock::revoke`](crate::Redlock::revoke)). (The
    /// counter is shared by the keys of one Redis Cluster hash slot and a refused contender
    /// may raise it, so a current holder can read as superseded too: the check errs on the
    /// side of refusing.)
    Superseded {
        /// The highest counter read.
        highest: FencingToken,
    },
    /// Nobody holds the key on a quorum (released, expired or revoked), or the nodes that did
    /// not answer could make a quorum for some value: it cannot be shown to stand.
    NotHeld {
        /// The highest counter read.
        highest: FencingToken,
    },
    /// The token is above every counter read: no acquisition of the key handed it out.
    NeverIssued {
        /// The highest counter read.
        highest: FencingToken,
    },
}

impl TokenCheck {
    /// Whether the token is current: the only answer on which a resource may act.
    pub fn is_current(&self) -> bool {
        matches!(self, TokenCheck::Current)
    }

    /// The verdict of one read (pure): see the variants.
    pub(crate) fn of(status: &LockStatus, token: FencingToken) -> Self {
        let highest = status.max_fence();
        if highest > token {
            TokenCheck::Superseded { highest }
        } else if highest < token {
            TokenCheck::NeverIssued { highest }
        } else if matches!(status.holder_view(), HolderView::Held(_)) {
            TokenCheck::Current
        } else {
            TokenCheck::NotHeld { highest }
        }
    }
}

impl Engine {
    /// The engine side of [`Redlock::is_current`](crate::Redlock::is_current).
    pub(crate) async fn is_current(&self, key: &str, token: FencingToken) -> Result<bool, Error> {
        Ok(self.check_token(key, token).await?.is_current())
    }

    /// The engine side of [`Redlock::check_token`](crate::Redlock::check_token).
    pub(crate) async fn check_token(
        &self,
        key: &str,
        token: FencingToken,
    ) -> Result<TokenCheck, Error> {
        if !self.fencing() {
            return Err(ConfigError::FencingRequired.into());
        }
        let mut status = self.status(key).await?;
        // A node that counts toward no quorum (restarted and not yet repaired, within its
        // hold-out, a second URL of one server) may have lost the counter that supersedes the
        // token: its answer neither confirms nor denies.
        for (node, answer) in self.inner.nodes.iter().zip(&mut status.nodes) {
            if let (Some(why), Ok(_)) = (node.held_out(), &answer.state) {
                answer.state = Err(why);
            }
        }
        status.require_quorum()?;
        Ok(TokenCheck::of(&status, token))
    }
}
