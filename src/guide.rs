#![allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]

//! The guides: the long documents of the repository's `docs/` folder, here so that the API
//! documentation alone teaches the crate. Each module is one document, word for word; it holds
//! no code.
//!
//! | guide | what it answers |
//! | --- | --- |
//! | [`safety`] | what the lock guarantees, under which assumptions; fencing tokens and why they jump; restarts, eviction, clocks |
//! | [`deployments`] | what a quorum member can be: standalone masters, a Redis Cluster, a Sentinel-managed primary, your own `redis::Client`; TLS; the Redis settings that matter |
//! | [`acl`] | managed services: the minimum ACL, and how a refusal is reported |
//! | [`election`] | leader election and run-once scheduling |
//! | [`scheduling`] | jobs on a schedule across a fleet: policies, catch-up, metrics, guarantees; ShedLock side by side |
//! | [`cli`] | the `redlock` command: options, environment, exit codes |
//! | [`observability`] | the metrics and spans, the alerts to set (PromQL), serving `/metrics`, a Grafana dashboard |
//! | [`benchmarks`] | what acquiring costs, against other clients and a hand-written floor, measured |
//!
//! In these pages, a file name such as `docs/acl.md` names another guide (here [`acl`]), and a
//! path such as `src/node/health.rs` a file of the crate's source.

#[doc = include_str!("../docs/safety.md")]
pub mod safety {}

#[doc = include_str!("../docs/deployments.md")]
pub mod deployments {}

#[doc = include_str!("../docs/acl.md")]
pub mod acl {}

#[doc = include_str!("../docs/election.md")]
pub mod election {}

#[doc = include_str!("../docs/scheduling.md")]
pub mod scheduling {}

#[doc = include_str!("../docs/cli.md")]
pub mod cli {}

#[doc = include_str!("../docs/observability.md")]
pub mod observability {}

#[doc = include_str!("../docs/benchmarks.md")]
pub mod benchmarks {}
