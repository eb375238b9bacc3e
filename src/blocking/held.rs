//! What every blocking guard is: an async guard and the client's runtime, ended (released or
//! resigned) before `drop` returns. [`Lock`](super::Lock), [`MultiLock`](super::MultiLock)
//! and [`Leadership`](super::Leadership) each wrap one [`Held`].

use std::future::Future;
use std::sync::Arc;

use super::Runtime;
use crate::error::Error;

/// An async guard a blocking one can end: a lock's or a set's release, a term's resignation.
pub(super) trait Ending: Sized {
    /// What a failed ending in `drop` logs: "release of a dropped blocking lock".
    const DROPPED: &'static str;

    /// Releases (or resigns) it.
    fn end(self) -> impl Future<Output = Result<(), Error>>;
}

impl Ending for crate::Lock {
    const DROPPED: &'static str = "release of a dropped blocking lock";

    fn end(self) -> impl Future<Output = Result<(), Error>> {
        self.release()
    }
}

impl Ending for crate::MultiLock {
    const DROPPED: &'static str = "release of dropped blocking locks";

    fn end(self) -> impl Future<Output = Result<(), Error>> {
        self.release()
    }
}

impl Ending for crate::Leadership {
    const DROPPED: &'static str = "resign of a dropped blocking leadership";

    fn end(self) -> impl Future<Output = Result<(), Error>> {
        self.resign()
    }
}

/// An async guard held by a blocking one, and the runtime that drives it.
#[derive(Debug)]
pub(super) struct Held<T: Ending> {
    /// `None` once ended or let go.
    inner: Option<T>,
    runtime: Arc<Runtime>,
}

impl<T: Ending> Held<T> {
    pub(super) fn new(inner: T, runtime: &Arc<Runtime>) -> Self {
        Held {
            inner: Some(inner),
            runtime: Arc::clone(runtime),
        }
    }

    /// The async guard: always there while `self` is (taken only by `end`, `let_go` and drop).
    pub(super) fn get(&self) -> &T {
        self.inner
            .as_ref()
            .expect("a blocking guard holds its async guard until it is consumed")
    }

    pub(super) fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Ends it now, blocking until done.
    pub(super) fn end(mut self) -> Result<(), Error> {
        match self.inner.take() {
            Some(inner) => self.runtime.block_on(inner.end()),
            None => Ok(()),
        }
    }

    /// The async guard, no longer ended by `drop`.
    pub(super) fn let_go(mut self) -> Option<T> {
        self.inner.take()
    }
}

impl<T: Ending> Drop for Held<T> {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() || self.runtime.handle().is_none() {
            // The async guard's own drop: ended in the background.
            drop(inner);
            return;
        }
        if let Err(e) = self.runtime.block_on(inner.end()) {
            tracing::debug!(error = %e, "{} failed; the ttl will end it", T::DROPPED);
        }
    }
}
