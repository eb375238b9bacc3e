//! `redlock elect NAME -- CMD`: two candidate processes, one leads and runs CMD; the other
//! takes over when the leader exits, is killed, or loses its nodes, and the lost leader's CMD
//! is stopped (t90).

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use quorumlock::testkit::LocalCluster;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::harness::*;
use crate::proxy::Proxy;
use crate::support::*;

const NAME: &str = "scheduler";
/// The flags of a leader whose term must end soon after it stops extending it.
const SHORT: &[&str] = &["--ttl", "2s"];
/// The library's debug line when a campaign finds another candidate leading (src/election.rs,
/// `next_attempt_while_held`): the event that says a candidate is standing by.
const STANDING_BY: &str = "another candidate leads; standing by";

/// `redlock [--nodes URLS] elect --candidate ID [--ttl 10s] [flags] NAME -- sh -c SCRIPT`,
/// with the script's CMD writing `"$REDLOCK_CANDIDATE $REDLOCK_TOKEN $REDLOCK_ELECTION"` to
/// `<dir>/token-<ID>` and its pid to `<dir>/pid-<ID>` before `then`.
///
/// A leader that must keep its term through the test (on a box loaded by the whole suite) gets
/// a 10 s ttl and a 1 s node timeout; one whose term must end soon passes `--ttl 2s`.
fn elect(mut cmd: Command, id: &str, flags: &[&str], dir: &Path, then: &str) -> Command {
    let script = format!(
        "echo \"$REDLOCK_CANDIDATE $REDLOCK_TOKEN $REDLOCK_ELECTION\" > {d}/token-{id}; \
         echo $$ > {d}/pid-{id}; {then}",
        d = path_str(dir),
    );
    cmd.env("REDLOCK_NODE_TIMEOUT", "1s")
        .args(["elect", "--candidate", id]);
    if !flags.contains(&"--ttl") {
        cmd.args(["--ttl", "10s"]);
    }
    cmd.args(flags).args([NAME, "--", "sh", "-c", &script]);
    cmd
}

/// `redlock` over the given node URLs (the restart guard off, as `redlock(cluster)`).
fn redlock_via(urls: &[String]) -> Command {
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "off")
        .arg("--nodes")
        .arg(urls.join(","));
    cmd
}

/// The token a candidate's CMD got, checking the rest of what it wrote.
async fn token_of(dir: &Path, id: &str) -> u64 {
    let line = line_in(&dir.join(format!("token-{id}"))).await;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [candidate, token, election] = fields.as_slice() else {
        panic!("three values: {line:?}");
    };
    assert_eq!((*candidate, *election), (id, NAME), "{line:?}");
    token.parse().expect("REDLOCK_TOKEN is a decimal u64")
}

/// Starts candidate `id` with debug logs on, and waits until it stands by behind a leader.
async fn standing_by(mut cmd: Command) -> Child {
    cmd.env("REDLOCK_LOG", "quorumlock=debug");
    let mut child = cmd.spawn().unwrap();
    stderr_until(&mut child, STANDING_BY).await;
    child
}

#[tokio::test]
async fn t90_one_leads_the_other_takes_over_when_its_cmd_exits() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let d = dir.path();
    let (stop_a, stop_b) = (file(&dir, "stop-a"), file(&dir, "stop-b"));

    let a = elect(redlock(&cluster), "a", &[], d, &wait_for_file(&stop_a))
        .spawn()
        .unwrap();
    let (_, _guard_a) = cmd_in(&d.join("pid-a")).await;
    let token_a = token_of(d, "a").await;
    // B's ttl is 60 s, so it polls every 15 s (±25 %): only the resign notice can wake it
    // within the bound below.
    let b = standing_by(elect(
        redlock(&cluster),
        "b",
        &["--ttl", "60s"],
        d,
        &format!("{}; exit 3", wait_for_file(&stop_b)),
    ))
    .await;
    assert!(!d.join("pid-b").exists(), "one leader at a time");
    assert!(
        holders(&urls, NAME) >= 3,
        "the leader holds the election's lock"
    );

    // A's CMD exits: A resigns and exits with CMD's code; B leads at once (notified).
    std::fs::write(&stop_a, "").unwrap();
    let out_a = finish(a, Instant::now()).await;
    assert_eq!(out_a.code(), 0, "{out_a:?}");
    assert_eq!(out_a.stderr, "", "{out_a:?}");
    let handover = Instant::now();
    let (_, _guard_b) = cmd_in(&d.join("pid-b")).await;
    // A's ttl is 10 s and B polls every 15 s (±25 %, so 11.25 s at the soonest): well under
    // either, B was notified. The bound leaves a loaded box seconds for B's round and for
    // starting B's CMD.
    assert!(
        handover.elapsed() < Duration::from_secs(5),
        "B took over on the resign notice, not after a poll or a ttl: {:?}",
        handover.elapsed()
    );
    let token_b = token_of(d, "b").await;
    assert!(token_b > token_a, "tokens rise: {token_a} then {token_b}");

    std::fs::write(&stop_b, "").unwrap();
    let out_b = finish(b, Instant::now()).await;
    assert_eq!(out_b.code(), 3, "CMD's own code: {out_b:?}");
    assert_eq!(holders(&urls, NAME), 0, "resigned on every node");
}

/// A leading (short ttl, through `a`'s nodes) and B standing by, each with a CMD that sleeps:
/// A's `redlock`, its CMD's pid and a guard on CMD's group, A's token, and B's `redlock`.
async fn a_leads_b_waits(
    a: Command,
    cluster: &LocalCluster,
    d: &Path,
) -> (Child, Pid, KillGroup, u64, Child) {
    let a = elect(a, "a", SHORT, d, "exec sleep 60").spawn().unwrap();
    let (cmd_a, guard_a) = cmd_in(&d.join("pid-a")).await;
    let token_a = token_of(d, "a").await;
    let b = standing_by(elect(redlock(cluster), "b", &[], d, "exec sleep 60")).await;
    (a, cmd_a, guard_a, token_a, b)
}

#[tokio::test]
async fn t91_a_killed_leader_is_replaced_after_its_ttl() {
    let cluster = cluster(5);
    let dir = scratch();
    let d = dir.path();
    let (a, cmd_a, _guard_a, token_a, b) = a_leads_b_waits(redlock(&cluster), &cluster, d).await;

    // The leader's host dies: redlock and its CMD, at once, without resigning.
    let killed = Instant::now();
    kill(pid_of(&a), Signal::SIGKILL).unwrap();
    killpg(cmd_a, Signal::SIGKILL).unwrap();
    let (cmd_b, _guard_b) = cmd_in(&d.join("pid-b")).await;
    let token_b = token_of(d, "b").await;
    assert!(token_b > token_a, "tokens rise: {token_a} then {token_b}");
    // Not before the term's keys expired (a ttl after the last extension, at most ttl/3 before
    // the kill, less the drift), and not long after (generous: a loaded machine).
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_millis(1200),
        "took over too early: {took:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "took over too late: {took:?}"
    );

    // The new leader's CMD is signalled as `run`'s is; it exits, B resigns.
    kill(pid_of(&b), Signal::SIGTERM).unwrap();
    let out = finish(b, Instant::now()).await;
    assert_eq!(
        out.code(),
        128 + 15,
        "CMD died of the forwarded SIGTERM: {out:?}"
    );
    assert!(!is_alive(cmd_b));
    assert_eq!(holders(&cluster.urls(), NAME), 0, "resigned");
}

#[tokio::test]
async fn t92_a_leader_cut_off_from_its_nodes_stops_cmd_and_the_other_takes_over() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let mut proxies = Vec::new();
    for url in &urls {
        proxies.push(Proxy::for_url(url).await.expect("proxy"));
    }
    let via: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let dir = scratch();
    let d = dir.path();
    let (a, cmd_a, _guard_a, token_a, b) = a_leads_b_waits(redlock_via(&via), &cluster, d).await;

    // A's links to every node go silent: A cannot extend its term, B still sees the nodes.
    let cut = Instant::now();
    for p in &proxies {
        p.set_blackhole(true);
    }
    let a = tokio::spawn(finish(a, cut));
    // B can take over only once A's keys have expired on a quorum; A's lost signal fires at its
    // validity's end, before that (by the drift allowance at least, and B's attempt comes a
    // random pause after the expiry), and stops A's CMD at once (`sleep` dies of SIGTERM).
    let (cmd_b, _guard_b) = cmd_in(&d.join("pid-b")).await;
    assert!(
        !is_running(cmd_a),
        "the old leader's CMD was stopped before the new leader's started"
    );
    let out_a = a.await.unwrap();
    let line = out_a.lost_line();
    assert!(
        line.starts_with("redlock: leadership of \"scheduler\" was lost: ")
            && line.contains("CMD's process group was sent SIGTERM and CMD exited (143)"),
        "{line}"
    );
    assert!(
        is_gone(cmd_a),
        "the lost leader's CMD was stopped and reaped"
    );
    // The term ends within its ttl of the cut (generous: a loaded machine).
    assert!(out_a.took < Duration::from_secs(6), "{:?}", out_a.took);

    let token_b = token_of(d, "b").await;
    assert!(token_b > token_a, "tokens rise: {token_a} then {token_b}");
    kill(pid_of(&b), Signal::SIGINT).unwrap();
    let out_b = finish(b, Instant::now()).await;
    assert_eq!(out_b.code(), 128 + 2, "{out_b:?}");
    assert!(!is_alive(cmd_b));
    for p in &proxies {
        p.heal();
    }
}

#[tokio::test]
async fn t93_wait_bounds_the_campaign_and_e_chooses_its_exit_code() {
    let cluster = cluster(5);
    let other = client(&cluster);
    let held = other
        .try_acquire(NAME, Duration::from_secs(30))
        .await
        .unwrap();
    let dir = scratch();
    let d = dir.path();
    for (flags, code) in [
        (vec!["--wait", "700ms"], 75),
        (vec!["--wait", "700ms", "-E", "3"], 3),
        (vec!["--wait", "0s", "--conflict-exit-code", "0"], 0),
    ] {
        let out = output(elect(redlock(&cluster), "b", &flags, d, "exit 9")).await;
        assert_eq!(out.code(), code, "{flags:?}: {out:?}");
        assert!(
            out.one_line_error()
                .starts_with(&format!("redlock: election {NAME:?} is led by ")),
            "{flags:?}: {out:?}"
        );
        assert!(!d.join("pid-b").exists(), "{flags:?}: CMD must not run");
    }
    held.release().await.unwrap();
}

/// A campaign that gives up after `-w` names the candidate that leads, as `status` would.
#[tokio::test]
async fn t93b_wait_names_the_leader() {
    let cluster = cluster(5);
    let dir = scratch();
    let d = dir.path();
    let a = elect(redlock(&cluster), "a", &[], d, "exec sleep 60")
        .spawn()
        .unwrap();
    let (_, _guard_a) = cmd_in(&d.join("pid-a")).await;
    let token_a = token_of(d, "a").await;
    let out = output(elect(redlock(&cluster), "b", &["-w", "0.3"], d, "exit 9")).await;
    assert_eq!(out.code(), 75, "{out:?}");
    let line = out.one_line_error();
    // The leader's owner name is its process's default, `HOST/pid PID`.
    let owner = format!("/pid {}\", term token {token_a}, ", pid_of(&a));
    assert!(
        line.starts_with(&format!(
            "redlock: election {NAME:?} is led by \"a\" (owner \""
        )) && line.contains(&owner)
            && line.ends_with("after waiting 300ms"),
        "{line}"
    );
    assert!(!d.join("pid-b").exists(), "CMD must not run");
    kill(pid_of(&a), Signal::SIGTERM).unwrap();
    let _ = finish(a, Instant::now()).await;
}

#[tokio::test]
async fn t94_a_signal_while_campaigning_runs_nothing() {
    let cluster = cluster(5);
    let other = client(&cluster);
    let held = other
        .try_acquire(NAME, Duration::from_secs(30))
        .await
        .unwrap();
    let dir = scratch();
    let d = dir.path();
    let b = standing_by(elect(redlock(&cluster), "b", &[], d, "exit 9")).await;
    let signalled = Instant::now();
    kill(pid_of(&b), Signal::SIGTERM).unwrap();
    let out = finish(b, signalled).await;
    assert_eq!(out.code(), 128 + 15, "{out:?}");
    // At once: the campaign would otherwise wait out the other's 30 s lock.
    assert!(out.took < Duration::from_secs(15), "{out:?}");
    assert!(!d.join("pid-b").exists(), "CMD never ran");
    assert!(!held.is_lost());
    held.release().await.unwrap();
}

/// The lock's key for an election is its name: `status NAME` shows the leader's term.
#[tokio::test]
async fn t95_status_shows_the_leaders_term() {
    let cluster = cluster(5);
    let dir = scratch();
    let d = dir.path();
    let stop = file(&dir, "stop");
    let a = elect(redlock(&cluster), "a", &[], d, &wait_for_file(&stop))
        .spawn()
        .unwrap();
    let (_, _guard) = cmd_in(&d.join("pid-a")).await;
    let token = token_of(d, "a").await;
    let mut cmd = redlock(&cluster);
    cmd.args(["status", NAME]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(
        // A quorum at least: a straggler's write may still be on its way (or timed out).
        out.stdout.starts_with(&format!("key {NAME:?}: held by "))
            && out
                .stdout
                .contains(&format!("highest fencing counter {token}")),
        "{}",
        out.stdout
    );
    std::fs::write(&stop, "").unwrap();
    assert_eq!(finish(a, Instant::now()).await.code(), 0);
}

#[tokio::test]
async fn t96_too_few_nodes_after_wait_exits_69_naming_them() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    for i in [0, 2, 4] {
        cluster.kill(i).unwrap();
    }
    let dir = scratch();
    let d = dir.path();
    let out = output(elect(
        redlock(&cluster),
        "a",
        &["--wait", "1s", "-E", "3"],
        d,
        "exit 9",
    ))
    .await;
    assert_eq!(out.code(), 69, "not a conflict: -E does not apply: {out:?}");
    let line = out.one_line_error();
    assert!(line.contains("too few nodes reachable"), "{line}");
    for i in [0, 2, 4] {
        assert!(line.contains(urls[i].as_str()), "names node {i}: {line}");
    }
    assert!(!d.join("pid-a").exists(), "CMD must not run");
}

#[tokio::test]
async fn t97_a_leader_paused_past_its_ttl_is_replaced_and_stops_its_cmd_when_it_resumes() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let d = dir.path();
    // A SIGKILL would come 30 s after the SIGTERM: the bound below tells the two apart.
    let a = elect(
        redlock(&cluster),
        "a",
        &["--ttl", "2s", "--kill-after", "30s"],
        d,
        "exec sleep 60",
    )
    .spawn()
    .unwrap();
    let (cmd_a, _guard_a) = cmd_in(&d.join("pid-a")).await;
    let token_a = token_of(d, "a").await;
    let b = standing_by(elect(redlock(&cluster), "b", &[], d, "exec sleep 60")).await;

    // A stops (a long GC pause, a stopped VM): B takes over once A's term expires.
    let redlock_a = pid_of(&a);
    kill(redlock_a, Signal::SIGSTOP).unwrap();
    let (cmd_b, _guard_b) = cmd_in(&d.join("pid-b")).await;
    let token_b = token_of(d, "b").await;
    assert!(token_b > token_a, "tokens rise: {token_a} then {token_b}");
    let b_value = {
        let status = client(&cluster).status(NAME).await.unwrap();
        status.holder().expect("B holds the term").to_owned()
    };

    // A resumes, finds its term lost, stops its CMD, and leaves B's term alone.
    let resumed = Instant::now();
    kill(redlock_a, Signal::SIGCONT).unwrap();
    let out = finish(a, resumed).await;
    assert_eq!(out.code(), 79, "{out:?}");
    assert!(
        out.one_line_error()
            .starts_with("redlock: leadership of \"scheduler\" was lost: "),
        "{out:?}"
    );
    assert!(is_gone(cmd_a), "the old leader's CMD was stopped");
    assert!(
        out.took < Duration::from_secs(15),
        "at once: {:?}",
        out.took
    );
    assert!(is_running(cmd_b), "the new leader's CMD runs on");
    let still = urls
        .iter()
        .filter(|u| value_on(u, NAME).as_deref() == Some(b_value.as_str()))
        .count();
    assert!(still >= 3, "B's term is untouched: on {still} nodes");

    kill(pid_of(&b), Signal::SIGTERM).unwrap();
    let out = finish(b, Instant::now()).await;
    assert_eq!(out.code(), 128 + 15, "{out:?}");
}
