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
mod eviction;
mod fencing;
pub mod guide;
mod lock;
mod metrics;
// The model checker (`docs/verification.md`) and the fencing model: compiled into the unit
// tests only with the internal `model` feature, so `cargo test` of one area does not pay for
// their runs.
#[cfg(all(test, feature = "model"))]
mod model;
mod multi;
mod node;
mod run_once;
mod semaphore;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;

/// The `redis` crate this crate is built on (redis 1.x, at least 1.8), re-exported:
/// [`fenced_set`] takes its connections, [`RedlockBuilder::client`] its clients, and node
/// errors carry its errors. Use it through this path (`quorumlock::redis`), or keep the
/// `redis` of your own `Cargo.toml` at a 1.x that Cargo unifies with ours: a `redis` of another
/// major version is another crate, whose types would not fit. A move to redis 2 will come
/// with a new major version of this crate.
pub use redis;
/// The token type [`Lock::lost_token`] and [`LockContext::lost_token`] return (from
/// `tokio-util`), re-exported so that you can name it without depending on `tokio-util`.
pub use tokio_util::sync::CancellationToken;

pub use crate::client::FlushReport;
pub use crate::client::check::TokenCheck;
pub use crate::client::inventory::{HeldLock, Inventory, MAX_LOCKS};
pub use crate::client::io_thread::IoThread;
pub use crate::client::revoke::Revocation;
pub use crate::client::status::{KeyState, LockStatus, NodeStatus};
pub use crate::core::health::{EvictionGuard, RestartGuard};
pub use crate::core::quorum::HolderView;
pub use crate::core::token::FencingToken;
pub use crate::election::{
    Election, ElectionBuilder, Health, Leader, Leadership, Observation, Observer,
};
pub use crate::error::{
    ArgumentError, ConfigError, Error, LostReason, NodeError, NodeFailure, Result, Setting,
};
pub use crate::eviction::EvictionRisk;
pub use crate::fencing::{
    FenceClaim, FenceGate, FencedWrite, StaleToken, fenced_claim, fenced_set,
};
pub use crate::lock::builder::RedlockBuilder;
pub use crate::lock::guard::Lock;
pub use crate::lock::redlock::Redlock;
pub use crate::lock::scoped::LockContext;
pub use crate::multi::MultiLock;
pub use crate::run_once::{
    CatchUp, Outcome, Overlap, RanBy, RunOnce, RunOnceBuilder, RunPolicy, Schedule, ScheduledRun,
    SkipReason, Tick, TickContext, tick_of,
};
pub use crate::semaphore::{Permit, Semaphore};
