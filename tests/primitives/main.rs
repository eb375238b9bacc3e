//! The primitives on top of locks and the ways to call the client, against real redis-server
//! processes: several keys at once (`multi`), the counting semaphore (`semaphore`), the blocking
//! facade for programs without a runtime (`blocking`) and the client's own I/O thread
//! (`io_thread`).
#![allow(unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

mod blocking;
mod io_thread;
mod multi;
mod semaphore;

use std::time::Duration;

/// The ttl of the keys and permits the workloads of `multi` and `semaphore` take.
const WORKLOAD_TTL: Duration = Duration::from_secs(5);
/// How long one acquisition may wait for a busy key or permit: far above any fair share.
const PATIENCE: Duration = Duration::from_secs(30);
/// The bound on a whole workload: a deadlock or a stall fails the test instead of hanging it.
const WORKLOAD_BOUND: Duration = Duration::from_secs(120);
