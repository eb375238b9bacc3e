#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::print_stdout, clippy::print_stderr))]

// Layers, lowest first; each imports only from the ones above it in this list (see
// docs/architecture.md and tests/architecture.rs).
#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
mod client;
mod core;
mod election;
mod error;
mod fencing;
#[cfg(test)]
mod fencing_model;
mod lock;
mod metrics;
// The model checker (`docs/verification.md`): compiled into the unit tests only with the
// internal `model` feature, so `cargo test` of one area does not pay for its runs.
#[cfg(all(test, feature = "model"))]
mod model;
mod multi;
mod node;
mod run_once;
mod semaphore;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;

/// The `redis` crate this crate is built on, re-exported: [`fenced_set`] takes its
/// connections, and a `redis` of another version in your `Cargo.toml` would not fit.
pub use redis;

pub use crate::client::Redlock;
pub use crate::client::status::{KeyState, LockStatus, NodeStatus};
pub use crate::core::health::{EvictionGuard, EvictionRisk, RestartGuard};
pub use crate::core::quorum::HolderView;
pub use crate::core::token::FencingToken;
pub use crate::election::{
    Election, ElectionBuilder, Health, Leader, Leadership, Observation, Observer,
};
pub use crate::error::{
    ArgumentError, ConfigError, Error, LostReason, NodeError, NodeFailure, Result, Setting,
};
pub use crate::fencing::{FenceGate, FencedWrite, StaleToken, fenced_set};
pub use crate::lock::builder::RedlockBuilder;
pub use crate::lock::guard::Lock;
pub use crate::lock::scoped::LockContext;
pub use crate::multi::MultiLock;
pub use crate::run_once::{
    Outcome, RanBy, RunOnce, RunOnceBuilder, RunPolicy, SkipReason, TickContext, tick_of,
};
pub use crate::semaphore::{Permit, Semaphore};
