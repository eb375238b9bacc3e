//! The client's configuration as plain values, checked once by the builder
//! (`crate::lock::builder`): the engine and its nodes read these, never the builder.

use std::time::Duration;

use crate::core::health::{EvictionGuard, RestartGuard};
use crate::core::keys::KeyLayout;
use crate::node::NodeSettings;

/// A validated configuration (see `RedlockBuilder` for what each setting means and its
/// default).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) node_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) retry_count: u32,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: Duration,
    pub(crate) restart_guard: RestartGuard,
    pub(crate) eviction_guard: EvictionGuard,
    /// Fencing tokens on; always off in compat mode.
    pub(crate) fencing: bool,
    /// The key prefix and compat mode.
    pub(crate) keys: KeyLayout,
    /// The owner name this client's lock values carry, as given, if any.
    pub(crate) owner: Option<String>,
    /// Whether the per-lock metrics carry the lock's name as a `lock` label.
    pub(crate) metrics_lock_label: bool,
    /// What this client's lock values carry after their random part: `@` and the escaped owner
    /// name, or empty (`core::value::owner_suffix`).
    pub(crate) owner_suffix: String,
    /// Where connections and rounds run (the caller's runtime, or an I/O thread).
    pub(crate) io_thread: super::io_thread::IoThread,
}

impl Config {
    /// What each node needs of it.
    pub(crate) fn node_settings(&self) -> NodeSettings {
        NodeSettings {
            connect_timeout: self.connect_timeout,
            node_timeout: self.node_timeout,
            restart_guard: self.restart_guard,
            eviction_guard: self.eviction_guard,
            fenced: self.fencing,
            drift_factor: self.drift_factor,
            durability_marker: self.keys.durability_marker(),
            #[cfg(feature = "testkit")]
            force_script: false,
        }
    }
}
