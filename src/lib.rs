#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::print_stdout, clippy::print_stderr))]

mod clock;
mod config;
mod election;
mod error;
mod fencing;
#[cfg(test)]
mod fencing_model;
mod guard;
mod lease;
mod metrics;
#[cfg(test)]
mod model;
mod node;
mod quorum;
mod redlock;
mod repair;
mod schedule;
mod scripts;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;

pub use config::{EvictionGuard, EvictionRisk, RedlockBuilder, RestartGuard};
pub use election::{Election, ElectionBuilder, Health, Leader, Leadership, Observation};
pub use error::{ArgumentError, ConfigError, Error, LostReason, NodeError, NodeFailure, Result};
pub use fencing::{FenceGate, FencedWrite, FencingToken, StaleToken, fenced_set};
pub use guard::Lock;
pub use lease::LockContext;
pub use quorum::HolderView;
pub use redlock::{KeyState, LockStatus, NodeStatus, Redlock};
pub use schedule::{Outcome, RunOnce, RunOnceBuilder, SkipReason, TickContext, tick_of};

/// Locks a mutex, recovering from poisoning: the library's mutexes guard plain values that are
/// consistent after every statement, so a panic elsewhere never makes them unusable.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
