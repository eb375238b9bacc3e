//! Campaigning: attempts, standing by between them, and taking office.
//!
//! After a refused attempt a standby reads the lock's remaining time to live on every node and
//! sleeps until a quorum of them would have expired it (that is what makes crash handover take
//! about one ttl), and never longer than the poll interval (with jitter); a resign notice wakes
//! it at once. When its timer fires it reads the key's `PTTL` again (one command per node, at
//! most once a second) and attempts only once a quorum may be free: a leader that keeps its
//! term alive costs a standby no attempt and no fencing token. When that read shows a split vote (`LockStatus::is_split_vote`) it retries after the
//! short retry pause instead, up to [`SPLIT_ROUNDS`] times in a row.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::notices::{Fresh, Notice, wait_for};
use super::record::Record;
use super::{Election, SharedLock, Term};
use crate::client::status::LockStatus;
use crate::client::{SpanOutcome, millis, span_outcome};
use crate::core::clock;
use crate::error::{Error, FailureList, NodeError, NodeFailure};
use crate::lock::guard::Lock;

use super::leadership::Leadership;

/// Consecutive short retries a standby makes after split votes, before it falls back to
/// waiting as if a leader held the lock.
const SPLIT_ROUNDS: u32 = 8;

/// The state of one campaign.
#[derive(Debug, Default)]
struct Campaign {
    /// The last attempt's error.
    last: Option<Error>,
    /// Too few nodes answered the last attempt (logged once at warn).
    degraded: bool,
    /// Attempts made (the campaign span's `rounds`).
    attempts: u32,
    /// Short retries made in a row after split votes.
    split_rounds: u32,
    fresh: Fresh,
}

impl Election {
    /// Campaigns until this candidate leads, however long that takes.
    ///
    /// While another candidate leads, this one waits as a standby: it retries at once when the
    /// leader resigns (notified through every node), when the leader's lease would have expired
    /// on a quorum (a crashed leader), and at the latest every poll interval. Too few reachable
    /// nodes are logged at warn and retried every poll interval.
    ///
    /// One campaign per candidate at a time: a candidate that already leads and campaigns again
    /// waits like any standby until its current term ends.
    ///
    /// # Errors
    ///
    /// Only [`Error::InvalidArgument`] (the name or ttl cannot work with the lock client's
    /// configuration): every other failure is retried.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe. If dropped after winning but before returning, the term is resigned in the
    /// background (and otherwise ends with its ttl).
    pub async fn campaign(&self) -> Result<Leadership, Error> {
        self.campaign_until(None).await
    }

    /// Campaigns for at most `wait`, then gives up with the last attempt's error.
    ///
    /// The wait is a hard bound on standing by: the call returns within `wait` (cutting short
    /// a wait, an attempt or a status read in progress), except that the first attempt always
    /// runs to its end (one round, bounded by the lock client's node timeout: a zero `wait`
    /// makes one attempt), and that a won term is taken up (the leader record written and
    /// announced, each step bounded by the node timeout) before returning.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when another candidate still leads after `wait`, [`Error::NoQuorum`] when
    /// too few nodes were reachable, [`Error::InvalidArgument`] as for
    /// [`campaign`](Self::campaign).
    ///
    /// # Cancellation safety
    ///
    /// As [`campaign`](Self::campaign).
    pub async fn campaign_timeout(&self, wait: Duration) -> Result<Leadership, Error> {
        // A wait too long for the clock (`Duration::MAX`) is no bound at all.
        self.campaign_until(Instant::now().checked_add(wait)).await
    }

    /// A campaign in its `quorumlock.campaign` span (the election's name as `key`, ttl,
    /// attempts as `rounds`, outcome, token). The term's keep-alive runs in the caller's span,
    /// not in the campaign's, which ends when the call returns.
    async fn campaign_until(&self, give_up: Option<Instant>) -> Result<Leadership, Error> {
        let span = tracing::info_span!(
            "quorumlock.campaign",
            key = self.name(),
            ttl_ms = millis(self.inner.ttl),
            rounds = Empty,
            outcome = Empty,
            token = Empty,
        );
        let outcome = SpanOutcome::new(&span);
        let lock = match self.win(give_up).instrument(span.clone()).await {
            Ok(lock) => lock,
            Err(e) => {
                outcome.word(span_outcome(&e));
                return Err(e);
            }
        };
        // Kept alive in the caller's span: the campaign's ends when this call returns.
        lock.keep_alive();
        let leadership = self.take_office(lock).instrument(span.clone()).await;
        span.record("token", leadership.token.get());
        outcome.word("elected");
        Ok(leadership)
    }

    /// Attempts, standing by between them, until one wins or the campaign gives up.
    async fn win(&self, give_up: Option<Instant>) -> Result<Lock, Error> {
        // The receiver exists before the first attempt. The subscriptions come up in the
        // background; a resign before they do is caught by the status read or the poll.
        let mut notices = self.inner.observer.notices();
        let mut state = Campaign::default();
        match self.attempt(&mut state).await {
            Ok(lock) => Ok(lock),
            Err(e) if !e.is_retryable() => Err(e),
            Err(e) => {
                state.last = Some(e);
                let standing_by = self.stand_by(&mut notices, &mut state);
                let won = match give_up {
                    None => standing_by.await,
                    Some(end) => match tokio::time::timeout_at(end, standing_by).await {
                        Ok(won) => won,
                        Err(_) => Err(state.last.take().unwrap_or_else(|| self.silent(end))),
                    },
                };
                won.inspect_err(|e| {
                    tracing::debug!(election = %self.name(), error = %e, "campaign gave up");
                })
            }
        }
    }

    /// Waits and attempts again until an attempt wins or fails for good. `state.last` holds the
    /// last attempt's error throughout (the caller's error if it gives up midway).
    async fn stand_by(
        &self,
        notices: &mut broadcast::Receiver<Notice>,
        state: &mut Campaign,
    ) -> Result<Lock, Error> {
        loop {
            let next = match &state.last {
                Some(Error::Held { .. }) => self.next_attempt_while_held(state).await,
                Some(Error::NoQuorum { .. }) => Instant::now() + self.inner.observer.poll_pause(),
                _ => Instant::now() + self.locks().engine().retry_pause(),
            };
            #[cfg(feature = "testkit")]
            self.inner.standbys.send_modify(|n| *n += 1);
            self.until_free(notices, state, next).await;
            match self.attempt(state).await {
                Ok(lock) => return Ok(lock),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => state.last = Some(e),
            }
        }
    }

    /// Waits until `next`, or a resign notice; then, while a leader held the lock at the last
    /// attempt and no notice came, reads the lock's key on every node (`PTTL`, one command
    /// each) and waits again until a quorum may have let it expire, at most a second at a
    /// time: a standby attempts (and moves the fencing counter) only when the term may be
    /// over, as lock waiters do (`client/wait.rs`).
    async fn until_free(
        &self,
        notices: &mut broadcast::Receiver<Notice>,
        state: &mut Campaign,
        mut next: Instant,
    ) {
        let key = self.locks().engine().keys().lock_key(self.name());
        loop {
            let fresh = &mut state.fresh;
            let notified = wait_for(notices, next, |n| {
                fresh.first_copy(n) && !matches!(n, Notice::Elected { .. })
            })
            .await;
            if notified || !matches!(state.last, Some(Error::Held { .. })) {
                return;
            }
            match self.locks().engine().holder_pause(&key).await {
                Some(pause) if !pause.is_zero() => {
                    tracing::trace!(election = %self.name(), ?pause, "the leader's term goes on; standing by");
                    next = Instant::now() + pause;
                }
                _ => return,
            }
        }
    }

    /// One attempt, logging changes between a reachable and an unreachable quorum.
    async fn attempt(&self, state: &mut Campaign) -> Result<Lock, Error> {
        let name = self.name();
        state.attempts += 1;
        tracing::Span::current().record("rounds", state.attempts);
        let result = self.locks().try_acquire(name, self.inner.ttl).await;
        match &result {
            Ok(_) | Err(Error::Held { .. }) if state.degraded => {
                tracing::info!(election = %name, "a quorum of nodes is reachable again");
                state.degraded = false;
            }
            Err(e @ Error::NoQuorum { .. }) => {
                if state.degraded {
                    tracing::debug!(election = %name, error = %e, "still too few nodes to campaign");
                } else {
                    tracing::warn!(election = %name, candidate = %self.candidate(), error = %e, "too few nodes reachable to campaign; nobody can lead until a quorum is back");
                    state.degraded = true;
                }
            }
            _ => {}
        }
        result
    }

    /// The error of a bounded campaign whose first attempt could not be followed by another
    /// before the end (not expected: the first attempt's error is normally kept).
    fn silent(&self, end: Instant) -> Error {
        let waited = end.elapsed();
        let failures = self
            .locks()
            .node_names()
            .into_iter()
            .map(|node| NodeFailure {
                node,
                cause: NodeError::Timeout(waited),
            })
            .collect::<Vec<_>>();
        Error::NoQuorum {
            key: self.name().to_owned(),
            reached: 0,
            nodes: failures.len(),
            needed: self.locks().quorum(),
            failures,
        }
    }

    /// After an attempt found the lock held: when a quorum of nodes will have let the current
    /// term expire (plus a random pause), but no later than the poll interval; after a split
    /// vote, the short retry pause (up to [`SPLIT_ROUNDS`] times in a row).
    async fn next_attempt_while_held(&self, state: &mut Campaign) -> Instant {
        let name = self.name();
        let status = self.locks().status(name).await;
        let now = Instant::now();
        if let Ok(s) = &status
            && s.is_split_vote()
            && state.split_rounds < SPLIT_ROUNDS
        {
            state.split_rounds += 1;
            tracing::debug!(election = %name, round = state.split_rounds, "no candidate holds a quorum (a split vote); retrying after a short pause");
            return now + self.locks().engine().retry_pause();
        }
        state.split_rounds = 0;
        let poll = now + self.inner.observer.poll_pause();
        let free_in = status.ok().and_then(|s| free_in(&s));
        tracing::debug!(election = %name, ?free_in, "another candidate leads; standing by");
        match free_in {
            // `d` comes from the nodes' PTTL: a foreign key with an absurd ttl must not
            // overflow the clock.
            Some(d) => (clock::tokio_after(now, d) + self.locks().engine().retry_pause()).min(poll),
            None => poll,
        }
    }

    /// Test support (feature `testkit`; not a stable API): waits until campaigns on this
    /// election (this handle and its clones) have gone back to standing by at least `n` times
    /// in all. A campaign stands by after every attempt that did not win, once it has read the
    /// lock's state and computed its next attempt: a resign announced after this resolves
    /// wakes it (if its subscriptions are up).
    #[cfg(feature = "testkit")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
    #[doc(hidden)]
    pub async fn wait_standing_by(&self, n: u64) {
        let mut rx = self.inner.standbys.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// How many times campaigns on this election have gone back to standing by (see
    /// [`wait_standing_by`](Self::wait_standing_by)).
    #[cfg(feature = "testkit")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
    #[doc(hidden)]
    pub fn standing_by_count(&self) -> u64 {
        *self.inner.standbys.borrow()
    }

    /// Takes office with a won term's lock, already kept alive by the caller.
    async fn take_office(&self, lock: Lock) -> Leadership {
        let lost = lock.lost_token();
        let token = lock.token();
        let shared: SharedLock = Arc::new(Mutex::new(Some(lock)));
        *self.term() = Some(Term {
            token,
            lost: lost.clone(),
            lock: Arc::clone(&shared),
        });
        let leading = crate::metrics::Leading::start(self.name());
        let term = Arc::clone(&shared);
        leading.watch(lost.clone(), move || {
            crate::core::lock(&term).as_ref().is_some_and(Lock::is_lost)
        });
        // The guard exists before the next await: a cancelled campaign resigns through its Drop.
        let mut leadership = Leadership {
            election: self.clone(),
            lock: shared,
            token,
            lost,
            record: None,
            since: std::time::Instant::now(),
            leading,
        };
        leadership.record = self.publish_record(&leadership).await;
        tracing::info!(election = %self.name(), candidate = %self.candidate(), %token, "elected leader");
        leadership
    }

    /// Writes the leader record on every node that holds our lock value, then announces the
    /// term. Returns the record (`None` when our lock value could not be confirmed, so none
    /// was written).
    async fn publish_record(&self, leadership: &Leadership) -> Option<Record> {
        let sh = &*self.inner.observer.shared;
        let token = leadership.token;
        let record = match leadership.own_value() {
            Some(value) => {
                let record = Record {
                    value,
                    token,
                    candidate: self.candidate().to_owned(),
                };
                let replies = sh.keys.write(sh.locks.engine(), &record).await;
                let written = replies.answers().filter(|&&r| r == 1).count();
                if written == 0 {
                    tracing::warn!(election = %sh.name, %token, failures = %FailureList(&replies.failures()), "could not write the leader record on any node; readers will not know this leader's id");
                } else {
                    tracing::debug!(election = %sh.name, %token, written, "leader record written");
                }
                // Kept even if no node confirmed it: resign deletes it wherever it landed.
                Some(record)
            }
            None => {
                tracing::warn!(election = %sh.name, %token, "could not confirm this term's lock value on a quorum; no leader record written, readers will not know this leader's id");
                None
            }
        };
        let message = Notice::elected(token, self.candidate());
        sh.keys.publish(sh.locks.engine(), &message).await;
        record
    }
}

/// How long until a quorum of the nodes that answered no longer holds the key (absent keys count
/// as free now); `None` when fewer than a quorum answered or the key never expires.
fn free_in(status: &LockStatus) -> Option<Duration> {
    let mut free: Vec<Duration> = status
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok())
        .filter_map(|s| match (&s.value, s.ttl) {
            (None, _) => Some(Duration::ZERO),
            (Some(_), ttl) => ttl,
        })
        .collect();
    free.sort();
    free.get(status.quorum.checked_sub(1)?).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::tests::{down, node, status};

    #[test]
    fn free_in_is_the_quorum_th_shortest_ttl() {
        let s = status(vec![
            node(Some("v"), Some(900), 3),
            node(None, None, 3),
            node(Some("v"), Some(500), 3),
            node(Some("v"), Some(700), 3),
            down(),
        ]);
        // Free now on one node, after 500 ms on a second, after 700 ms on a third (the quorum).
        assert_eq!(free_in(&s), Some(Duration::from_millis(700)));
        let two_answered = status(vec![
            node(None, None, 0),
            node(None, None, 0),
            down(),
            down(),
            down(),
        ]);
        assert_eq!(free_in(&two_answered), None);
        // A key without expiry never frees.
        let forever = status(vec![node(Some("v"), None, 1); 3]);
        assert_eq!(free_in(&forever), None);
    }

    #[test]
    fn a_split_vote_is_a_vacant_view_from_a_quorum() {
        let split = status(vec![
            node(Some("x"), Some(900), 1),
            node(Some("x"), Some(900), 1),
            node(Some("y"), Some(900), 1),
            node(None, None, 1),
            node(None, None, 1),
        ]);
        assert!(split.is_split_vote());
        let held = status(vec![
            node(Some("x"), Some(900), 1),
            node(Some("x"), Some(900), 1),
            node(Some("x"), Some(900), 1),
            node(None, None, 1),
            down(),
        ]);
        assert!(!held.is_split_vote());
        // The holder may stand on the node not reached: not a split.
        let partial = status(vec![
            down(),
            node(Some("x"), Some(900), 1),
            node(Some("x"), Some(900), 1),
            node(None, None, 1),
            node(None, None, 1),
        ]);
        assert!(!partial.is_split_vote());
    }
}
