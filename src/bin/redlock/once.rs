//! `redlock run --once-per PERIOD KEY -- CMD`: CMD runs on one host per period, however many
//! hosts' cron fire (the library's `RunOnce` underneath).
//!
//! The period's tick is `Schedule::every(PERIOD).tick_at(now)` (whole periods since the Unix epoch), so hosts
//! whose clocks agree compute the same tick. `RunOnce` takes KEY's lock without waiting, reads
//! the tick's marker, runs the job and writes the marker before it releases the lock. The job
//! here starts CMD and hands it to this module, which supervises it exactly as `redlock run`
//! does (`child.rs`) and tells the job CMD's exit code when it exits; the job's lost signal
//! terminates CMD.

use std::ffi::OsString;
use std::time::{Duration, SystemTime};

use quorumlock::{LostReason, Outcome, Redlock, RunOnce, Schedule, SkipReason, TickContext};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::child::{self, Ended, GroupEnd, Termination, signal_exit_code};
use crate::run::{interrupted, lost_line};
use crate::{EXIT_LOST, EXIT_OS_ERROR, RunArgs, fail, instance_id, report};

/// What the job hands over once it has tried to start CMD.
type Started = Result<(child::Running, CancellationToken), u8>;

/// Runs `redlock run --once-per PERIOD`; returns the process exit code.
pub(crate) async fn once_per(locks: Redlock, args: RunArgs, period: Duration) -> u8 {
    let mut signals = match child::signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let once = match RunOnce::builder(locks, &args.key)
        .ttl(args.ttl)
        .marker_ttl(marker_ttl(period))
        .instance(instance_id())
        .build()
    {
        Ok(once) => once,
        Err(e) => return fail(&e.into()),
    };
    // The period's tick on the library's schedule: its name, and its start (so that a node's
    // data loss seen before the period began does not hold this period out).
    let schedule = match Schedule::every(period) {
        Ok(schedule) => schedule,
        Err(e) => return fail(&e.into()),
    };
    // An interval always has a tick; `Tick::of` is what it computes.
    let tick = schedule
        .tick_at(SystemTime::now())
        .unwrap_or_else(|| quorumlock::Tick::of(SystemTime::now(), period));
    let (started_tx, started_rx) = oneshot::channel::<Started>();
    let (exited_tx, exited_rx) = oneshot::channel::<u8>();
    let (cmd, key, foreground) = (args.cmd.clone(), args.key.clone(), args.foreground);
    // Boxed, so that it can be leaked (see `LostTrack` below).
    let mut job = Box::pin(once.run(tick, move |ctx| {
        job(ctx, cmd, key, foreground, started_tx, exited_rx)
    }));

    // Until CMD starts (or the job is skipped): a signal gives up, nothing run. CMD first: once
    // it has started, a pending signal is forwarded to it instead.
    let (running, lost) = tokio::select! {
        biased;
        started = started_rx => match started {
            Ok(Ok(started)) => started,
            // CMD could not be started (reported); dropping the job releases the lock.
            Ok(Err(code)) => return code,
            // The job was never called: the run ended before it (skipped, or failed).
            Err(_) => return skipped_or_failed(job.await, args.conflict_code()),
        },
        outcome = &mut job => return skipped_or_failed(outcome, args.conflict_code()),
        sig = signals.recv() => {
            report(&interrupted(sig, &args.key));
            return signal_exit_code(sig as i32);
        }
    };
    let lost = lost.cancelled_owned();
    let (code, termination) =
        match child::supervise(running, lost, args.kill_after, &mut signals).await {
            Ended::Exited(code) => (code, None),
            Ended::Terminated { code, how } => (code, Some(how)),
            Ended::LostTrack { error, reaped } => {
                if !reaped {
                    // Nobody else may run CMD while it might still work: leak the job (and its
                    // lock) rather than let dropping it release the lock.
                    std::mem::forget(job);
                }
                // Otherwise dropping the job releases the lock, without a marker.
                return lost_track(&error, reaped, args.ttl);
            }
        };
    let _ = exited_tx.send(code);
    ran(job.await, &args, termination, code)
}

/// The job given to `RunOnce::run`: starts CMD with the run's token and tick in its
/// environment, hands it over through `started`, and completes with CMD's exit code once told
/// through `exited`. A job that could not start CMD, or that is never told, never completes:
/// no marker is written, and dropping it releases the lock.
async fn job(
    ctx: TickContext,
    cmd: Vec<OsString>,
    key: String,
    foreground: bool,
    started: oneshot::Sender<Started>,
    exited: oneshot::Receiver<u8>,
) -> u8 {
    let env = [
        ("REDLOCK_KEY", key),
        ("REDLOCK_TOKEN", ctx.token().get().to_string()),
        ("REDLOCK_TICK", ctx.tick().to_owned()),
    ];
    let options = child::CmdOptions {
        argv: &cmd,
        foreground,
    };
    let spawned = child::spawn(options, &env).map(|running| (running, ctx.lost_token()));
    let ok = spawned.is_ok();
    let _ = started.send(spawned);
    if ok && let Ok(code) = exited.await {
        return code;
    }
    std::future::pending().await
}

/// The exit code once CMD has exited and the run is over (marker written, lock released).
fn ran(
    outcome: Result<Outcome<u8>, quorumlock::Error>,
    args: &RunArgs,
    termination: Option<(Termination, GroupEnd)>,
    code: u8,
) -> u8 {
    match outcome {
        Ok(Outcome::Ran { marked, .. }) => {
            if !marked {
                report(&format_args!(
                    "warning: CMD ran, but the record that this period is done did not reach a \
                     quorum: a host that starts later this period may run CMD again"
                ));
            }
            code
        }
        Ok(Outcome::Lost { reason, .. }) => lost_while_running(args, reason, termination, code),
        // The job completed: it was neither skipped nor failed before it ran.
        Ok(other) => {
            report(&format_args!("unexpected outcome after CMD ran: {other:?}"));
            crate::EXIT_SOFTWARE
        }
        Err(e) => fail(&e),
    }
}

/// `child.wait()` failed: reports what became of CMD and the lock.
fn lost_track(error: &std::io::Error, reaped: bool, ttl: Duration) -> u8 {
    if reaped {
        report(&format_args!(
            "lost track of CMD ({error}); it was killed and the lock released (the period is \
             not marked as done)"
        ));
    } else {
        report(&format_args!(
            "lost track of CMD ({error}); it was sent SIGKILL and the lock is left to expire \
             with its ttl ({})",
            humantime::format_duration(ttl)
        ));
    }
    EXIT_OS_ERROR
}

/// How long a period's marker lives: two periods, so that a host whose clock runs a little
/// behind still finds it, capped at the library's longest ttl.
fn marker_ttl(period: Duration) -> Duration {
    period
        .saturating_mul(2)
        .min(quorumlock::RedlockBuilder::MAX_TTL)
        .max(Duration::from_millis(1))
}

/// The exit code of a run that ended before CMD started: skipped quietly (another host runs or
/// ran CMD this period: 0 or `-E`), or a failure reported on one line.
fn skipped_or_failed<T: std::fmt::Debug>(
    outcome: Result<Outcome<T>, quorumlock::Error>,
    conflict: u8,
) -> u8 {
    match outcome {
        Ok(Outcome::Skipped { reason, .. }) => match reason {
            SkipReason::Unavailable(e) => fail(&e),
            reason => {
                tracing::debug!(%reason, "skipped");
                conflict
            }
        },
        Ok(other) => {
            report(&format_args!(
                "unexpected outcome before CMD ran: {other:?}"
            ));
            crate::EXIT_SOFTWARE
        }
        Err(e) => fail(&e),
    }
}

fn lost_while_running(
    args: &RunArgs,
    reason: LostReason,
    termination: Option<(Termination, GroupEnd)>,
    code: u8,
) -> u8 {
    report(&lost_line(
        &args.key,
        reason,
        termination,
        code,
        args.kill_after,
        args.foreground,
    ));
    EXIT_LOST
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_periods_marker_lives_two_periods_within_the_ttl_limit() {
        assert_eq!(
            marker_ttl(Duration::from_secs(3600)),
            Duration::from_secs(7200)
        );
        // The longest period's marker still lives two periods.
        assert_eq!(
            marker_ttl(crate::MAX_PERIOD),
            crate::MAX_PERIOD.saturating_mul(2)
        );
        assert!(marker_ttl(crate::MAX_PERIOD) <= quorumlock::RedlockBuilder::MAX_TTL);
        assert_eq!(marker_ttl(Duration::ZERO), Duration::from_millis(1));
    }
}
