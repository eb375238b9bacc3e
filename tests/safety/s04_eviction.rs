//! Issue 12: see tests/safety/main.rs.
