//! Acquisition: attempt rounds with retries, contention resolution (a split vote is undone and
//! re-tried), the fencing token chosen from the yes-answers (and lagging counters raised), and
//! the undo of a failed or cancelled attempt. The public entry points that wrap the result in a
//! guard are in `crate::lock::acquire`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Redlock;
use super::round::{Round, Tail, int_reply, positive};
use super::state::LockState;
use crate::core::clock::{self, Stamp};
use crate::core::keys::new_value;
use crate::core::quorum::{self, Acquisition};
use crate::core::timing;
use crate::core::token::{self, FencingToken};
use crate::error::{Error, FailureList, NodeFailure};
use crate::metrics;
use crate::node::scripts::{self, ScriptCall};
use crate::node::{HoldOut, Op};

/// How many extra rounds an acquisition makes, beyond its retries, to resolve contention:
/// rounds refused although no value stood on a quorum (contenders that started together split
/// the nodes). Each undoes its partial acquisition first, then pauses at random.
const CONTENTION_ROUNDS: u32 = 6;

/// How long an acquisition keeps trying: it gives up once it has made `rounds` attempt rounds
/// *and* the next one would start more than `wait` after the call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    pub(crate) rounds: u32,
    pub(crate) wait: Duration,
}

impl Redlock {
    /// Acquires `key` with this patience: the engine behind the public `try_acquire`,
    /// `acquire` and `acquire_timeout` (`crate::lock::acquire`), which wrap the state in a guard.
    pub(crate) async fn acquire_held(
        &self,
        key: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<Arc<LockState>, Error> {
        let drift = self.check(key, ttl)?;
        self.inner.max_ttl.observe(ttl);
        let called = Instant::now();
        let lock_key = self.keys().lock_key(key);
        let fence_key = self.keys().fence_key(key);
        let mut round_no = 0u32;
        let mut contention_rounds = 0u32;
        loop {
            round_no += 1;
            let value = new_value();
            // Armed before the first await: a cancelled or failed round is released everywhere.
            let undo = UndoRelease::arm(self, &lock_key, &fence_key, &value);
            let mut contended = false;
            let round_start = Instant::now();
            let result = self
                .attempt(
                    key,
                    &lock_key,
                    &fence_key,
                    &value,
                    ttl,
                    drift,
                    &mut contended,
                )
                .await;
            let err = match result {
                Ok((token, measured, validity, tail)) => {
                    undo.disarm();
                    metrics::acquire("acquired", called.elapsed());
                    let state = Arc::new(LockState::new(
                        key.to_owned(),
                        lock_key,
                        fence_key,
                        value,
                        token,
                        ttl,
                        measured.saturating_add(validity),
                    ));
                    self.settle(tail, true);
                    return Ok(state);
                }
                Err(e) => e,
            };
            if contended && contention_rounds < CONTENTION_ROUNDS {
                contention_rounds += 1;
                round_no -= 1;
                self.undo_split_vote(
                    key,
                    (&lock_key, &fence_key, &value),
                    round_start.elapsed(),
                    contention_rounds,
                )
                .await;
                undo.disarm();
                continue;
            }
            drop(undo);
            let delay = self.retry_pause();
            let give_up = !err.is_retryable()
                || (round_no >= patience.rounds
                    && called.elapsed().saturating_add(delay) > patience.wait);
            if give_up {
                metrics::acquire(super::outcome_label(&err), called.elapsed());
                return Err(err);
            }
            tracing::debug!(key, round = round_no, ?delay, error = %err, "retrying acquisition");
            tokio::time::sleep(delay).await;
        }
    }

    /// Nobody won a split vote: undo our part before anyone re-tries (awaited, so it has landed
    /// by the time our own pause starts), then pause at random for several round trips, so that
    /// one contender re-tries alone and finds the nodes free.
    async fn undo_split_vote(
        &self,
        key: &str,
        (lock_key, fence_key, value): (&str, &str, &str),
        round_trip: Duration,
        contention_round: u32,
    ) {
        self.release_everywhere(lock_key, fence_key, value, 0).await;
        let spread = self.inner.cfg.retry_jitter.max(round_trip * 4);
        let delay = timing::retry_delay(round_trip, spread, rand::random::<f64>());
        tracing::debug!(
            key,
            round = contention_round,
            ?delay,
            "contenders split the nodes; undone, re-trying"
        );
        tokio::time::sleep(delay).await;
    }

    /// One attempt round: the acquire script on every node, then (rarely) a raise of the fencing
    /// counters. Returns the token, the instant its validity counts from (the end of the round, on
    /// the deadline clock) and the validity.
    /// `contended` is set when the round was refused but no value can stand on a quorum
    /// (contenders split the nodes).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn attempt(
        &self,
        key: &str,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        ttl: Duration,
        drift: Duration,
        contended: &mut bool,
    ) -> Result<(FencingToken, Stamp, Duration, Tail), Error> {
        metrics::attempt();
        let start = Instant::now();
        let started = clock::now();
        // The nodes are told whole milliseconds: the validity counts only what they were told.
        let (ttl_ms, sent) = timing::sent_ttl(ttl);
        let budget_end = start + timing::budget(sent, drift);
        let deadline = start + timing::acquire_round(self.inner.cfg.node_timeout, sent, drift);
        let fencing = self.inner.cfg.fencing;
        let legacy = self.keys().legacy_fence_key(key);
        let call = acquire_call(
            fencing,
            (lock_key, fence_key, legacy.as_deref()),
            value,
            ttl_ms,
        );
        let round = self
            .round(
                Arc::new(call),
                deadline,
                None,
                HoldOut::Respect,
                Op::Acquire,
                positive,
            )
            .await;
        match quorum::acquisition(round.verdict, || round.refusal()) {
            Acquisition::Won => {}
            Acquisition::Held { contended: split } => {
                *contended = split;
                tracing::debug!(
                    key,
                    yes = round.tally.yes(),
                    refused = round.tally.no(),
                    held = round.held_by_other(),
                    failed = round.tally.failed(),
                    contended = split,
                    "lock held by another owner"
                );
                return Err(self.held(key, round.held_by_other()));
            }
            Acquisition::Unreachable => return Err(self.unreachable(key, round)),
        }
        if self.inner.outage.swap(false, Ordering::Relaxed) {
            tracing::info!(key, "a quorum of nodes answers again");
        }
        let counters: Vec<u64> = if fencing {
            round.yes.iter().map(|&(_, c)| c.max(0) as u64).collect()
        } else {
            vec![0; round.yes.len()]
        };
        let Some((max, settled)) = token::fencing_max(&counters, self.inner.nodes.len()) else {
            return Err(self.no_quorum(key, &round.tally, round.failures));
        };
        if !settled {
            self.raise_fence(key, lock_key, fence_key, value, max, &round.yes, budget_end)
                .await?;
        }
        self.grant(
            key,
            FencingToken::new(max),
            round,
            started,
            (ttl, sent, drift),
        )
    }

    /// The end of a won round: the lock is granted if validity is left, counted from now (the
    /// end of the round, on the deadline clock).
    fn grant(
        &self,
        key: &str,
        token: FencingToken,
        round: Round,
        started: Stamp,
        (ttl, sent, drift): (Duration, Duration, Duration),
    ) -> Result<(FencingToken, Stamp, Duration, Tail), Error> {
        let now = clock::now();
        let elapsed = now.saturating_duration_since(started);
        let Some(validity) = timing::validity(sent, elapsed, drift) else {
            tracing::warn!(key, ?elapsed, ?ttl, "quorum reached but no validity left");
            return Err(Error::ValidityExpired {
                key: key.to_owned(),
                elapsed,
                ttl,
            });
        };
        tracing::debug!(
            key,
            %token,
            yes = round.tally.yes(),
            no = round.tally.no(),
            failed = round.tally.failed(),
            ?elapsed,
            ?validity,
            "lock acquired"
        );
        // The deadline is `start + ttl − drift`: counted from the start, elapsed would count
        // twice.
        Ok((token, now, validity, round.rest))
    }

    /// The error of a round that could not reach a quorum for lack of answers: warned once per
    /// outage (the first such round), then logged at debug level until a quorum answers again.
    fn unreachable(&self, key: &str, round: Round) -> Error {
        let failures = FailureList(&round.failures);
        let t = &round.tally;
        if self.inner.outage.swap(true, Ordering::Relaxed) {
            tracing::debug!(key, yes = t.yes(), no = t.no(), failed = t.failed(), %failures, "too few nodes reachable to acquire");
        } else {
            tracing::warn!(key, yes = t.yes(), no = t.no(), failed = t.failed(), %failures, "too few nodes reachable to acquire; further failed rounds are logged at debug level until a quorum answers again");
        }
        self.no_quorum(key, &round.tally, round.failures)
    }

    /// Brings the counters of the yes-nodes below `max` up to it, so that a quorum stands at the
    /// token (only after different majorities won earlier rounds).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn raise_fence(
        &self,
        key: &str,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        max: u64,
        yes: &[(usize, i64)],
        budget_end: Instant,
    ) -> Result<(), Error> {
        let token = max.to_string();
        let call = Arc::new(scripts::RAISE_FENCE.call(
            &[lock_key.as_bytes(), fence_key.as_bytes()],
            &[value.as_bytes(), token.as_bytes()],
        ));
        let deadline = (Instant::now() + self.inner.cfg.node_timeout).min(budget_end);
        let at_max = yes.iter().filter(|&&(_, c)| c.max(0) as u64 == max).count();
        let raises = yes
            .iter()
            .filter(|&&(_, c)| (c.max(0) as u64) < max)
            .map(|&(i, _)| {
                let fut = Arc::clone(&self.inner.nodes[i]).run(
                    Arc::clone(&call),
                    deadline,
                    HoldOut::Respect,
                    Op::Raise,
                );
                async move { (i, fut.await) }
            });
        let mut raised = 0;
        let mut failures = Vec::new();
        for (i, r) in futures::future::join_all(raises).await {
            match r.and_then(int_reply) {
                Ok(1) => raised += 1,
                Ok(_) => {}
                Err(cause) => failures.push(NodeFailure {
                    node: self.inner.nodes[i].name().to_owned(),
                    cause,
                }),
            }
        }
        tracing::debug!(key, token = max, at_max, raised, "raised fencing counters");
        if token::raised_to_quorum(at_max, raised, self.node_count()) {
            Ok(())
        } else {
            tracing::warn!(
                key,
                token = max,
                at_max,
                raised,
                "could not bring a quorum to the fencing token"
            );
            Err(Error::NoQuorum {
                key: key.to_owned(),
                reached: at_max + raised,
                nodes: self.node_count(),
                needed: self.quorum(),
                failures,
            })
        }
    }
}

/// The acquire call: the acquire-and-fence script, or a plain `SET NX PX` with fencing off.
/// With fencing on, the script is also given the lock's per-name counter of the layout before
/// buckets (`legacy`), which it folds into the bucket.
fn acquire_call(
    fencing: bool,
    (lock_key, fence_key, legacy): (&str, &str, Option<&str>),
    value: &str,
    ttl_ms: u64,
) -> ScriptCall {
    let ttl_ms = ttl_ms.to_string();
    if fencing && let Some(legacy) = legacy {
        scripts::ACQUIRE.call(
            &[lock_key.as_bytes(), fence_key.as_bytes(), legacy.as_bytes()],
            &[value.as_bytes(), ttl_ms.as_bytes()],
        )
    } else {
        let mut set = redis::cmd("SET");
        set.arg(lock_key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(&ttl_ms);
        ScriptCall::plain(set)
    }
}

/// Releases an attempt's value everywhere when dropped, unless disarmed: covers both a failed
/// round and a caller that drops the acquire future midway.
struct UndoRelease<'a> {
    client: &'a Redlock,
    lock_key: &'a str,
    fence_key: &'a str,
    value: &'a str,
    armed: bool,
}

impl<'a> UndoRelease<'a> {
    pub(super) fn arm(
        client: &'a Redlock,
        lock_key: &'a str,
        fence_key: &'a str,
        value: &'a str,
    ) -> Self {
        UndoRelease {
            client,
            lock_key,
            fence_key,
            value,
            armed: true,
        }
    }

    pub(super) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for UndoRelease<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client
                .spawn_release(self.lock_key, self.fence_key, self.value, 0);
        }
    }
}
