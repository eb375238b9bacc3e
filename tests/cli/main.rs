//! The `redlock` binary driven as a user would, against real 5-node clusters: every exit code
//! of the contract, every environment variable, lock loss while CMD runs, signal forwarding,
//! nodes killed and hung, `status`, `elect` and `demo`. One module per subcommand (and per
//! topic of `run`); `harness` holds what they share.
#![allow(unreachable_pub)]

#[path = "../support/fake_node.rs"]
mod fake_node;
#[cfg(feature = "tls")]
#[path = "../support/pki.rs"]
mod pki;
#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/mod.rs"]
mod support;

mod harness;

mod bad_inputs;
mod demo;
mod elect;
mod hostile;
mod managed;
mod node_options;
mod operate;
mod restart_guard;
mod run;
mod run_held;
mod run_lost;
mod run_nodes;
mod run_once_per;
mod run_permits;
mod run_signals;
mod status;
mod usage;
