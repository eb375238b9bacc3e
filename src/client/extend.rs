//! Extension of a held lock: one round, ending at the lock's deadline at the latest, whose
//! verdict the pure [`crate::core::timing::extension`] maps to extended, lost or unreachable.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::Engine;
use super::round::Round;
use super::state::{LockState, Seen, SeenAt};
use crate::core::clock::{self, Stamp};
use crate::core::keys::LockKeys;
use crate::core::quorum::Tally;
use crate::core::timing::{self, Extension};
use crate::core::token::FencingToken;
use crate::error::{Error, FailureList, LostReason, NodeFailure};
use crate::metrics;
use crate::node::Op;
use crate::node::scripts;

impl Engine {
    /// Extends a held lock to `ttl` from now on a quorum; returns the new validity.
    ///
    /// Rounds of one lock are serialised with its release: no extension is sent once the
    /// release has begun, so none can re-set a key the release removed.
    ///
    /// The round ends at the lock's deadline at the latest, and its gate closes then: no call
    /// is sent (or re-sent as `EVAL`) after the deadline, and a quorum that has not answered by
    /// then makes the lock lost (`Expired`), never extended. A holder told `Ok` held the lock
    /// without a gap. (Calls sent before the deadline may still land later; the EXTEND script
    /// refuses to re-create a key that someone else may have held since: `scripts::EXTEND`.)
    ///
    /// It runs in a `quorumlock.extend` span (key, ttl, token, outcome, the validity earned);
    /// the unanswered calls it leaves to a task run in the caller's span.
    pub(crate) async fn extend_held(
        &self,
        state: &Arc<LockState>,
        ttl: Duration,
    ) -> Result<Duration, Error> {
        let caller = tracing::Span::current();
        let span = tracing::info_span!(
            "quorumlock.extend",
            key = state.key(),
            ttl_ms = super::millis(ttl),
            token = state.token().get(),
            outcome = Empty,
            validity_ms = Empty,
        );
        let outcome = super::SpanOutcome::new(&span);
        let result = self
            .extend_round(state, ttl, &caller)
            .instrument(span.clone())
            .await;
        if let Ok(validity) = &result {
            span.record("validity_ms", super::millis(*validity));
        }
        outcome.finish(&result, "extended");
        result
    }

    /// The round of [`extend_held`](Self::extend_held); what it leaves to a task runs in
    /// `caller`'s span.
    async fn extend_round(
        &self,
        state: &Arc<LockState>,
        ttl: Duration,
        caller: &tracing::Span,
    ) -> Result<Duration, Error> {
        let drift = self.check(state.key(), ttl)?;
        let _serial = state.serial().await;
        // After the acquisition's own calls on every node (`LockState::until_handed`).
        state.until_handed().await;
        if state.is_released() {
            return Err(Error::Lost {
                key: state.key().to_owned(),
                reason: LostReason::Released,
            });
        }
        if state.deadline() <= clock::now() {
            return Err(state.lose(LostReason::Expired));
        }
        self.inner.max_ttl.observe(ttl);
        let start = Instant::now();
        let started = clock::now();
        // The nodes are told whole milliseconds: the validity counts only what they were told.
        let (ttl_ms, sent) = timing::sent_ttl(ttl);
        let budget = timing::budget(sent, drift);
        // Whatever this round's outcome, a node that applies it expires the key `ttl` after
        // receiving it, no earlier than `budget` after `started`: a shorter ttl than what is
        // left moves the deadline back now, before anything is sent.
        state.lower_deadline(started.saturating_add(budget));
        let lock_deadline = state.deadline();
        let length = timing::extend_round(
            self.inner.cfg.node_timeout,
            budget,
            lock_deadline.saturating_duration_since(started),
        );
        let deadline = start + length;
        // Calls queued behind this client's earlier ones wait on while their node answers
        // those, never past the lock's deadline (nor the new ttl's budget).
        let cap = start + budget.min(lock_deadline.saturating_duration_since(started));
        let call = extend_call(state, ttl_ms, self.inner.cfg.keys.is_compat());
        let round = self
            .round(
                Arc::new(call),
                deadline,
                cap,
                Some(lock_deadline),
                Op::Extend,
                &[],
            )
            .await;
        let decided = clock::now();
        // The calls already queued must reach their nodes: dropped, a queued command may be
        // skipped, and a node would keep its old expiry (a later one, for a shorter ttl). Calls
        // still waiting for a connection are not sent at all: sent late, after the release,
        // one could re-set the key.
        let Round {
            verdict,
            tally,
            failures,
            rest,
            ..
        } = round;
        self.settle(rest, true, caller);
        let elapsed = decided.saturating_duration_since(started);
        let validity = timing::validity(sent, elapsed, drift);
        let outcome = timing::extension(verdict, decided < lock_deadline, validity);
        // A refusal by a quorum: a revoke leaves a marker with our value that tells it apart.
        let revoked = matches!(outcome, Extension::NotOwner)
            && !self.inner.cfg.keys.is_compat()
            && self.was_revoked(state.lock_key(), state.value()).await;
        self.conclude(
            state,
            outcome,
            Answers {
                tally,
                failures,
                revoked,
            },
            decided,
            elapsed,
            ttl,
        )
    }

    /// What an extension round's outcome does to the lock and tells the caller.
    fn conclude(
        &self,
        state: &LockState,
        outcome: Extension,
        Answers {
            tally,
            failures,
            revoked,
        }: Answers,
        decided: Stamp,
        elapsed: Duration,
        ttl: Duration,
    ) -> Result<Duration, Error> {
        let key = state.key();
        // A refusal by a node's ACL is named if the lock is lost at its deadline.
        state.note_extension(matches!(outcome, Extension::Extended(_)), &failures);
        match outcome {
            Extension::Extended(validity) => {
                // Validity counts from the verdict, the end of the round (`start + ttl − drift`).
                if !state.set_deadline(decided.saturating_add(validity)) {
                    // Lost meanwhile (the deadline passed since the verdict, or a watcher saw
                    // the lock lost): it stays lost.
                    return Err(Error::Lost {
                        key: key.to_owned(),
                        reason: state.reason().unwrap_or(LostReason::Expired),
                    });
                }
                state.set_ttl(ttl);
                tracing::debug!(key, ?validity, yes = tally.yes(), "lock extended");
                Ok(validity)
            }
            Extension::TooSlow => {
                metrics::extension_failed("too_slow");
                Err(Error::ValidityExpired {
                    key: key.to_owned(),
                    elapsed,
                    ttl,
                })
            }
            // Only when the refusals alone rule out a quorum: refusals mixed with failures leave
            // a valid lock held (the caller, or keep-alive, tries again while validity remains).
            Extension::NotOwner if revoked => {
                metrics::extension_failed("revoked");
                tracing::warn!(key, "lock lost: it was revoked");
                Err(state.lose(LostReason::Revoked))
            }
            Extension::NotOwner => {
                metrics::extension_failed("not_owner");
                let reason = LostReason::NotOwner {
                    owned: tally.yes(),
                    needed: self.quorum(),
                };
                Err(state.lose(reason))
            }
            Extension::Expired => {
                metrics::extension_failed("expired");
                tracing::warn!(
                    key,
                    yes = tally.yes(),
                    failures = %FailureList(&failures),
                    "lock lost: its deadline passed before an extension reached a quorum"
                );
                Err(state.lose(LostReason::Expired))
            }
            Extension::Unreachable => {
                metrics::extension_failed("unreachable");
                // The keep-alive task warns once per outage (lease.rs).
                tracing::debug!(key, failures = %FailureList(&failures), "extension could not reach a quorum");
                Err(self.no_quorum(key, &tally, failures))
            }
        }
    }
}

/// The resume's extension round call: token 0 and the lean argument, so `PEXPIRE` where our
/// value stands, `0` elsewhere; the counter is never read (one key, so a Redis Cluster member
/// and a key-limited ACL take it too).
fn resume_call(keys: &LockKeys, value: &str, ttl_ms: u64) -> scripts::ScriptCall {
    let mut digits = itoa::Buffer::new();
    scripts::EXTEND.call(
        &[keys.lock().as_bytes()],
        &[
            value.as_bytes(),
            digits.format(ttl_ms).as_bytes(),
            b"0",
            b"1",
        ],
    )
}

/// An extension round's answers, as its outcome reads them.
struct Answers {
    tally: Tally,
    failures: Vec<NodeFailure>,
    /// A refusal by a quorum came from a revoke (its marker holds our value).
    revoked: bool,
}

/// The extension of a held lock: the EXTEND script, and, on the nodes whose counter was seen at
/// the token on the connection the call runs on ([`LockState::seen`]), its lean form (a fourth
/// argument), which does not read the counter where our key is present (`scripts::EXTEND`).
///
/// In compat mode the call names the lock key only, as other Redlock clients' extensions do
/// (an ACL limited to the resource key is enough): token 0 and the lean argument, with which
/// the script never touches a second key.
fn extend_call(state: &LockState, ttl_ms: u64, compat: bool) -> scripts::ScriptCall {
    if compat {
        let mut ttl = itoa::Buffer::new();
        return scripts::EXTEND.call(
            &[state.lock_key().as_bytes()],
            &[
                state.value().as_bytes(),
                ttl.format(ttl_ms).as_bytes(),
                b"0",
                b"1",
            ],
        );
    }
    let keys: [&[u8]; 2] = [state.lock_key().as_bytes(), state.fence_key().as_bytes()];
    let mut ttl = itoa::Buffer::new();
    let mut token = itoa::Buffer::new();
    let args = [
        state.value().as_bytes(),
        ttl.format(ttl_ms).as_bytes(),
        token.format(state.token().get()).as_bytes(),
    ];
    let call = scripts::EXTEND.call(&keys, &args);
    let [value, ttl, token] = args;
    call.with_lean(&state.seen(), || {
        scripts::EXTEND.call(&keys, &[value, ttl, token, b"1"])
    })
}

impl Engine {
    /// Takes over a lock another process (or client) acquired, from its key, value and token:
    /// one extension round that counts only the nodes where `value` still stands, and that
    /// extends it there to `ttl`. It never re-sets an absent key and never raises a counter
    /// (the EXTEND script with token 0 and its lean argument, as compat mode's extension): so a
    /// lock resumes only if its value stands on a quorum, which no other acquisition can have
    /// followed (`docs/safety.md`, "Handing a lock over"). The resumed lock's later extensions
    /// and its release are those of any held lock, with `token`.
    ///
    /// Runs in a `quorumlock.resume` span (key, ttl, token, outcome).
    pub(crate) async fn resume_held(
        &self,
        key: &str,
        value: &str,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Arc<LockState>, Error> {
        let caller = tracing::Span::current();
        let span = tracing::info_span!(
            "quorumlock.resume",
            key,
            ttl_ms = super::millis(ttl),
            token = token.get(),
            outcome = Empty,
        );
        let outcome = super::SpanOutcome::new(&span);
        let result = self
            .resume_round(key, value, token, ttl, &caller)
            .instrument(span.clone())
            .await;
        outcome.finish(&result, "resumed");
        result
    }

    async fn resume_round(
        &self,
        key: &str,
        value: &str,
        token: FencingToken,
        ttl: Duration,
        caller: &tracing::Span,
    ) -> Result<Arc<LockState>, Error> {
        let drift = self.check(key, ttl)?;
        crate::core::value::check_value(value)?;
        self.inner.max_ttl.observe(ttl);
        let lock_keys = self.keys().lock_keys(key);
        let start = Instant::now();
        let started = clock::now();
        let (ttl_ms, sent) = timing::sent_ttl(ttl);
        let budget = timing::budget(sent, drift);
        let length = timing::extend_round(self.inner.cfg.node_timeout, budget, budget);
        let call = resume_call(&lock_keys, value, ttl_ms);
        let round = self
            .round(
                Arc::new(call),
                start + length,
                start + budget,
                None,
                Op::Extend,
                &[],
            )
            .await;
        let decided = clock::now();
        let Round {
            verdict,
            tally,
            failures,
            rest,
            ..
        } = round;
        self.settle(rest, true, caller);
        let elapsed = decided.saturating_duration_since(started);
        let validity = timing::validity(sent, elapsed, drift);
        match timing::extension(verdict, true, validity) {
            Extension::Extended(validity) => {
                tracing::debug!(key, ?validity, yes = tally.yes(), "lock resumed");
                let nothing_seen: Seen = std::iter::repeat_n(0, self.node_count()).collect();
                Ok(self.held_state(LockState::new(
                    lock_keys,
                    value.to_owned(),
                    token,
                    SeenAt::new(nothing_seen, []),
                    ttl,
                    decided.saturating_add(validity),
                )))
            }
            Extension::TooSlow => Err(Error::ValidityExpired {
                key: key.to_owned(),
                elapsed,
                ttl,
            }),
            Extension::NotOwner => Err(Error::Lost {
                key: key.to_owned(),
                reason: LostReason::NotOwner {
                    owned: tally.yes(),
                    needed: self.quorum(),
                },
            }),
            Extension::Expired | Extension::Unreachable => {
                Err(self.no_quorum(key, &tally, failures))
            }
        }
    }
}
