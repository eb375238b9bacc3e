//! The lock against real redis-server processes, one module per area: acquiring (`acquire`),
//! extending and releasing (`extend`), building and node settings (`config`), leases and the
//! lost signal (`lease`), fencing tokens and the restart guard (`fencing`), the keyspace
//! (`keyspace`), the fenced acquire without Lua (`pipeline`), handing a lock over between
//! processes (`handoff`), owner names (`owner`), tracing spans (`spans`) and everything a node
//! can send (`hostile_nodes`, a property test).
#![allow(unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

mod acquire;
mod burst;
mod claim;
mod config;
mod extend;
mod fencing;
mod handoff;
mod hostile_nodes;
mod inventory;
mod keyspace;
mod lease;
mod owner;
mod pipeline;
mod resume;
mod revoke;
mod spans;

use std::time::Duration;

/// For tests that watch keys disappear: far longer than any wait, so only our cleanup (never
/// the key's own expiry) can make a key go away in time.
const LONG: Duration = Duration::from_secs(120);
