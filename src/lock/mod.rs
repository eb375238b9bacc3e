//! The public face: the client, [`Redlock`](redlock::Redlock), every public method a short
//! delegation to the engine ([`redlock`]); the builder that makes one ([`builder`]); the
//! held-lock guard ([`guard`]), its lease and keep-alive ([`lease`]), and scoped
//! locking with `with_lock` ([`scoped`]).

pub(crate) mod builder;
pub(crate) mod guard;
mod lease;
pub(crate) mod redlock;
pub(crate) mod scoped;
