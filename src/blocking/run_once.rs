//! Run-once scheduling, blocking: [`Redlock::run_once`] and [`RunOnce`].

use super::Redlock;
use crate::error::Error;
use crate::run_once::Failed;
use crate::{Outcome, TickContext};

impl Redlock {
    /// Drives a run-once job built on this client's async client ([`Redlock::as_async`]) from
    /// blocking code: the job runs on the calling thread, its lock is kept alive on the
    /// client's runtime meanwhile.
    ///
    /// ```no_run
    /// # fn demo(locks: &quorumlock::blocking::Redlock, tick: u64) -> Result<(), quorumlock::Error> {
    /// use quorumlock::RunOnce;
    ///
    /// let report = locks.run_once(RunOnce::builder(locks.as_async().clone(), "nightly-report").build()?);
    /// let outcome = report.run(tick, |ctx| {
    ///     // ... blocking work, stamping writes with ctx.token() ...
    ///     42
    /// })?;
    /// if outcome.ran() {
    ///     println!("ran tick {tick}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn run_once(&self, job: crate::RunOnce) -> RunOnce {
        RunOnce {
            inner: job,
            client: self.clone(),
        }
    }
}

/// A job run at most once per tick across instances, from [`Redlock::run_once`]: the blocking
/// form of [`crate::RunOnce`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RunOnce {
    inner: crate::RunOnce,
    client: Redlock,
}

impl RunOnce {
    /// The async job underneath.
    pub fn as_async(&self) -> &crate::RunOnce {
        &self.inner
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        self.inner.job()
    }

    /// Runs `job` for `tick` on this thread if this instance takes the job's lock and the tick
    /// has not run yet, as [`crate::RunOnce::run`]; otherwise skips.
    ///
    /// Blocking work cannot be stopped from outside, so unlike the async form the job always
    /// runs to its end: check the [`TickContext`]'s lost token
    /// ([`lost_token`](TickContext::lost_token)`().is_cancelled()`) between its steps, and
    /// stamp its writes with [`token`](TickContext::token). A lock lost by the time the job
    /// returned gives [`Outcome::Lost`] with the job's output, and no tick marker is written.
    /// The job may use the blocking client (its calls are not made inside the runtime).
    ///
    /// # Errors
    ///
    /// As [`crate::RunOnce::run`].
    pub fn run<T>(
        &self,
        tick: impl Into<crate::Tick>,
        job: impl FnOnce(TickContext) -> T,
    ) -> Result<Outcome<T>, Error> {
        self.run_job(tick.into(), job, |_| false)
    }

    /// As [`run`](Self::run), for a job that can fail, as [`crate::RunOnce::try_run`]: an `Err`
    /// marks the tick done under [`RunPolicy::AtMostOnce`](crate::RunPolicy::AtMostOnce) and
    /// leaves it for the next instance under
    /// [`RunPolicy::RetryOnFailure`](crate::RunPolicy::RetryOnFailure).
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub fn try_run<T, E>(
        &self,
        tick: impl Into<crate::Tick>,
        job: impl FnOnce(TickContext) -> Result<T, E>,
    ) -> Result<Outcome<Result<T, E>>, Error> {
        self.run_job(tick.into(), job, Result::is_err)
    }

    /// The async form's phases with the job between them, on this thread, in a
    /// `quorumlock.run_once` span.
    fn run_job<T>(
        &self,
        tick: crate::Tick,
        job: impl FnOnce(TickContext) -> T,
        failed: Failed<T>,
    ) -> Result<Outcome<T>, Error> {
        let span = tracing::info_span!(
            "quorumlock.run_once",
            key = self.inner.job(),
            tick = tick.name(),
            outcome = tracing::field::Empty,
        );
        let _entered = span.enter();
        let runtime = &self.client.runtime;
        let (held, ctx) = match runtime.block_on(self.inner.start_tick(&tick, None))? {
            Ok(started) => started,
            Err(reason) => {
                let tick = tick.name().to_owned();
                let skipped = Outcome::Skipped { tick, reason };
                self.inner.report(&skipped, false, false);
                span.record("outcome", skipped.span_word());
                return Ok(skipped);
            }
        };
        let output = job(ctx);
        let tick = tick.name().to_owned();
        let done =
            runtime.block_on(async { Ok(self.inner.finish(held, tick, output, failed).await) })?;
        let failed_run = matches!(&done, Outcome::Ran { output, .. } if failed(output));
        self.inner.report(&done, failed_run, false);
        span.record("outcome", done.span_word());
        Ok(done)
    }
}
