//! Where the nodes run, against real processes the testkit starts, one module per shape: Redis
//! Cluster and Sentinel-managed members beside standalone masters (`members`) and failovers
//! inside them (`failover`), members given as the user's own `redis::Client`s (`byo`),
//! `rediss://` nodes (`tls`), managed services with a restricted ACL user (`managed`), and
//! compat mode beside other Redlock clients (`compat`).
#![allow(unreachable_pub)]

#[cfg(feature = "tls")]
#[path = "../support/pki.rs"]
mod pki;
#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/mod.rs"]
mod support;

mod byo;
mod compat;
mod failover;
mod managed;
mod members;
mod operate;
#[cfg(feature = "tls")]
mod tls;
