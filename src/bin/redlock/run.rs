//! `redlock run`: acquire, run CMD under the lock (extending it every ttl/3), release.
//!
//! CMD is spawned directly (no shell) with stdin, stdout and stderr inherited and
//! `REDLOCK_KEY`, `REDLOCK_TOKEN`, `REDLOCK_VALIDITY_MS` added to its environment.
//!
//! As GNU timeout(1) does, CMD runs in a process group of its own, and signals are sent to that
//! whole group: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to `redlock` are forwarded to it, and
//! if the lock is lost the group gets SIGTERM, then SIGKILL after `--kill-after`, and `redlock`
//! exits 79 once nothing of the group is left (or the SIGKILL was sent). With `--foreground`,
//! CMD stays in `redlock`'s process group (it can then read from the terminal and gets the
//! terminal's signals) and only CMD itself is signalled. The lock is released once CMD has
//! exited.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use futures::FutureExt as _;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use quorumlock::{Error, Lock, LostReason, Redlock};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::{EXIT_LOST, EXIT_OS_ERROR, RunArgs, exit_code, fail, report};

/// Exit code when CMD cannot be executed (found but not runnable), as in shells and env(1).
const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code when CMD is not found, as in shells and env(1).
const EXIT_NOT_FOUND: u8 = 127;
/// After the lock was lost and CMD has exited, how often to look whether the rest of its process
/// group has gone too.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long processes get to disappear after SIGKILL before `redlock` stops waiting for them.
const KILL_GRACE: Duration = Duration::from_secs(1);
/// A deadline that never comes (about 30 years), for durations beyond the clock's range.
const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

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
    // `acquire_timeout` makes at least the rounds `acquire` makes: `--wait 0` is one try with the
    // usual short randomized retries, and a small wait never means fewer rounds.
    let acquire = locks.acquire_timeout(&args.key, args.ttl, args.wait);
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
        Err(e) => return fail(&e),
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
    let target = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .map(|pid| {
            if args.foreground {
                Target::Process(pid)
            } else {
                // CMD's pid is its process group's id (`process_group(0)` in `spawn`).
                Target::Group(pid)
            }
        });

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
                adopt_orphans(target);
                send(target, Signal::SIGTERM);
                termination = Some(Termination::Term);
                // `--kill-after` beyond the clock's range: never.
                let now = Instant::now();
                kill_timer
                    .as_mut()
                    .reset(now.checked_add(args.kill_after).unwrap_or(now + FOREVER));
            }
            () = &mut kill_timer, if termination == Some(Termination::Term) => {
                send(target, Signal::SIGKILL);
                termination = Some(Termination::Kill);
            }
            sig = signals.recv() => {
                tracing::debug!(%sig, "forwarding to CMD");
                send(target, sig);
            }
        }
    };
    let code = match status {
        Ok(status) => cmd_exit_code(status),
        Err(e) => return lost_track(child, target, lock, &e).await,
    };
    if let Some(how) = termination {
        let rest = match target {
            Some(Target::Group(group)) => {
                wait_for_group(group, how, &mut kill_timer, &mut signals).await
            }
            _ => GroupEnd::Gone,
        };
        return lost_while_running(lock, &args, Some((how, rest)), code);
    }
    if lock.is_lost() {
        return lost_while_running(lock, &args, None, code);
    }
    match lock.release().await {
        Ok(()) => code,
        // A quorum no longer held our value, or the deadline had passed: the lock lapsed while
        // CMD ran, we noticed late.
        Err(e @ Error::Lost { .. }) => {
            report(&format_args!("{e}; CMD had already exited ({code})"));
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

fn interrupted(sig: Signal, key: &str) -> String {
    format!("{sig} received while acquiring {key:?}; nothing was run")
}

/// Where the signals meant for CMD go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// CMD's own process group (the default): CMD and everything it started that stayed in it.
    Group(Pid),
    /// CMD alone (`--foreground`: CMD shares `redlock`'s process group).
    Process(Pid),
}

fn send(target: Option<Target>, sig: Signal) {
    let result = match target {
        Some(Target::Group(group)) => killpg(group, sig),
        Some(Target::Process(pid)) => kill(pid, sig),
        None => return,
    };
    if let Err(e) = result {
        // ESRCH: CMD (and its group) has just exited; the wait above will see it.
        tracing::debug!(%sig, error = %e, ?target, "could not signal CMD");
    }
}

/// How far the termination of CMD after a loss went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Termination {
    Term,
    Kill,
}

/// What became of the rest of CMD's process group after CMD exited following a loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupEnd {
    /// Nothing of it was left by the time CMD had exited, or soon after.
    Gone,
    /// Some of it outlived SIGTERM and got SIGKILL at `--kill-after`.
    Killed,
    /// Some of it was still there `KILL_GRACE` after SIGKILL (stuck in the kernel, or zombies
    /// that the process reaping them has not collected).
    Lingering,
}

/// Before the group is signalled after a loss: makes `redlock` the reaper of CMD's descendants
/// that lose their parent from now on (Linux), so that when CMD dies first, its children
/// become `redlock`'s and can be waited for, rather than linger as zombies under an init that
/// does not reap (as in many containers).
fn adopt_orphans(target: Option<Target>) {
    #[cfg(target_os = "linux")]
    if let Some(Target::Group(_)) = target
        && let Err(e) = nix::sys::prctl::set_child_subreaper(true)
    {
        tracing::debug!(error = %e, "cannot become a child subreaper");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = target;
}

/// After CMD exited following a loss: waits until nothing of its process group is left,
/// sending SIGKILL to the group when `--kill-after` has run out, and at most `KILL_GRACE`
/// after that. Signals sent to `redlock` meanwhile are forwarded to the group.
async fn wait_for_group(
    group: Pid,
    how: Termination,
    kill_timer: &mut std::pin::Pin<&mut tokio::time::Sleep>,
    signals: &mut Signals,
) -> GroupEnd {
    let mut end = GroupEnd::Gone;
    let mut killed = how == Termination::Kill;
    let mut give_up = Instant::now() + KILL_GRACE;
    loop {
        reap_group(group);
        if !group_alive(group) {
            return end;
        }
        if killed && Instant::now() >= give_up {
            return GroupEnd::Lingering;
        }
        tokio::select! {
            () = tokio::time::sleep(GROUP_POLL) => {}
            () = kill_timer.as_mut(), if !killed => {
                send(Some(Target::Group(group)), Signal::SIGKILL);
                killed = true;
                end = GroupEnd::Killed;
                give_up = Instant::now() + KILL_GRACE;
            }
            sig = signals.recv() => send(Some(Target::Group(group)), sig),
        }
    }
}

/// Whether any process is left in the group (zombies included: their parent has not reaped
/// them yet).
fn group_alive(group: Pid) -> bool {
    !matches!(killpg(group, None), Err(Errno::ESRCH))
}

/// Reaps the group's processes that became `redlock`'s children (see `adopt_orphans`). Only
/// called once CMD itself has been waited for: it would otherwise take CMD's status from tokio.
fn reap_group(group: Pid) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let members = Pid::from_raw(-group.as_raw());
    while let Ok(status) = waitpid(members, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// `child.wait()` failed: CMD's state is unknown. Kills it (its group) and reaps it if it can;
/// the lock is released only once CMD is known to be gone, otherwise left to expire with the
/// ttl, so that nobody else can take it while CMD might still be working.
async fn lost_track(
    mut child: tokio::process::Child,
    target: Option<Target>,
    lock: Lock,
    e: &io::Error,
) -> u8 {
    send(target, Signal::SIGKILL);
    let reaped = matches!(
        tokio::time::timeout(KILL_GRACE, child.wait()).await,
        Ok(Ok(_))
    );
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
fn lost_line(
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
    let after = humantime::format_duration(kill_after);
    let what = match (termination, foreground) {
        (None, _) => format!("CMD had already exited ({code})"),
        (Some((Termination::Term, _)), true) => {
            format!("CMD was sent SIGTERM and exited ({code})")
        }
        (Some((Termination::Kill, _)), true) => {
            format!("CMD ignored SIGTERM and was killed after {after}")
        }
        (Some((Termination::Term, GroupEnd::Gone)), false) => {
            format!("CMD's process group was sent SIGTERM and CMD exited ({code})")
        }
        (Some((Termination::Term, _)), false) => format!(
            "CMD's process group was sent SIGTERM and CMD exited ({code}); the rest of the group \
             ignored SIGTERM and was killed after {after}"
        ),
        (Some((Termination::Kill, _)), false) => {
            format!("CMD ignored SIGTERM and its process group was killed after {after}")
        }
    };
    let lingering = if matches!(termination, Some((_, GroupEnd::Lingering))) {
        format!(
            "; some of its processes were still there {} after SIGKILL",
            humantime::format_duration(KILL_GRACE)
        )
    } else {
        String::new()
    };
    format!("{e}; {what}{lingering}")
}

fn spawn(args: &RunArgs, lock: &Lock) -> io::Result<tokio::process::Child> {
    let (program, rest) = args
        .cmd
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("REDLOCK_KEY", &args.key)
        .env("REDLOCK_TOKEN", lock.token().get().to_string())
        .env(
            "REDLOCK_VALIDITY_MS",
            lock.validity().as_millis().to_string(),
        );
    if !args.foreground {
        // A group of its own, whose id is CMD's pid: signals reach everything CMD starts.
        command.process_group(0);
    }
    command.spawn()
}

/// Releases a lock whose CMD never ran; the failure is already reported.
async fn release(lock: Lock) {
    if let Err(e) = lock.release().await {
        tracing::warn!(error = %e, "release failed; the ttl will expire the lock");
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
    use quorumlock::NodeFailure;

    #[test]
    fn exit_codes_of_cmd() {
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(9)), 137); // SIGKILL
        assert_eq!(cmd_exit_code(ExitStatus::from_raw(15)), 143); // SIGTERM
    }

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
        let failure = NodeFailure {
            node: "redis://10.0.0.1:6379".into(),
            cause: quorumlock::NodeError::Timeout(Duration::from_millis(250)),
        };
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
