//! The election's notices: a pub/sub channel on every node carrying `"elected <token> <id>"`
//! after a new leader wrote its record and `"resigned <token> <id>"` after a resign released the
//! lock. Each election subscribes on every node (one pub/sub connection per node, opened by the
//! node with the lock's certificates and TCP settings, checked with a `PING` every 2 s and made
//! again with backoff when it breaks or stops answering), so that a standby retries the moment
//! the leader resigns; the copies of a notice from several nodes are told apart by token.

use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::client::side::Heard;
use crate::core::token::FencingToken;
use crate::lock::redlock::Redlock;

/// A message on an election's channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    Elected {
        token: FencingToken,
        candidate: String,
    },
    Resigned {
        token: FencingToken,
        candidate: String,
    },
    /// A node's subscription was re-established: notifications may have been missed.
    Resubscribed,
}

impl Notice {
    pub(crate) fn elected(token: FencingToken, candidate: &str) -> String {
        format!("elected {token} {candidate}")
    }

    pub(crate) fn resigned(token: FencingToken, candidate: &str) -> String {
        format!("resigned {token} {candidate}")
    }

    fn parse(payload: &str) -> Option<Notice> {
        let mut parts = payload.splitn(3, ' ');
        let kind = parts.next()?;
        let token = FencingToken::new(parts.next()?.parse().ok()?);
        let candidate = parts.next().unwrap_or_default().to_owned();
        match kind {
            "elected" => Some(Notice::Elected { token, candidate }),
            "resigned" => Some(Notice::Resigned { token, candidate }),
            _ => None,
        }
    }
}

/// The subscriptions of one [`Election`]: a task per node, fanned into one broadcast channel.
pub(crate) struct Notifier {
    tx: broadcast::Sender<Notice>,
    _tasks: Vec<AbortOnDropHandle<()>>,
}

impl Notifier {
    /// Starts one subscription task per node of `locks` on `handle`.
    pub(crate) fn start(locks: &Redlock, channel: &str, handle: &tokio::runtime::Handle) -> Self {
        let (tx, _) = broadcast::channel(64);
        let sender = tx.clone();
        let heard = move |heard: Heard<'_>| {
            let notice = match heard {
                Heard::Message(payload) => Notice::parse(payload),
                Heard::Resubscribed => Some(Notice::Resubscribed),
            };
            if let Some(notice) = notice {
                let _ = sender.send(notice);
            }
        };
        let tasks = locks.engine().subscribe_everywhere(handle, channel, heard);
        Notifier { tx, _tasks: tasks }
    }

    /// A receiver of the notices from now on.
    pub(crate) fn subscribe_notices(&self) -> broadcast::Receiver<Notice> {
        self.tx.subscribe()
    }
}

/// Which notices are news: each is published on every node, so up to N copies arrive (and
/// copies of consecutive notices may interleave). Terms' tokens grow, so a notice is news when
/// its token is above the last one of its kind; a re-established subscription always is
/// (notices may have been missed).
#[derive(Debug)]
pub(crate) struct Fresh {
    elected: FencingToken,
    resigned: FencingToken,
}

impl Default for Fresh {
    fn default() -> Self {
        Fresh {
            elected: FencingToken::new(0),
            resigned: FencingToken::new(0),
        }
    }
}

impl Fresh {
    /// True for the first copy of a notice.
    pub(crate) fn first_copy(&mut self, notice: &Notice) -> bool {
        let seen = match notice {
            Notice::Elected { token, .. } => (&mut self.elected, *token),
            Notice::Resigned { token, .. } => (&mut self.resigned, *token),
            Notice::Resubscribed => return true,
        };
        if seen.1 > *seen.0 {
            *seen.0 = seen.1;
            true
        } else {
            false
        }
    }
}

/// Waits until `until`, or until a notice for which `wake` says yes (or notices were missed):
/// true when a notice (or missed notices) ended the wait, false when the time did.
pub(crate) async fn wait_for(
    notices: &mut broadcast::Receiver<Notice>,
    until: Instant,
    mut wake: impl FnMut(&Notice) -> bool,
) -> bool {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return false,
            notice = notices.recv() => match notice {
                Ok(n) if wake(&n) => return true,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return true,
                Err(broadcast::error::RecvError::Closed) => {
                    tokio::time::sleep_until(until).await;
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_keep_spaces_in_ids() {
        let t = FencingToken::new(7);
        assert_eq!(
            Notice::parse(&Notice::elected(t, "host a")),
            Some(Notice::Elected {
                token: t,
                candidate: "host a".to_owned()
            })
        );
        assert_eq!(
            Notice::parse(&Notice::resigned(t, "")),
            Some(Notice::Resigned {
                token: t,
                candidate: String::new()
            })
        );
        assert_eq!(Notice::parse("other 7 x"), None);
        assert_eq!(Notice::parse("elected x"), None);
    }

    #[test]
    fn only_the_first_copy_of_a_notice_is_news() {
        let mut fresh = Fresh::default();
        let elected = |token| Notice::Elected {
            token: FencingToken::new(token),
            candidate: String::new(),
        };
        assert!(fresh.first_copy(&elected(3)));
        assert!(!fresh.first_copy(&elected(3)));
        assert!(!fresh.first_copy(&elected(2)));
        assert!(fresh.first_copy(&Notice::Resigned {
            token: FencingToken::new(3),
            candidate: String::new()
        }));
        assert!(fresh.first_copy(&Notice::Resubscribed));
        assert!(fresh.first_copy(&Notice::Resubscribed));
    }
}
