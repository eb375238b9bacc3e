//! Regression tests for the safety review (issue 12): one module per finding, each named so
//! `docs/safety.md` can point to it. Every test here failed on the code before its fix.

#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/mod.rs"]
mod support;

mod s01_late_extension;
mod s02_durable_but_empty;
mod s03_one_server_two_votes;
mod s04_eviction;
mod s05_partial_view;
mod s06_refusals_and_failures;
mod s07_simultaneous_contenders;
mod s08_logs;
mod s09_side_connections;
mod s10_repair_large_keyspace;
mod s11_suspend;
mod s12_small;
mod s12d_strict_hold_out;
mod s13_model_findings;
mod s14_repair_after_hold_out;
mod s15_resp3_config;
mod s16_scripts_unavailable;
mod s17_clock_jump;
