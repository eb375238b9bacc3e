//! The public lock: the builder that makes a client ([`builder`]), the ways to acquire
//! ([`acquire`]), the held-lock guard ([`guard`]), its lease and keep-alive ([`lease`]), and scoped
//! locking with `with_lock` ([`scoped`]).

pub(crate) mod acquire;
pub(crate) mod builder;
pub(crate) mod guard;
mod lease;
pub(crate) mod scoped;
