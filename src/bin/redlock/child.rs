//! CMD as a child process, for every subcommand that runs one (`run`, `run --once-per`,
//! `elect`): spawning it, forwarding signals, terminating it when what it runs under is lost
//! (SIGTERM, then SIGKILL after `--kill-after`), and its exit code.
//!
//! As GNU timeout(1) does, CMD runs in a process group of its own, and signals are sent to that
//! whole group: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to `redlock` are forwarded to it, and
//! on a loss the group gets SIGTERM, then SIGKILL after `--kill-after`, and `redlock` waits
//! until nothing of the group is left (or the SIGKILL was sent). With `--foreground`, CMD stays
//! in `redlock`'s process group (it can then read from the terminal and gets the terminal's
//! signals) and only CMD itself is signalled.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::report;

/// Exit code when CMD cannot be executed (found but not runnable), as in shells and env(1).
pub(crate) const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code when CMD is not found, as in shells and env(1).
pub(crate) const EXIT_NOT_FOUND: u8 = 127;
/// After a loss and CMD has exited, how often to look whether the rest of its process group has
/// gone too.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long processes get to disappear after SIGKILL before `redlock` stops waiting for them.
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(1);
/// A deadline that never comes (about 30 years), for durations beyond the clock's range.
const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// How CMD is started: its arguments and `--foreground`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CmdOptions<'a> {
    /// CMD and its arguments (at least one element: clap requires CMD).
    pub(crate) argv: &'a [OsString],
    /// `--foreground`: CMD stays in `redlock`'s process group and is signalled alone.
    pub(crate) foreground: bool,
}

/// A started CMD.
#[derive(Debug)]
pub(crate) struct Running {
    child: tokio::process::Child,
    target: Option<Target>,
}

/// How a supervised CMD ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// CMD exited by itself (its exit code); nothing was lost while it ran.
    Exited(u8),
    /// The loss fired while CMD ran: CMD was terminated and exited with `code`.
    Terminated {
        /// CMD's exit code (128+signal).
        code: u8,
        /// How far the termination went, and what became of the rest of CMD's group.
        how: (Termination, GroupEnd),
    },
    /// `child.wait()` failed: CMD's state is unknown. It was sent SIGKILL; `reaped` says whether
    /// it is known to be gone since.
    LostTrack {
        /// Why waiting for CMD failed.
        error: io::Error,
        /// CMD was reaped after the SIGKILL.
        reaped: bool,
    },
}

/// Starts CMD directly (no shell), with stdin, stdout and stderr inherited and `env` added to
/// its environment. On failure, reports the one line and returns the exit code (127 not
/// found, 126 cannot be executed).
pub(crate) fn spawn(cmd: CmdOptions<'_>, env: &[(&str, String)]) -> Result<Running, u8> {
    let result = cmd
        .argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))
        .and_then(|(program, rest)| {
            let mut command = tokio::process::Command::new(program);
            command.args(rest).envs(env.iter().map(|(k, v)| (k, v)));
            if !cmd.foreground {
                // A group of its own, whose id is CMD's pid: signals reach everything CMD starts.
                command.process_group(0);
            }
            command.spawn()
        });
    let child = match result {
        Ok(child) => child,
        Err(e) => {
            let name = cmd
                .argv
                .first()
                .map(|p| p.to_string_lossy())
                .unwrap_or_default();
            report(&format_args!("cannot run {name:?}: {e}"));
            return Err(if e.kind() == io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            });
        }
    };
    let target = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .map(|pid| {
            if cmd.foreground {
                Target::Process(pid)
            } else {
                // CMD's pid is its process group's id (`process_group(0)` above).
                Target::Group(pid)
            }
        });
    tracing::debug!(pid = child.id(), "CMD started");
    Ok(Running { child, target })
}

/// Waits for CMD, forwarding the signals `redlock` gets; when `lost` resolves first, terminates
/// CMD (SIGTERM, SIGKILL after `--kill-after`) and waits for the rest of its process group.
pub(crate) async fn supervise(
    running: Running,
    lost: impl Future<Output = ()>,
    kill_after: Duration,
    signals: &mut Signals,
) -> Ended {
    let Running { mut child, target } = running;
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
                    .reset(now.checked_add(kill_after).unwrap_or(now + FOREVER));
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
        Err(error) => {
            send(target, Signal::SIGKILL);
            let reaped = matches!(
                tokio::time::timeout(KILL_GRACE, child.wait()).await,
                Ok(Ok(_))
            );
            return Ended::LostTrack { error, reaped };
        }
    };
    let Some(how) = termination else {
        return Ended::Exited(code);
    };
    let rest = match target {
        Some(Target::Group(group)) => wait_for_group(group, how, &mut kill_timer, signals).await,
        _ => GroupEnd::Gone,
    };
    Ended::Terminated {
        code,
        how: (how, rest),
    }
}

/// What became of CMD after a loss, as the end of the loss line: e.g. `CMD's process group was
/// sent SIGTERM and CMD exited (143)`. `termination` is `None` when CMD had exited by itself.
pub(crate) fn fate_of_cmd(
    termination: Option<(Termination, GroupEnd)>,
    code: u8,
    kill_after: Duration,
    foreground: bool,
) -> String {
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
    format!("{what}{lingering}")
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
pub(crate) enum Termination {
    Term,
    Kill,
}

/// What became of the rest of CMD's process group after CMD exited following a loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupEnd {
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

/// [`Signals::new`], or the one line and exit 71.
pub(crate) fn signals() -> Result<Signals, u8> {
    Signals::new().map_err(|e| {
        report(&format_args!("cannot install signal handlers: {e}"));
        crate::EXIT_OS_ERROR
    })
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
