//! `redlock elect NAME -- CMD`: campaign for leadership of NAME (the library's `Election`), run
//! CMD while this process leads, stop it when leadership is lost, resign when CMD exits (as
//! `etcdctl elect` does, with a fencing token for CMD).
//!
//! CMD gets `REDLOCK_ELECTION`, `REDLOCK_CANDIDATE`, `REDLOCK_TOKEN` and `REDLOCK_VALIDITY_MS`
//! in its environment, and is run, signalled and terminated as `redlock run`'s CMD is
//! (`child.rs`).

use std::time::Duration;

use futures::FutureExt as _;
use nix::sys::signal::Signal;
use quorumlock::{Election, Error, Leadership, LostReason, Redlock};

use crate::child::{self, Ended, GroupEnd, Termination, signal_exit_code};
use crate::{EXIT_HELD, EXIT_LOST, EXIT_OS_ERROR, ElectArgs, fail, fail_with, instance_id, report};

/// Runs `redlock elect`; returns the process exit code. Every path that leads resigns (or,
/// once lost, leaves nothing of ours behind) before returning.
pub(crate) async fn elect(locks: Redlock, args: ElectArgs) -> u8 {
    let mut signals = match child::signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let candidate = args.candidate.clone().unwrap_or_else(instance_id);
    let election = match Election::builder(locks, &args.name)
        .ttl(args.ttl)
        .candidate(candidate)
        .build()
    {
        Ok(e) => e,
        Err(e) => return fail(&Error::from(e)),
    };
    let leadership = match win(&election, &args, &mut signals).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let env = [
        ("REDLOCK_ELECTION", args.name.clone()),
        ("REDLOCK_CANDIDATE", election.candidate().to_owned()),
        ("REDLOCK_TOKEN", leadership.token().get().to_string()),
        (
            "REDLOCK_VALIDITY_MS",
            leadership.validity().as_millis().to_string(),
        ),
    ];
    let running = match child::spawn(args.cmd_options(), &env) {
        Ok(running) => running,
        Err(code) => {
            resign(leadership).await;
            return code;
        }
    };
    tracing::debug!(election = %args.name, token = %leadership.token(), "CMD runs while leading");
    let ended = child::supervise(running, leadership.lost(), args.kill_after, &mut signals).await;
    end_of_term(leadership, &args, ended).await
}

/// Campaigns until elected (or `--wait` runs out, or a signal comes: then the exit code).
async fn win(
    election: &Election,
    args: &ElectArgs,
    signals: &mut child::Signals,
) -> Result<Leadership, u8> {
    let campaign = match args.wait {
        None => election.campaign().boxed(),
        Some(wait) => election.campaign_timeout(wait).boxed(),
    };
    // A signal while campaigning gives up: a term won meanwhile is resigned in the background
    // (drained before exit).
    let won = tokio::select! {
        r = campaign => r,
        sig = signals.recv() => {
            report(&interrupted(sig, &args.name));
            return Err(signal_exit_code(sig as i32));
        }
    };
    let conflict = args.conflict_exit_code.unwrap_or(EXIT_HELD);
    let leadership = match won {
        Ok(leadership) => leadership,
        // After --wait: name the leader, as `status` would, rather than "held by another owner".
        Err(e) if e.is_held() => {
            let leader = election.leader().await.ok().flatten();
            report(&still_led(&args.name, args.wait, leader.as_ref()));
            return Err(conflict);
        }
        Err(e) => return Err(fail_with(&e, conflict)),
    };
    // As for `run`: a signal delivered while the campaign was completing must not start CMD.
    tokio::task::yield_now().await;
    if let Some(sig) = signals.recv().now_or_never() {
        report(&interrupted(sig, &args.name));
        resign(leadership).await;
        return Err(signal_exit_code(sig as i32));
    }
    Ok(leadership)
}

/// The line for a campaign that gave up after `--wait` while another candidate led.
fn still_led(name: &str, wait: Option<Duration>, leader: Option<&quorumlock::Leader>) -> String {
    let waited = wait.map_or_else(String::new, |w| {
        format!(" after waiting {}", humantime::format_duration(w))
    });
    match leader {
        Some(l) => format!(
            "election {name:?} is led by {} ({}term token {}, {} left unless extended){waited}",
            l.candidate.as_deref().map_or_else(
                || "a candidate that has not published its id yet".to_owned(),
                |c| format!("{c:?}")
            ),
            l.owner
                .as_deref()
                .map_or_else(String::new, |o| format!("owner {o:?}, ")),
            l.token,
            humantime::format_duration(Duration::from_millis(
                u64::try_from(l.expires_in.as_millis()).unwrap_or(u64::MAX)
            )),
        ),
        None => format!("election {name:?} is led by another candidate{waited}"),
    }
}

/// After CMD: resigns and passes CMD's code on, or reports the loss (79) or the lost track of
/// CMD (71).
async fn end_of_term(leadership: Leadership, args: &ElectArgs, ended: Ended) -> u8 {
    match ended {
        Ended::Terminated { code, how } => lost_while_leading(leadership, args, Some(how), code),
        Ended::LostTrack { error, reaped } => {
            if reaped {
                report(&format_args!(
                    "lost track of CMD ({error}); it was killed and leadership resigned"
                ));
                resign(leadership).await;
            } else {
                report(&format_args!(
                    "lost track of CMD ({error}); it was sent SIGKILL and the term is left to \
                     expire with its ttl ({})",
                    humantime::format_duration(args.ttl)
                ));
                // Neither resign nor release: nobody else may lead while CMD might still
                // work. The process exits next, so the lease stops being extended.
                std::mem::forget(leadership);
            }
            EXIT_OS_ERROR
        }
        Ended::Exited(code) if leadership.is_lost() => {
            lost_while_leading(leadership, args, None, code)
        }
        Ended::Exited(code) => match leadership.resign().await {
            Ok(()) => code,
            // The term had ended by the time CMD exited: it did not run to its end as leader.
            Err(Error::Lost { reason, .. }) => {
                report(&lost_line(args, reason, None, code));
                EXIT_LOST
            }
            Err(e) => {
                report(&format_args!(
                    "warning: CMD finished while leading, but the resignation did not reach a \
                     quorum (the term expires with its ttl): {e}"
                ));
                code
            }
        },
    }
}

fn interrupted(sig: Signal, name: &str) -> String {
    format!("{sig} received while campaigning for {name:?}; nothing was run")
}

fn lost_while_leading(
    leadership: Leadership,
    args: &ElectArgs,
    termination: Option<(Termination, GroupEnd)>,
    code: u8,
) -> u8 {
    let reason = leadership.lost_reason().unwrap_or(LostReason::Expired);
    report(&lost_line(args, reason, termination, code));
    // Dropping the guard ends the term in the background (a no-op on the nodes once lost) and
    // tells the standbys; the exit path drains it.
    drop(leadership);
    EXIT_LOST
}

/// The one line reported when leadership was lost while CMD ran.
fn lost_line(
    args: &ElectArgs,
    reason: LostReason,
    termination: Option<(Termination, GroupEnd)>,
    code: u8,
) -> String {
    let fate = child::fate_of_cmd(termination, code, args.kill_after, args.foreground);
    format!("leadership of {:?} was lost: {reason}; {fate}", args.name)
}

/// Resigns a leadership whose CMD never ran to its end; a failure is only logged.
async fn resign(leadership: Leadership) {
    if let Err(e) = leadership.resign().await {
        tracing::warn!(error = %e, "resign failed; the term expires with its ttl");
    }
}
