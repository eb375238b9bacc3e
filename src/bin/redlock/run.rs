//! `redlock run`: acquire, run CMD under the lock (extending it every ttl/3), release.
//!
//! CMD is spawned directly (no shell) with stdin, stdout and stderr inherited and
//! `REDLOCK_KEY`, `REDLOCK_TOKEN`, `REDLOCK_VALIDITY_MS` added to its environment. SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT sent to `redlock` are forwarded to CMD; the lock is released once
//! CMD has exited. If the lock is lost first, CMD gets SIGTERM, then SIGKILL after
//! `--kill-after`, and `redlock` exits 79.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use quorumlock::{Error, Lock, LostReason, Redlock};
use tokio::signal::unix::{SignalKind, signal};

use crate::{EXIT_LOST, EXIT_OS_ERROR, RunArgs, exit_code, fail, report};

/// Exit code when CMD cannot be executed (found but not runnable), as in shells and env(1).
const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code when CMD is not found, as in shells and env(1).
const EXIT_NOT_FOUND: u8 = 127;

/// Runs `redlock run`; returns the process exit code. Every path that holds the lock releases
/// it (or, once lost, leaves nothing of ours behind) before returning.
pub(crate) async fn run(locks: Redlock, args: RunArgs) -> u8 {
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            report(&format_args!("cannot install signal handlers: {e}"));
            return EXIT_OS_ERROR;
        }
    };
    let acquire = async {
        if args.wait.is_zero() {
            locks.acquire(&args.key, args.ttl).await
        } else {
            locks.acquire_timeout(&args.key, args.ttl, args.wait).await
        }
    };
    // A signal while acquiring abandons the attempt: the library releases whatever the
    // attempt had set, in the background (drained before exit).
    let lock = tokio::select! {
        r = acquire => r,
        sig = signals.recv() => {
            report(&format_args!("{sig} received while acquiring {:?}; nothing was run", args.key));
            return signal_exit_code(sig as i32);
        }
    };
    let lock = match lock {
        Ok(lock) => lock,
        Err(e) => return fail(&e),
    };
    drop(locks);
    lock.keep_alive();
    let mut child = match spawn(&args, &lock) {
        Ok(child) => child,
        Err(e) => {
            report(&format_args!(
                "cannot run {:?}: {e}",
                args.cmd[0].to_string_lossy()
            ));
            release(lock).await;
            return if e.kind() == io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            };
        }
    };
    tracing::debug!(key = %args.key, token = %lock.token(), pid = child.id(), "CMD started");
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);

    let lost = lock.lost();
    tokio::pin!(lost);
    let kill_timer = tokio::time::sleep(Duration::MAX);
    tokio::pin!(kill_timer);
    let mut termination: Option<Termination> = None;
    let status = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status,
            () = &mut lost, if termination.is_none() => {
                // CMD may have exited while we could not run (stopped past the ttl): then there
                // is nothing to terminate.
                if let Ok(Some(status)) = child.try_wait() {
                    break Ok(status);
                }
                send(pid, Signal::SIGTERM);
                termination = Some(Termination::Term);
                kill_timer.as_mut().reset(tokio::time::Instant::now() + args.kill_after);
            }
            () = &mut kill_timer, if termination == Some(Termination::Term) => {
                send(pid, Signal::SIGKILL);
                termination = Some(Termination::Kill);
            }
            sig = signals.recv() => {
                tracing::debug!(%sig, "forwarding to CMD");
                send(pid, sig);
            }
        }
    };
    let code = match status {
        Ok(status) => cmd_exit_code(status),
        Err(e) => {
            report(&format_args!("lost track of CMD: {e}"));
            release(lock).await;
            return EXIT_OS_ERROR;
        }
    };
    if termination.is_some() || lock.is_lost() {
        return lost_while_running(lock, &args, termination, code);
    }
    match lock.release().await {
        Ok(()) => code,
        // A quorum no longer held our value: the lock lapsed while CMD ran, we noticed late.
        Err(e @ Error::Lost { .. }) => {
            report(&format_args!("{e}; CMD had already exited with {code}"));
            exit_code(&e)
        }
        Err(e) => {
            report(&format_args!(
                "warning: CMD finished under the lock, but the release did not reach a quorum \
                 (the rest expires with the ttl): {e}"
            ));
            code
        }
    }
}

/// How far the termination of CMD after a loss went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Termination {
    Term,
    Kill,
}

fn lost_while_running(
    lock: Lock,
    args: &RunArgs,
    termination: Option<Termination>,
    code: u8,
) -> u8 {
    let e = Error::Lost {
        key: args.key.clone(),
        reason: lock.lost_reason().unwrap_or(LostReason::Expired),
    };
    let what = match termination {
        Some(Termination::Term) => format!("CMD was sent SIGTERM and exited ({code})"),
        Some(Termination::Kill) => format!(
            "CMD ignored SIGTERM and was killed after {}",
            humantime::format_duration(args.kill_after)
        ),
        None => format!("CMD had already exited ({code})"),
    };
    report(&format_args!("{e}; {what}"));
    // Dropping the guard sends a release of our value (a no-op wherever another owner holds
    // the key now); the exit path drains it.
    drop(lock);
    EXIT_LOST
}

fn spawn(args: &RunArgs, lock: &Lock) -> io::Result<tokio::process::Child> {
    let (program, rest) = args
        .cmd
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))?;
    tokio::process::Command::new(program)
        .args(rest)
        .env("REDLOCK_KEY", &args.key)
        .env("REDLOCK_TOKEN", lock.token().get().to_string())
        .env(
            "REDLOCK_VALIDITY_MS",
            lock.validity().as_millis().to_string(),
        )
        .spawn()
}

/// Releases a lock whose CMD never ran or vanished; the failure is already reported.
async fn release(lock: Lock) {
    if let Err(e) = lock.release().await {
        tracing::warn!(error = %e, "release failed; the ttl will expire the lock");
    }
}

fn send(pid: Option<Pid>, sig: Signal) {
    let Some(pid) = pid else { return };
    if let Err(e) = kill(pid, sig) {
        // ESRCH: CMD has just exited; the wait above will see it.
        tracing::debug!(%sig, error = %e, "could not signal CMD");
    }
}

/// CMD's exit code, or 128 + the signal that killed it.
fn cmd_exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(sig)) => signal_exit_code(sig),
        (None, None) => u8::MAX,
    }
}

/// 128 + the signal number, as shells report a death by signal.
pub(crate) fn signal_exit_code(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(u8::MAX)
}

/// The signals `redlock` catches (and forwards to CMD while it runs).
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal received.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: a signal not yet returned stays pending.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_of_cmd() {
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(9)), 137); // SIGKILL
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(15)), 143); // SIGTERM
    }
}
