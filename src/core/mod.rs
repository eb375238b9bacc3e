//! The pure core: every rule of the protocol that can be stated without I/O, so that it can be
//! property-tested and model-checked (`src/model/` calls these very functions).
//!
//! - [`quorum`]: the majority of N, folding answers into a verdict, refusals (held or contended),
//!   who a partial read shows as the holder;
//! - [`timing`]: drift, validity, round budgets and deadlines, extension outcomes, retry pauses;
//! - [`token`]: the [`FencingToken`](token::FencingToken) and which counter a round's token is;
//! - [`health`]: restart hold-outs, whether data survived, the restart guard's verdict, the
//!   eviction risk of a memory policy;
//! - [`repair`]: how many sources a repair needs, when it has read enough, its pacing;
//! - [`keys`]: key layout;
//! - [`value`]: lock values (identity, acquisition time, owner name);
//! - [`clock`]: the deadline clock and the wall clock (the one thing here that reads the time;
//!   no other I/O).
//!
//! Nothing here imports from another layer of the crate except [`crate::error`]'s types.

pub(crate) mod clock;
pub(crate) mod health;
pub(crate) mod keys;
pub(crate) mod quorum;
pub(crate) mod repair;
pub(crate) mod timing;
pub(crate) mod token;
pub(crate) mod value;

/// Locks a mutex, recovering from poisoning: the library's mutexes guard plain values that are
/// consistent after every statement, so a panic elsewhere never makes them unusable.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
