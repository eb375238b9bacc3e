//! The I/O thread (opt-in, [`IoThread::Always`]): the client's node connections and whole
//! operations run on a current-thread runtime of its own, on one thread the client owns.
//!
//! A node connection's driver task runs on the runtime that opens it, and a round's calls go
//! from the task that runs the round to each connection's driver and back. On
//! a multi-thread runtime those tasks may land on different workers, and a hop between them is
//! a wake-up of another thread. With the I/O thread, an operation (an acquisition with its
//! retries, an extension, a release, a status read, keep-alive) runs where the connections are,
//! and the caller pays two hand-offs per operation (the request, the answer).
//!
//! Measured (`docs/benchmarks.md`, the `quorumlock-io` rows), that does not pay on the 2-core machines the
//! figures come from: sequential latency is no better than running inline on the caller's
//! multi-thread runtime (the runtime keeps a round's tasks on one worker most of the time), and
//! under concurrency the one thread and its hand-offs cost about three times the client CPU per
//! operation. So the default is [`IoThread::Never`]; the thread is there for deployments that
//! measure otherwise.
//!
//! The thread starts at the client's first operation and ends when the last handle on the
//! client is dropped: its runtime is dropped then, which cancels what still runs on it
//! (background releases end with the client, as they would with the runtime they ran on).

use std::future::Future;
use std::sync::OnceLock;
use std::thread::ThreadId;

use futures::future::Either;
use tokio::runtime::Handle;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;
use tracing::instrument::WithSubscriber;

use super::Engine;
use crate::error::{ConfigError, Error};

/// Where a client's node connections and rounds run (see
/// [`RedlockBuilder::io_thread`](crate::RedlockBuilder::io_thread)).
///
/// ```
/// use quorumlock::{IoThread, Redlock};
///
/// let locks = Redlock::builder(["redis://127.0.0.1:6379"])
///     .io_thread(IoThread::Always)
///     .build()
///     .unwrap();
/// # drop(locks);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IoThread {
    /// The default: connections and rounds run on the caller's runtime.
    #[default]
    Never,
    /// A thread of the client's own runs them, whatever runtime calls the client.
    Always,
}

/// The running I/O thread: a handle on its runtime and a way to stop it.
#[derive(Debug)]
pub(crate) struct IoRuntime {
    handle: Handle,
    thread: ThreadId,
    /// Dropped (closing the channel) when the client is: the thread then ends.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The client's I/O thread, started at most once.
#[derive(Debug, Default)]
pub(crate) struct IoThreadSlot {
    running: OnceLock<Option<IoRuntime>>,
}

impl IoRuntime {
    /// Starts the thread and its current-thread runtime; `None` (with a warning) when either
    /// cannot start: the client then runs inline.
    fn start() -> Option<IoRuntime> {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::warn!(error = %e, "quorumlock: no I/O thread (its runtime could not start); running on the caller's runtime");
                return None;
            }
        };
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("quorumlock-io".to_owned())
            .spawn(move || {
                // Returns when the sender is dropped (with the client).
                let _ = runtime.block_on(stopped);
                // Dropping the runtime cancels its tasks; nothing here blocks on them.
                runtime.shutdown_background();
            });
        match spawned {
            Ok(thread) => Some(IoRuntime {
                handle,
                thread: thread.thread().id(),
                _stop: stop,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "quorumlock: no I/O thread (it could not be spawned); running on the caller's runtime");
                None
            }
        }
    }
}

impl Engine {
    /// The I/O thread's runtime, when operations go there from this thread: started on first
    /// use with [`IoThread::Always`]; `None` to run inline (no I/O thread, or this is it).
    fn io_runtime(&self) -> Option<&Handle> {
        if self.inner.cfg.io_thread == IoThread::Never {
            return None;
        }
        let running = self
            .inner
            .io_thread
            .running
            .get_or_init(IoRuntime::start)
            .as_ref()?;
        (std::thread::current().id() != running.thread).then_some(&running.handle)
    }

    /// Runs `op` on the I/O thread when there is one (in the caller's span and with its tracing
    /// subscriber), inline otherwise. Dropping the returned future aborts the operation there,
    /// as dropping it inline would: its own cancellation handling (background releases) runs.
    /// Without an I/O thread (the default) the returned future is `op` itself: a future that
    /// awaits `op` holds it twice (the argument, and the future awaited), and an operation's
    /// future is moved by value at every step up to its caller's.
    pub(crate) fn on_io_thread<T, F>(
        &self,
        op: F,
    ) -> impl Future<Output = Result<T, Error>> + use<T, F>
    where
        F: Future<Output = Result<T, Error>> + Send + 'static,
        T: Send + 'static,
    {
        if self.inner.cfg.io_thread == IoThread::Never {
            return Either::Left(op);
        }
        let engine = self.clone();
        Either::Right(async move { engine.maybe_on_io_thread(op).await })
    }

    /// [`on_io_thread`](Self::on_io_thread) with an I/O thread configured: on it, unless this
    /// is the I/O thread itself (or it could not start).
    async fn maybe_on_io_thread<T, F>(&self, op: F) -> Result<T, Error>
    where
        F: Future<Output = Result<T, Error>> + Send + 'static,
        T: Send + 'static,
    {
        let Some(handle) = self.io_runtime() else {
            return op.await;
        };
        let task = handle.spawn(
            op.instrument(tracing::Span::current())
                .with_current_subscriber(),
        );
        match AbortOnDropHandle::new(task).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {
                Err(ConfigError::Runtime("the client's I/O thread has shut down".to_owned()).into())
            }
        }
    }

    /// Where the client's background tasks go: the I/O thread when there is one (started by
    /// an earlier operation), else the current runtime.
    pub(crate) fn task_runtime(&self) -> Option<Handle> {
        match self.inner.io_thread.running.get() {
            Some(Some(running)) => Some(running.handle.clone()),
            _ => Handle::try_current().ok(),
        }
    }
}
