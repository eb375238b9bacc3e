//! `redlock run`: acquire, run CMD under the lock (extending it every ttl/3), release.
//!
//! CMD is spawned directly (no shell) with stdin, stdout and stderr inherited and
//! `REDLOCK_KEY`, `REDLOCK_TOKEN`, `REDLOCK_VALIDITY_MS` added to its environment; how it is
//! run, signalled and terminated after a loss is `child.rs`'s. The lock is released once CMD
//! has exited.

use std::time::Duration;

use futures::FutureExt as _;
use nix::sys::signal::Signal;
use quorumlock::{Error, Lock, LostReason, Permit, Redlock};

use crate::child::{self, Ended, GroupEnd, Termination, signal_exit_code};
use crate::{EXIT_LOST, EXIT_OS_ERROR, RunArgs, exit_code, fail_with, report};

/// The lock CMD runs under: KEY itself, or with `-n N` a free permit of the semaphore KEY (at
/// most N holders at once).
async fn acquire(locks: &Redlock, args: &RunArgs) -> Result<Lock, Error> {
    match args.permits {
        None => locks.acquire_timeout(&args.key, args.ttl, args.wait).await,
        Some(n) => locks
            .semaphore(&args.key, n)?
            .acquire_timeout(args.ttl, args.wait)
            .await
            .map(Permit::into_lock),
    }
}

/// Runs `redlock run`; returns the process exit code. Every path that holds the lock releases
/// it (or, once lost, leaves nothing of ours behind) before returning.
pub(crate) async fn run(locks: Redlock, args: RunArgs) -> u8 {
    let mut signals = match child::signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    // `acquire_timeout` makes at least the rounds `acquire` makes: `--wait 0` is one try with the
    // usual short randomized retries, and a small wait never means fewer rounds.
    let acquire = acquire(&locks, &args);
    // A signal while acquiring abandons the attempt: the library releases whatever the
    // attempt had set, in the background (drained before exit).
    let lock = tokio::select! {
        r = acquire => r,
        sig = signals.recv() => {
            report(&interrupted(sig, &args.key));
            return signal_exit_code(sig as i32);
        }
    };
    let lock = match lock {
        Ok(lock) => lock,
        Err(e) => return fail_with(&e, args.conflict_code()),
    };
    drop(locks);
    // A signal that arrived while the acquisition was completing must not let CMD start. One
    // turn of the runtime makes a signal already delivered to the process visible here.
    tokio::task::yield_now().await;
    if let Some(sig) = signals.recv().now_or_never() {
        report(&interrupted(sig, &args.key));
        release(lock).await;
        return signal_exit_code(sig as i32);
    }
    lock.keep_alive();
    let env = [
        ("REDLOCK_KEY", lock.key().to_owned()),
        ("REDLOCK_TOKEN", lock.token().get().to_string()),
        (
            "REDLOCK_VALIDITY_MS",
            lock.validity().as_millis().to_string(),
        ),
    ];
    let running = match child::spawn(args.cmd_options(), &env) {
        Ok(running) => running,
        Err(code) => {
            release(lock).await;
            return code;
        }
    };
    tracing::debug!(key = %args.key, token = %lock.token(), "CMD runs under the lock");
    match child::supervise(running, lock.lost(), args.kill_after, &mut signals).await {
        Ended::Terminated { code, how } => lost_while_running(lock, &args, Some(how), code),
        Ended::LostTrack { error, reaped } => lost_track(lock, &error, reaped).await,
        Ended::Exited(code) if lock.is_lost() => lost_while_running(lock, &args, None, code),
        Ended::Exited(code) => match lock.release().await {
            Ok(()) => code,
            // A quorum no longer held our value, or the deadline had passed: the lock lapsed
            // while CMD ran, we noticed late.
            Err(e @ Error::Lost { .. }) => {
                report(&format_args!("{e}; CMD had already exited ({code})"));
                exit_code(&e)
            }
            Err(e) => {
                report(&format_args!(
                    "warning: CMD finished under the lock, but the release did not reach a \
                     quorum (the rest expires with the ttl): {e}"
                ));
                code
            }
        },
    }
}

pub(crate) fn interrupted(sig: Signal, key: &str) -> String {
    format!("{sig} received while acquiring {key:?}; nothing was run")
}

/// `child.wait()` failed: CMD's state is unknown, and it was sent SIGKILL. The lock is
/// released only once CMD is known to be gone, otherwise left to expire with the ttl, so that
/// nobody else can take it while CMD might still be working.
async fn lost_track(lock: Lock, e: &std::io::Error, reaped: bool) -> u8 {
    if reaped {
        report(&format_args!(
            "lost track of CMD ({e}); it was killed and the lock released"
        ));
        release(lock).await;
    } else {
        report(&format_args!(
            "lost track of CMD ({e}); it was sent SIGKILL and the lock is left to expire \
             with its ttl ({})",
            humantime::format_duration(lock.ttl())
        ));
        lock.forget();
    }
    EXIT_OS_ERROR
}

fn lost_while_running(
    lock: Lock,
    args: &RunArgs,
    termination: Option<(Termination, GroupEnd)>,
    code: u8,
) -> u8 {
    let reason = lock.lost_reason().unwrap_or(LostReason::Expired);
    report(&lost_line(
        &args.key,
        reason,
        termination,
        code,
        args.kill_after,
        args.foreground,
    ));
    // Dropping the guard sends a release of our value (a no-op wherever another owner holds
    // the key now); the exit path drains it.
    drop(lock);
    EXIT_LOST
}

/// The one line reported when the lock was lost while CMD ran.
pub(crate) fn lost_line(
    key: &str,
    reason: LostReason,
    termination: Option<(Termination, GroupEnd)>,
    code: u8,
    kill_after: Duration,
    foreground: bool,
) -> String {
    let e = Error::Lost {
        key: key.to_owned(),
        reason,
    };
    let what = child::fate_of_cmd(termination, code, kill_after, foreground);
    format!("{e}; {what}")
}

/// Releases a lock whose CMD never ran; the failure is already reported.
async fn release(lock: Lock) {
    if let Err(e) = lock.release().await {
        tracing::warn!(error = %e, "release failed; the ttl will expire the lock");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumlock::NodeFailure;

    fn line(reason: LostReason, t: Option<(Termination, GroupEnd)>, fg: bool) -> String {
        lost_line("job", reason, t, 143, Duration::from_millis(1500), fg)
    }

    /// Every reason a loss can have reads as a sentence naming what happened, and what became
    /// of CMD.
    #[test]
    fn the_loss_line_says_what_happened() {
        let term = Some((Termination::Term, GroupEnd::Gone));
        assert_eq!(
            line(LostReason::Expired, term, false),
            "lock \"job\" was lost: its validity ran out without a successful extension; \
             CMD's process group was sent SIGTERM and CMD exited (143)"
        );
        assert_eq!(
            line(
                LostReason::NotOwner {
                    owned: 0,
                    needed: 3
                },
                Some((Termination::Kill, GroupEnd::Gone)),
                false
            ),
            "lock \"job\" was lost: a quorum no longer holds our value (0 nodes had confirmed it \
             when that was certain, 3 needed); CMD ignored SIGTERM and its process group was \
             killed after 1s 500ms"
        );
        let no_failures = line(LostReason::Unreachable { failures: vec![] }, term, true);
        assert_eq!(
            no_failures,
            "lock \"job\" was lost: an extension could not reach a quorum before validity ran \
             out; no node failed outright (the budget ran out); CMD was sent SIGTERM and exited \
             (143)"
        );
        let failure = NodeFailure::new(
            "redis://10.0.0.1:6379",
            quorumlock::NodeError::Timeout(Duration::from_millis(250)),
        );
        let with_failures = line(
            LostReason::Unreachable {
                failures: vec![failure.clone(), failure],
            },
            Some((Termination::Term, GroupEnd::Killed)),
            false,
        );
        assert_eq!(
            with_failures,
            "lock \"job\" was lost: an extension could not reach a quorum before validity ran \
             out; redis://10.0.0.1:6379: timed out after 250ms; redis://10.0.0.1:6379: timed \
             out after 250ms; CMD's process group was sent SIGTERM and CMD exited (143); the \
             rest of the group ignored SIGTERM and was killed after 1s 500ms"
        );
        assert_eq!(
            line(LostReason::Expired, None, false),
            "lock \"job\" was lost: its validity ran out without a successful extension; \
             CMD had already exited (143)"
        );
        assert!(
            line(
                LostReason::Expired,
                Some((Termination::Kill, GroupEnd::Lingering)),
                false
            )
            .ends_with("; some of its processes were still there 1s after SIGKILL")
        );
    }
}
