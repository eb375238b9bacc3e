//! The `redlock` binary driven as a user would, against real 5-node clusters: every exit code
//! of the contract, every environment variable, lock loss while CMD runs, signal forwarding,
//! nodes killed and hung, `status` and `demo`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid};
use quorumlock::testkit::LocalCluster;
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

const BIN: &str = env!("CARGO_BIN_EXE_redlock");
/// Upper bound for one `redlock` run in these tests (each normally takes well under a second).
const RUN_LIMIT: Duration = Duration::from_secs(30);
/// How long a demo test waits for `redlock demo` before giving up. Above the contract's minute
/// (`DEMO_CONTRACT`), so that a slow demo fails the timing assertion, with its output, rather
/// than this bound.
const DEMO_LIMIT: Duration = Duration::from_secs(90);
/// The contract: `redlock demo` finishes by itself in under a minute.
const DEMO_CONTRACT: Duration = Duration::from_secs(60);
/// A shell loop bound for CMDs that wait: `seq 400` steps of 50 ms, 20 s at most, so that no
/// CMD outlives a failed test for long even if its guard cannot reach it.
const STEPS: &str = "$(seq 400)";
const KEY: &str = "job";

/// `redlock --nodes <cluster>`, with no `REDLOCK_*` inherited from the caller and the restart
/// guard off: every test starts a fresh cluster, which the strict default (tested on its own,
/// t80..) holds out for one max ttl.
fn redlock(cluster: &LocalCluster) -> Command {
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "off")
        .arg("--nodes")
        .arg(cluster.urls().join(","));
    cmd
}

/// `redlock` with a clean environment and captured output.
fn bare() -> Command {
    init_tracing();
    let mut cmd = Command::new(BIN);
    for var in [
        "REDLOCK_NODES",
        "REDLOCK_NODE_TIMEOUT",
        "REDLOCK_RESTART_GUARD",
        "REDLOCK_MAX_TTL",
        "REDLOCK_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[derive(Debug)]
struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Outcome {
    fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("redlock died of a signal: {self:?}"))
    }

    /// The contract: a failure is one line on stderr, prefixed `redlock: `.
    fn one_line_error(&self) -> &str {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self:?}");
        assert!(lines[0].starts_with("redlock: "), "{self:?}");
        lines[0]
    }
}

async fn output(mut cmd: Command) -> Outcome {
    let child = cmd.spawn().expect("spawn redlock");
    finish(child, Instant::now()).await
}

async fn finish(child: Child, started: Instant) -> Outcome {
    finish_within(child, started, RUN_LIMIT).await
}

async fn finish_within(child: Child, started: Instant, limit: Duration) -> Outcome {
    let out = timeout(limit, child.wait_with_output())
        .await
        .expect("redlock exits in time")
        .expect("wait for redlock");
    Outcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

/// `run [flags] KEY -- sh -c SCRIPT`.
fn run_sh(mut cmd: Command, flags: &[&str], script: &str) -> Command {
    cmd.arg("run")
        .args(flags)
        .args([KEY, "--", "sh", "-c", script]);
    cmd
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

/// Waits until `path` holds a full line, and returns it.
async fn line_in(path: &Path) -> String {
    wait_until(WAIT, &format!("a line in {}", path.display()), || async {
        std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    std::fs::read_to_string(path)
        .expect("read")
        .trim()
        .to_owned()
}

async fn pid_in(path: &Path) -> Pid {
    Pid::from_raw(line_in(path).await.parse().expect("a pid"))
}

/// Kills a process group when dropped, so that a failing test leaves no CMD behind:
/// `kill_on_drop` kills `redlock`, not CMD (which runs in a process group of its own, whose id
/// is CMD's pid).
#[must_use]
struct KillGroup(Pid);

impl Drop for KillGroup {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

/// Kills one process when dropped (a CMD's child that may have left CMD's group).
#[must_use]
struct KillProcess(Pid);

impl Drop for KillProcess {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
    }
}

/// CMD's pid from its pidfile, and a guard that kills its process group.
async fn cmd_in(path: &Path) -> (Pid, KillGroup) {
    let pid = pid_in(path).await;
    (pid, KillGroup(pid))
}

/// True when no process has this pid (not even a zombie).
fn is_gone(pid: Pid) -> bool {
    kill(pid, None) == Err(Errno::ESRCH)
}

/// True when the process exists and has not exited: a zombie (exited, not yet reaped by its
/// parent) does not count. Orphans here may be reparented to an init that never reaps them
/// (as in many containers), so a process that died can stay a zombie for good.
fn is_running(pid: Pid) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ...": comm may hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// A `sh` loop that waits (bounded) until `path` exists.
fn wait_for_file(path: &Path) -> String {
    format!(
        "for i in {STEPS}; do [ -e {p} ] && break; sleep 0.05; done",
        p = path_str(path)
    )
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid"))
}

fn is_alive(pid: Pid) -> bool {
    !is_gone(pid)
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// Reads `child`'s stderr until a line containing `needle` (bounded); returns what was read.
/// The rest of stderr is closed: `redlock` must not mind.
async fn stderr_until(child: &mut Child, needle: &str) -> String {
    let stderr = child.stderr.take().expect("piped stderr");
    read_until(&mut BufReader::new(stderr).lines(), needle).await
}

/// Reads lines until one contains `needle` (bounded); returns what was read.
async fn read_until<R: AsyncRead + Unpin>(lines: &mut Lines<BufReader<R>>, needle: &str) -> String {
    let mut seen = String::new();
    let found = timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "{needle:?} in the output; saw:\n{seen}");
    seen
}

/// The library's debug line for a retried acquisition round (src/redlock.rs, `acquire_with`).
const RETRYING: &str = "retrying acquisition";

/// SIGSTOPs `redlock` and waits until its keys have expired on every node.
async fn stop_past_its_ttl(redlock: Pid, urls: &[String]) {
    kill(redlock, Signal::SIGSTOP).unwrap();
    wait_until(WAIT, "the stopped holder's keys expire", || async {
        holders(urls, KEY) == 0
    })
    .await;
}

// ---- t10: CMD runs under the lock ---------------------------------------------------------

#[tokio::test]
async fn t10_exits_with_cmds_code_and_leaves_no_key_behind() {
    let cluster = cluster(5);
    let urls = cluster.urls();

    let ok = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(ok.code(), 0, "{ok:?}");
    assert_eq!(ok.stderr, "", "silent on success");
    assert_eq!(
        holders(&urls, KEY),
        0,
        "released on every node before exiting"
    );

    let seven = output(run_sh(redlock(&cluster), &[], "exit 7")).await;
    assert_eq!(seven.code(), 7, "{seven:?}");
    assert_eq!(seven.stderr, "");
    assert_eq!(holders(&urls, KEY), 0);
}

#[tokio::test]
async fn t11_cmd_gets_key_token_and_validity_in_its_environment() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let script = r#"echo "$REDLOCK_KEY $REDLOCK_TOKEN $REDLOCK_VALIDITY_MS""#;
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let out = output(run_sh(redlock(&cluster), &["--ttl", "10s"], script)).await;
        assert_eq!(out.code(), 0, "{out:?}");
        let fields: Vec<&str> = out.stdout.split_whitespace().collect();
        let [key, token, validity] = fields.as_slice() else {
            panic!("three values: {out:?}");
        };
        assert_eq!(*key, KEY);
        let token: u64 = token.parse().expect("REDLOCK_TOKEN is a decimal u64");
        let validity: u64 = validity.parse().expect("REDLOCK_VALIDITY_MS is decimal");
        assert!(
            validity > 9_000 && validity <= 10_000,
            "validity left at start: {validity} ms"
        );
        // The token is the key's fencing counter, which stands at or above it on a quorum.
        let fences: Vec<u64> = urls.iter().map(|u| fence_on(u, KEY)).collect();
        assert!(
            fences.iter().filter(|&&f| f >= token).count() >= 3,
            "token {token}, counters {fences:?}"
        );
        tokens.push(token);
    }
    assert!(tokens[1] > tokens[0], "tokens rise: {tokens:?}");
}

#[tokio::test]
async fn t12_nodes_come_from_redlock_nodes_when_no_flag_is_given() {
    let cluster = cluster(5);
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "off")
        .env("REDLOCK_NODES", cluster.urls().join(","));
    let out = output(run_sh(cmd, &[], "exit 3")).await;
    assert_eq!(out.code(), 3, "{out:?}");

    // The flag wins over the variable.
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_NODES", "redis://127.0.0.1:1");
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 0, "{out:?}");
}

#[tokio::test]
async fn t13_cmd_runs_without_a_shell_and_inherits_stdio() {
    let cluster = cluster(5);

    // No shell: `$REDLOCK_KEY` and `*` reach CMD as written.
    let mut cmd = redlock(&cluster);
    cmd.args(["run", KEY, "--", "printf", "%s|%s", "$REDLOCK_KEY", "*"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.stdout, "$REDLOCK_KEY|*");

    // stdin, stdout and stderr are CMD's own.
    let mut cmd = run_sh(redlock(&cluster), &[], "cat; echo to-stderr >&2");
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"hello from stdin\n").await.unwrap();
    drop(stdin);
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.stdout, "hello from stdin\n");
    assert_eq!(out.stderr, "to-stderr\n");
}

#[tokio::test]
async fn t14_cmd_killed_by_a_signal_gives_128_plus_the_signal() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let killed = output(run_sh(redlock(&cluster), &[], "kill -KILL $$")).await;
    assert_eq!(killed.code(), 128 + 9, "{killed:?}");
    let termed = output(run_sh(redlock(&cluster), &[], "kill -TERM $$")).await;
    assert_eq!(termed.code(), 128 + 15, "{termed:?}");
    assert_eq!(holders(&urls, KEY), 0);
}

#[tokio::test]
async fn t15_cmd_that_cannot_be_run_exits_127_or_126_and_releases() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let mut cmd = redlock(&cluster);
    cmd.args(["run", KEY, "--", "/nonexistent/quorumlock-cmd"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 127, "not found: {out:?}");
    assert!(out.one_line_error().contains("cannot run"), "{out:?}");
    assert_eq!(holders(&urls, KEY), 0);

    // Found, but not executable: a file without the execute bit, and a directory.
    let dir = scratch();
    let script = file(&dir, "not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    for path in [path_str(&script), path_str(dir.path())] {
        let mut cmd = redlock(&cluster);
        cmd.args(["run", KEY, "--", path]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 126, "cannot execute {path}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains("cannot run") && line.contains(path), "{line}");
        assert_eq!(holders(&urls, KEY), 0);
    }
}

// ---- t20: usage errors -----------------------------------------------------------------------

#[tokio::test]
async fn t20_usage_errors_exit_64_with_one_line_and_run_nothing() {
    let cluster = cluster(5);
    let dir = scratch();
    let marker = file(&dir, "ran");
    let script = format!("touch {}", path_str(&marker));
    let nodes = cluster.urls().join(",");

    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "bad flag",
            vec!["--nodes", &nodes, "run", "--bogus"],
            "--bogus",
        ),
        (
            "bad duration",
            vec!["--nodes", &nodes, "run", "--ttl", "5parsecs"],
            "5parsecs",
        ),
        (
            "bad wait",
            vec!["--nodes", &nodes, "run", "--wait", "soon"],
            "soon",
        ),
        (
            "bad node URL",
            vec!["--nodes", "http://127.0.0.1:1", "run"],
            "invalid node URL",
        ),
        (
            "same node twice",
            vec!["--nodes", "redis://127.0.0.1:1,redis://127.0.0.1:1", "run"],
            "listed twice",
        ),
        ("no nodes", vec!["run"], "no nodes given"),
        (
            "empty node list",
            vec!["--nodes", ",", "run"],
            "no nodes given",
        ),
        (
            "ttl within the drift",
            vec!["--nodes", &nodes, "run", "--ttl", "1ms"],
            "ttl",
        ),
    ];
    for (what, args, needle) in cases {
        let mut cmd = bare();
        cmd.args(&args).args([KEY, "--", "sh", "-c", &script]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "{what}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains(needle), "{what}: {line:?} names {needle:?}");
        assert!(!marker.exists(), "{what}: CMD must not run");
    }

    for (what, args) in [
        ("no subcommand", vec![]),
        ("no CMD", vec!["--nodes", nodes.as_str(), "run", KEY]),
        ("no KEY", vec!["--nodes", nodes.as_str(), "run"]),
        (
            "empty KEY",
            vec!["--nodes", nodes.as_str(), "run", "", "--", "true"],
        ),
        ("unknown subcommand", vec!["lock", KEY]),
    ] {
        let mut cmd = bare();
        cmd.args(&args);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "{what}: {out:?}");
        out.one_line_error();
    }

    let mut help = bare();
    help.arg("--help");
    let help = output(help).await;
    assert_eq!(help.code(), 0);
    assert!(help.stdout.contains("Exit codes"), "{help:?}");
}

#[tokio::test]
async fn t21_every_duration_is_bounded_and_huge_ones_exit_64_not_a_panic() {
    let cluster = cluster(5);
    let dir = scratch();
    let marker = file(&dir, "ran");
    let script = format!("touch {}", path_str(&marker));
    let nodes = cluster.urls().join(",");
    let huge = "300000000000y";

    /// What, flags, variables, what the line names.
    type Case<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        ("huge --ttl", vec!["--ttl", huge], vec![], "--ttl"),
        (
            "--ttl over 49 days",
            vec!["--ttl", "50days"],
            vec![],
            "--ttl",
        ),
        ("huge --wait", vec!["--wait", huge], vec![], "--wait"),
        (
            "huge --kill-after",
            vec!["--kill-after", huge],
            vec![],
            "--kill-after",
        ),
        (
            "--kill-after over a day",
            vec!["--kill-after", "25h"],
            vec![],
            "--kill-after",
        ),
        (
            "huge --max-ttl",
            vec!["--max-ttl", huge],
            vec![],
            "--max-ttl",
        ),
        (
            "huge REDLOCK_MAX_TTL",
            vec![],
            vec![("REDLOCK_MAX_TTL", huge)],
            "--max-ttl",
        ),
        (
            "huge --node-timeout",
            vec!["--node-timeout", huge],
            vec![],
            "--node-timeout",
        ),
        (
            "huge REDLOCK_NODE_TIMEOUT",
            vec![],
            vec![("REDLOCK_NODE_TIMEOUT", huge)],
            "--node-timeout",
        ),
        (
            "--node-timeout over an hour",
            vec!["--node-timeout", "61m"],
            vec![],
            "--node-timeout",
        ),
        (
            "zero --node-timeout",
            vec!["--node-timeout", "0s"],
            vec![],
            "node timeout",
        ),
        (
            "overflowing number",
            vec!["--ttl", "99999999999999999999999y"],
            vec![],
            "--ttl",
        ),
    ];
    for (what, flags, vars, needle) in cases {
        let mut cmd = bare();
        cmd.env("REDLOCK_RESTART_GUARD", "off")
            .envs(vars)
            .args(["--nodes", &nodes, "run"])
            .args(&flags)
            .args([KEY, "--", "sh", "-c", &script]);
        let out = output(cmd).await;
        assert_eq!(out.code(), 64, "{what}: {out:?}");
        let line = out.one_line_error();
        assert!(line.contains(needle), "{what}: {line:?} names {needle:?}");
        assert!(!marker.exists(), "{what}: CMD must not run");
    }

    // The largest values accepted still work.
    let mut cmd = redlock(&cluster);
    cmd.args(["--node-timeout", "1h", "run", "--ttl", "4294967295ms"])
        .args(["--wait", "365days", "--kill-after", "1day"])
        .args([KEY, "--", "sh", "-c", "exit 4"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 4, "{out:?}");
}

// ---- t30: nodes killed and hung -----------------------------------------------------------

#[tokio::test]
async fn t30_three_of_five_killed_exits_69_naming_each_failed_node() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    for i in [0, 2, 4] {
        cluster.kill(i).unwrap();
    }
    let dir = scratch();
    let marker = file(&dir, "ran");
    let out = output(run_sh(
        redlock(&cluster),
        &[],
        &format!("touch {}", path_str(&marker)),
    ))
    .await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    assert!(line.contains("too few nodes reachable"), "{line}");
    for i in [0, 2, 4] {
        assert!(
            line.contains(&format!("{}: connection refused", urls[i])),
            "names node {i} and why: {line}"
        );
    }
    assert!(!marker.exists(), "CMD must not run");
    assert_eq!(holders(&[urls[1].clone(), urls[3].clone()], KEY), 0);
}

#[tokio::test]
async fn t31_two_of_five_killed_still_runs_cmd() {
    let mut cluster = cluster(5);
    cluster.kill(1).unwrap();
    cluster.kill(3).unwrap();
    let out = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(out.code(), 0, "{out:?}");
}

#[tokio::test]
async fn t32_two_of_five_hung_still_runs_cmd_and_exits_promptly() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    cluster.pause(0).unwrap();
    cluster.pause(3).unwrap();
    let out = output(run_sh(redlock(&cluster), &[], "exit 5")).await;
    assert_eq!(out.code(), 5, "{out:?}");
    // Hung nodes cost about a node timeout (default 250 ms: redlock lets its releases to them
    // run out before exiting), not the ttl (30 s).
    assert!(out.took < Duration::from_secs(10), "took {:?}", out.took);
    let live = [urls[1].clone(), urls[2].clone(), urls[4].clone()];
    assert_eq!(holders(&live, KEY), 0, "released on the live nodes");

    // REDLOCK_NODE_TIMEOUT sets that bound (cut at 1 s here, when the connects to the hung
    // nodes give up).
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_NODE_TIMEOUT", "1500ms");
    let out = output(run_sh(cmd, &[], "exit 5")).await;
    assert_eq!(out.code(), 5, "{out:?}");
    assert!(
        out.took >= Duration::from_millis(900),
        "took {:?}",
        out.took
    );
    cluster.resume(0).unwrap();
    cluster.resume(3).unwrap();
}

#[tokio::test]
async fn t33_three_of_five_hung_exits_69_naming_the_timeouts() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    for i in 0..3 {
        cluster.pause(i).unwrap();
    }
    let out = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    for url in &urls[..3] {
        assert!(
            line.contains(&format!("{url}: timed out")),
            "names {url} and why: {line}"
        );
    }
    for i in 0..3 {
        cluster.resume(i).unwrap();
    }
}

#[tokio::test]
async fn t34_two_of_five_killed_or_hung_while_cmd_runs_cmd_finishes_under_the_lock() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, go) = (file(&dir, "pid"), file(&dir, "go"));
    // CMD outlives two ttls after the nodes fail: the lock must be extended on the other three.
    let script = format!(
        "echo $$ > {}; {}; sleep 3.5; exit 6",
        path_str(&pidfile),
        wait_for_file(&go)
    );
    let child = run_sh(redlock(&cluster), &["--ttl", "1500ms"], &script)
        .spawn()
        .unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    cluster.kill(0).unwrap();
    cluster.pause(1).unwrap();
    std::fs::write(&go, "").unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 6, "CMD's own code: {out:?}");
    assert_eq!(out.stderr, "", "{out:?}");
    assert!(out.took >= Duration::from_millis(3500), "{:?}", out.took);
    assert_eq!(holders(&urls[2..], KEY), 0, "released on the live nodes");
    cluster.resume(1).unwrap();
}

#[tokio::test]
async fn t35_three_of_five_hung_while_cmd_runs_exits_79_once_validity_runs_out() {
    let mut cluster = cluster(5);
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!("echo $$ > {}; exec sleep 60", path_str(&pidfile));
    let ttl = Duration::from_secs(3);
    let child = run_sh(redlock(&cluster), &["--ttl", "3s"], &script)
        .spawn()
        .unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    let paused = Instant::now();
    for i in 0..3 {
        cluster.pause(i).unwrap();
    }
    let out = finish(child, paused).await;
    assert_eq!(out.code(), 79, "{out:?}");
    let line = out.one_line_error();
    assert!(
        line.contains("was lost") && line.contains("SIGTERM"),
        "{line}"
    );
    assert!(!is_alive(cmd_pid), "CMD was terminated");
    // Not before the validity left at the pause (at least ttl*2/3, less a round and the
    // drift), and not long after the whole ttl (generous: a loaded machine).
    assert!(
        out.took >= Duration::from_secs(1),
        "lost too early: {:?}",
        out.took
    );
    assert!(
        out.took < ttl + Duration::from_secs(6),
        "lost too late: {:?}",
        out.took
    );
    for i in 0..3 {
        cluster.resume(i).unwrap();
    }
}

// ---- t40: held by another owner -------------------------------------------------------------

#[tokio::test]
async fn t40_held_by_another_owner_exits_75_without_running_cmd() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let other = client(&cluster);
    let held = other
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .unwrap();
    let dir = scratch();
    let marker = file(&dir, "ran");
    let script = format!("touch {}", path_str(&marker));

    let out = output(run_sh(redlock(&cluster), &[], &script)).await;
    assert_eq!(out.code(), 75, "{out:?}");
    assert!(
        out.one_line_error().contains("held by another owner"),
        "{out:?}"
    );

    let out = output(run_sh(redlock(&cluster), &["--wait", "700ms"], &script)).await;
    assert_eq!(out.code(), 75, "{out:?}");
    // It stops when the next round would start after --wait (pauses are up to 150 ms).
    assert!(
        out.took >= Duration::from_millis(550),
        "kept trying for --wait: {out:?}"
    );
    assert!(!marker.exists(), "CMD must not run");

    assert!(!held.is_lost());
    assert!(holders(&urls, KEY) >= 3);
    held.release()
        .await
        .expect("the other owner's lock was left alone");
}

#[tokio::test]
async fn t41_wait_takes_the_lock_once_the_holder_releases() {
    let cluster = cluster(5);
    let other = client(&cluster);
    let held = other
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .unwrap();
    let mut cmd = run_sh(
        redlock(&cluster),
        &["--wait", "20s"],
        r#"echo "$REDLOCK_TOKEN""#,
    );
    // Coupled to the library's debug line for a retried round (src/redlock.rs,
    // `acquire_with`): the event that says redlock is waiting, not just started.
    cmd.env("REDLOCK_LOG", "quorumlock=debug");
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    stderr_until(&mut child, RETRYING).await;
    let first = held.token().get();
    held.release().await.unwrap();
    let out = finish(child, started).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let token: u64 = out.stdout.trim().parse().expect("a token");
    assert!(token > first, "{token} after the first holder's {first}");
}

#[tokio::test]
async fn t42_a_failed_attempt_leaves_none_of_its_keys_behind() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    for url in &urls[..3] {
        set_foreign(url, KEY, "someone-else", Duration::from_secs(30));
    }
    let out = output(run_sh(redlock(&cluster), &[], "exit 0")).await;
    assert_eq!(out.code(), 75, "{out:?}");
    // The free nodes said yes to some attempt; those keys are gone when redlock exits.
    for url in &urls[3..] {
        assert_eq!(value_on(url, KEY), None, "{url}");
    }
    for url in &urls[..3] {
        assert_eq!(value_on(url, KEY).as_deref(), Some("someone-else"));
    }
}

#[tokio::test]
async fn t43_wait_0_and_small_waits_make_at_least_acquires_rounds() {
    let cluster = cluster(5);
    let other = client(&cluster);
    let held = other
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .unwrap();
    let rounds = 1 + quorumlock::RedlockBuilder::DEFAULT_RETRY_COUNT as usize;
    for wait in ["0s", "1ms", "100ms"] {
        let mut cmd = run_sh(redlock(&cluster), &["--wait", wait], "exit 0");
        // Coupled to the library's debug line for a retried round (src/redlock.rs,
        // `acquire_with`): one per round after the first.
        cmd.env("REDLOCK_LOG", "quorumlock=debug");
        let out = output(cmd).await;
        assert_eq!(out.code(), 75, "--wait {wait}: {out:?}");
        let retries = out.stderr.matches(RETRYING).count();
        assert!(
            retries + 1 >= rounds,
            "--wait {wait}: {} rounds, acquire makes {rounds}: {out:?}",
            retries + 1
        );
        if wait == "0s" {
            assert_eq!(retries + 1, rounds, "--wait 0 is acquire: {out:?}");
        }
        let last = out.stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("redlock: ") && last.contains("held by another owner"),
            "{out:?}"
        );
    }
    held.release().await.unwrap();
}

// ---- t50: the lock lost while CMD runs --------------------------------------------------------

#[tokio::test]
async fn t50_paused_past_its_ttl_exits_79_after_terminating_cmd() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!("echo $$ > {}; exec sleep 60", path_str(&pidfile));
    let child = run_sh(redlock(&cluster), &["--ttl", "2s"], &script)
        .spawn()
        .unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    let redlock_pid = pid_of(&child);

    stop_past_its_ttl(redlock_pid, &urls).await;
    let other = client(&cluster);
    let taken = other
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .expect("another client takes the expired lock");
    let held_before = holders(&urls, KEY);
    let resumed = Instant::now();
    kill(redlock_pid, Signal::SIGCONT).unwrap();
    let out = finish(child, resumed).await;

    assert_eq!(out.code(), 79, "{out:?}");
    let line = out.one_line_error();
    assert!(
        line.contains("was lost") && line.contains("SIGTERM"),
        "{line}"
    );
    assert!(!is_alive(cmd_pid), "CMD was terminated");
    assert!(
        out.took < Duration::from_secs(4),
        "SIGTERM was enough, no --kill-after wait: {:?}",
        out.took
    );
    // The new owner's lock was not touched by the old holder's cleanup: its value is still on
    // every node that had it, and it extends and releases as the owner.
    let held_after = holders(&urls, KEY);
    assert!(
        held_after >= held_before.max(3),
        "{held_before} nodes held the new owner's value, {held_after} after redlock exited"
    );
    taken
        .extend(Duration::from_secs(30))
        .await
        .expect("still ours");
    taken.release().await.expect("still ours");
}

#[tokio::test]
async fn t52_cmd_that_finished_while_redlock_was_stopped_past_its_ttl_still_exits_79() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, go, done) = (file(&dir, "pid"), file(&dir, "go"), file(&dir, "done"));
    // CMD finishes only once told to, after redlock has been stopped past its ttl.
    let script = format!(
        "echo $$ > {}; {}; echo done > {}",
        path_str(&pidfile),
        wait_for_file(&go),
        path_str(&done)
    );
    let child = run_sh(redlock(&cluster), &["--ttl", "2s"], &script)
        .spawn()
        .unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    let redlock_pid = pid_of(&child);
    stop_past_its_ttl(redlock_pid, &urls).await;
    std::fs::write(&go, "").unwrap();
    line_in(&done).await;
    kill(redlock_pid, Signal::SIGCONT).unwrap();
    let out = finish(child, Instant::now()).await;
    // CMD's 0 would claim it ran to its end under the lock; it did not.
    assert_eq!(out.code(), 79, "{out:?}");
    assert!(
        out.one_line_error().contains("CMD had already exited (0)"),
        "{out:?}"
    );
}

#[tokio::test]
async fn t51_cmd_ignoring_sigterm_is_killed_after_kill_after() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; for i in {STEPS}; do sleep 0.05; done",
        path_str(&pidfile)
    );
    let child = run_sh(
        redlock(&cluster),
        &["--ttl", "3s", "--kill-after", "1500ms"],
        &script,
    )
    .spawn()
    .unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    // Another owner overwrites the key everywhere: the next extension finds it is not ours.
    let taken = Instant::now();
    for url in &urls {
        set_foreign(url, KEY, "usurper", Duration::from_secs(30));
    }
    let out = finish(child, taken).await;
    assert_eq!(out.code(), 79, "{out:?}");
    let line = out.one_line_error();
    assert!(
        line.contains("was lost") && line.contains("killed after 1s 500ms"),
        "{line}"
    );
    assert!(out.took >= Duration::from_millis(1500), "{:?}", out.took);
    assert!(!is_alive(cmd_pid), "CMD was killed");
    for url in &urls {
        assert_eq!(value_on(url, KEY).as_deref(), Some("usurper"), "left alone");
    }
}

#[tokio::test]
async fn t53_cmd_outliving_the_ttl_keeps_the_lock_and_exits_with_its_code() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, token, mid) = (file(&dir, "pid"), file(&dir, "token"), file(&dir, "mid"));
    // Runs past two ttls; once past the first, another client tries to take the lock.
    let script = format!(
        "echo $$ > {}; echo $REDLOCK_TOKEN > {}; sleep 2; echo > {}; sleep 2; exit 6",
        path_str(&pidfile),
        path_str(&token),
        path_str(&mid)
    );
    let child = run_sh(redlock(&cluster), &["--ttl", "1500ms"], &script)
        .spawn()
        .unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    let ours: u64 = line_in(&token).await.parse().unwrap();
    let other = client(&cluster);
    // Past the first ttl: only extensions can have kept the lock.
    line_in(&mid).await;
    let err = other
        .try_acquire(KEY, Duration::from_secs(10))
        .await
        .expect_err("still held by redlock");
    assert!(err.is_held(), "{err}");
    let out = finish(child, Instant::now()).await;
    assert_eq!(
        out.code(),
        6,
        "CMD's own code: keep-alive held the lock: {out:?}"
    );
    assert_eq!(out.stderr, "", "{out:?}");
    assert_eq!(holders(&urls, KEY), 0, "released");
    let next = other
        .try_acquire(KEY, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(next.token().get() > ours);
    next.release().await.unwrap();
}

#[tokio::test]
async fn t56_on_loss_cmds_whole_process_group_is_terminated() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, gpidfile) = (file(&dir, "pid"), file(&dir, "gpid"));
    // A CMD that forks: the grandchild works on after CMD unless its group is signalled. (Its
    // output goes elsewhere so that, if it survives, this test fails on the checks below rather
    // than waiting for redlock's output pipes to close.)
    let script = format!(
        "sleep 300 >/dev/null 2>&1 & echo $! > {}; echo $$ > {}; wait",
        path_str(&gpidfile),
        path_str(&pidfile)
    );
    let child = run_sh(redlock(&cluster), &["--ttl", "3s"], &script)
        .spawn()
        .unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    let grandchild = pid_in(&gpidfile).await;
    let _grandchild_guard = KillProcess(grandchild);
    assert_eq!(
        getpgid(Some(cmd_pid)),
        Ok(cmd_pid),
        "CMD leads its own group"
    );
    assert_eq!(getpgid(Some(grandchild)), Ok(cmd_pid), "in CMD's group");

    let taken = Instant::now();
    for url in &urls {
        set_foreign(url, KEY, "usurper", Duration::from_secs(30));
    }
    let out = finish(child, taken).await;
    assert_eq!(out.code(), 79, "{out:?}");
    let line = out.one_line_error();
    assert!(
        line.contains("was lost: a quorum no longer holds our value")
            && line.contains("CMD's process group was sent SIGTERM"),
        "{line}"
    );
    // redlock waited for the whole group (and reaped what was left to it).
    assert!(is_gone(cmd_pid), "CMD is gone");
    assert!(is_gone(grandchild), "the grandchild is gone too");
    assert!(
        out.took < Duration::from_secs(4),
        "SIGTERM was enough: {:?}",
        out.took
    );
}

#[tokio::test]
async fn t57_on_loss_a_grandchild_ignoring_sigterm_is_killed_after_kill_after() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, gpidfile) = (file(&dir, "pid"), file(&dir, "gpid"));
    // CMD itself exits on SIGTERM; its child ignores it (an ignored signal stays ignored
    // across exec).
    let script = format!(
        "(trap '' TERM; exec sleep 300 >/dev/null 2>&1) & echo $! > {}; echo $$ > {}; wait",
        path_str(&gpidfile),
        path_str(&pidfile)
    );
    let child = run_sh(
        redlock(&cluster),
        &["--ttl", "3s", "--kill-after", "1500ms"],
        &script,
    )
    .spawn()
    .unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    let grandchild = pid_in(&gpidfile).await;
    let _grandchild_guard = KillProcess(grandchild);

    let taken = Instant::now();
    for url in &urls {
        set_foreign(url, KEY, "usurper", Duration::from_secs(30));
    }
    let out = finish(child, taken).await;
    assert_eq!(out.code(), 79, "{out:?}");
    let line = out.one_line_error();
    assert!(
        line.contains("CMD exited (143)")
            && line.contains("the rest of the group ignored SIGTERM and was killed after 1s 500ms"),
        "{line}"
    );
    assert!(out.took >= Duration::from_millis(1500), "{:?}", out.took);
    assert!(is_gone(cmd_pid), "CMD is gone");
    assert!(is_gone(grandchild), "the grandchild was killed and reaped");
}

#[tokio::test]
async fn t58_foreground_keeps_cmd_in_redlocks_group_and_signals_cmd_alone() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, gpidfile) = (file(&dir, "pid"), file(&dir, "gpid"));
    // The grandchild, which outlives redlock here, must not hold its output pipes open.
    let script = format!(
        "sleep 300 >/dev/null 2>&1 & echo $! > {}; echo $$ > {}; wait",
        path_str(&gpidfile),
        path_str(&pidfile)
    );
    let mut cmd = run_sh(redlock(&cluster), &["--ttl", "3s", "--foreground"], &script);
    // redlock leads a group of its own here, so that CMD's group is not this test's.
    cmd.process_group(0);
    let child = cmd.spawn().unwrap();
    let redlock_pid = pid_of(&child);
    let _guard = KillGroup(redlock_pid);
    let cmd_pid = pid_in(&pidfile).await;
    let grandchild = pid_in(&gpidfile).await;
    let _grandchild_guard = KillProcess(grandchild);
    assert_eq!(
        getpgid(Some(cmd_pid)),
        Ok(redlock_pid),
        "CMD in redlock's group"
    );

    let taken = Instant::now();
    for url in &urls {
        set_foreign(url, KEY, "usurper", Duration::from_secs(30));
    }
    let out = finish(child, taken).await;
    assert_eq!(out.code(), 79, "{out:?}");
    let line = out.one_line_error();
    assert!(
        line.contains("CMD was sent SIGTERM and exited (143)"),
        "{line}"
    );
    assert!(!is_running(cmd_pid), "CMD was terminated");
    // The documented cost of --foreground: what CMD started is not signalled.
    assert!(is_running(grandchild), "only CMD itself was signalled");
}

// ---- t60: signals ---------------------------------------------------------------------------

#[tokio::test]
async fn t60_sigterm_is_forwarded_and_the_lock_released_after_cmd_exits() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, got, go) = (file(&dir, "pid"), file(&dir, "got"), file(&dir, "go"));
    let script = format!(
        "trap 'echo TERM > {got}; {wait_go}; exit 3' TERM; \
         echo $$ > {pid}; for i in {STEPS}; do sleep 0.05; done",
        got = path_str(&got),
        wait_go = wait_for_file(&go),
        pid = path_str(&pidfile),
    );
    let child = run_sh(redlock(&cluster), &[], &script).spawn().unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    kill(pid_of(&child), Signal::SIGTERM).unwrap();

    assert_eq!(line_in(&got).await, "TERM", "CMD saw the signal");
    assert!(
        holders(&urls, KEY) >= 3,
        "the lock is held while CMD shuts down"
    );
    std::fs::write(&go, "").unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 3, "redlock exits with CMD's code: {out:?}");
    assert_eq!(holders(&urls, KEY), 0, "released after CMD exited");
}

#[tokio::test]
async fn t61_sigint_is_forwarded_too_and_the_lock_released() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let pidfile = file(&dir, "pid");
    let script = format!("echo $$ > {}; exec sleep 60", path_str(&pidfile));
    let child = run_sh(redlock(&cluster), &[], &script).spawn().unwrap();
    let (cmd_pid, _guard) = cmd_in(&pidfile).await;
    assert!(holders(&urls, KEY) >= 3, "held while CMD runs");
    kill(pid_of(&child), Signal::SIGINT).unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 128 + 2, "CMD died of SIGINT: {out:?}");
    assert!(!is_alive(cmd_pid));
    assert_eq!(holders(&urls, KEY), 0, "released after CMD exited");
}

#[tokio::test]
async fn t62_sigterm_while_waiting_gives_up_and_leaves_no_keys() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    for url in &urls[..3] {
        set_foreign(url, KEY, "someone-else", Duration::from_secs(30));
    }
    let dir = scratch();
    let marker = file(&dir, "ran");
    let mut cmd = run_sh(
        redlock(&cluster),
        &["--wait", "30s"],
        &format!("touch {}", path_str(&marker)),
    );
    // Coupled to the library's debug line for a retried round (src/redlock.rs,
    // `acquire_with`): the signal must arrive while redlock is waiting.
    cmd.env("REDLOCK_LOG", "quorumlock=debug");
    let mut child = cmd.spawn().unwrap();
    stderr_until(&mut child, RETRYING).await;
    let signalled = Instant::now();
    kill(pid_of(&child), Signal::SIGTERM).unwrap();
    let out = finish(child, signalled).await;
    assert_eq!(out.code(), 128 + 15, "{out:?}");
    assert!(
        out.took < Duration::from_secs(5),
        "gave up at once: {out:?}"
    );
    assert!(!marker.exists(), "CMD never ran");
    for url in &urls[3..] {
        assert_eq!(value_on(url, KEY), None, "{url}");
    }
}

#[tokio::test]
async fn t63_forwarded_signals_reach_cmds_whole_process_group() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dir = scratch();
    let (pidfile, gpidfile) = (file(&dir, "pid"), file(&dir, "gpid"));
    let script = format!(
        "sleep 300 >/dev/null 2>&1 & echo $! > {}; echo $$ > {}; wait",
        path_str(&gpidfile),
        path_str(&pidfile)
    );
    let child = run_sh(redlock(&cluster), &[], &script).spawn().unwrap();
    let (_, _guard) = cmd_in(&pidfile).await;
    let grandchild = pid_in(&gpidfile).await;
    let _grandchild_guard = KillProcess(grandchild);
    kill(pid_of(&child), Signal::SIGTERM).unwrap();
    let out = finish(child, Instant::now()).await;
    assert_eq!(out.code(), 128 + 15, "CMD died of SIGTERM: {out:?}");
    assert_eq!(holders(&urls, KEY), 0, "released after CMD exited");
    // It may linger as a zombie under an init that does not reap orphans.
    wait_until(WAIT, "the grandchild got SIGTERM too", || async {
        !is_running(grandchild)
    })
    .await;
}

// ---- t70: status ----------------------------------------------------------------------------

#[tokio::test]
async fn t70_status_shows_each_node_and_exits_0_with_a_quorum() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();

    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let free = output(cmd).await;
    assert_eq!(free.code(), 0, "{free:?}");
    assert!(free.stdout.contains("free"), "{free:?}");

    // What another owner leaves on the nodes: its value on 3 of them, a fencing counter on all.
    let value = "0123456789abcdef0123456789abcdef";
    for url in &urls[..3] {
        set_foreign(url, KEY, value, Duration::from_secs(30));
    }
    for url in &urls {
        set_fence(url, KEY, 7);
    }
    cluster.kill(4).unwrap();

    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.stderr, "");
    assert!(
        out.stdout.contains(&format!(
            "held by {value} on 3 of 5 nodes (quorum 3, 4 answered); highest fencing counter 7"
        )),
        "{}",
        out.stdout
    );
    let line_of = |url: &str| {
        out.stdout
            .lines()
            .find(|l| l.contains(url))
            .unwrap_or_else(|| panic!("a line for {url}: {}", out.stdout))
            .to_owned()
    };
    for url in &urls[..3] {
        let line = line_of(url);
        assert!(line.contains(&format!("held by {value}  ttl")), "{line}");
        assert!(line.ends_with("fence 7"), "{line}");
    }
    let line = line_of(&urls[3]);
    assert!(line.contains("free") && line.ends_with("fence 7"), "{line}");
    assert!(
        out.stdout
            .contains(&format!("{}  unreachable: connection refused", urls[4])),
        "{}",
        out.stdout
    );

    cluster.kill(0).unwrap();
    cluster.kill(1).unwrap();
    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    for i in [0, 1, 4] {
        assert!(line.contains(urls[i].as_str()), "{line}");
    }
}

/// A node whose memory policy can evict lock keys gets an `eviction:` line under its own.
#[tokio::test]
async fn t71_status_names_nodes_that_can_evict_lock_keys() {
    init_tracing();
    let cluster = LocalCluster::start_with(
        3,
        &quorumlock::testkit::ServerOptions::new().maxmemory(64 << 20, "allkeys-lru"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = redlock(&cluster);
    cmd.args(["status", KEY]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let lines = out
        .stdout
        .lines()
        .filter(|l| {
            l.contains("eviction: maxmemory-policy allkeys-lru")
                && l.contains("lock keys and fencing counters can be evicted")
        })
        .count();
    assert_eq!(lines, 3, "{}", out.stdout);
}

// ---- t80: the restart guard -----------------------------------------------------------------

#[tokio::test]
async fn t80_strict_guard_is_the_default_and_holds_out_fresh_nodes() {
    let cluster = cluster(5);
    let mut cmd = bare();
    cmd.arg("--nodes").arg(cluster.urls().join(","));
    let out = output(run_sh(cmd, &[], "exit 0")).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    // The round stops once a quorum is impossible (the third failure), but on a loaded machine
    // the other nodes' answers may already be in: at least three nodes are named.
    let named = line.matches("held out of quorums").count();
    assert!((3..=5).contains(&named), "{named} nodes named: {line}");
}

#[tokio::test]
async fn t81_strict_guard_admits_nodes_up_longer_than_the_max_ttl() {
    let cluster = cluster(5);
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "strict")
        .env("REDLOCK_NODES", cluster.urls().join(","));
    // Nodes count once they have been up for the max ttl (1 s here); --wait outlasts that.
    let out = output(run_sh(cmd, &["--ttl", "1s", "--wait", "10s"], "exit 0")).await;
    assert_eq!(out.code(), 0, "{out:?}");
}

#[tokio::test]
async fn t82_max_ttl_sets_how_long_fresh_nodes_are_held_out() {
    let cluster = cluster(5);
    let mut cmd = redlock(&cluster);
    cmd.env("REDLOCK_RESTART_GUARD", "strict")
        .env("REDLOCK_MAX_TTL", "2m");
    let out = output(run_sh(cmd, &["--ttl", "1s"], "exit 0")).await;
    assert_eq!(out.code(), 69, "{out:?}");
    let line = out.one_line_error();
    // Held out for about two minutes (the max ttl), not one second (the run's ttl).
    let (_, rest) = line
        .split_once("held out of quorums for ")
        .unwrap_or_else(|| panic!("{line}"));
    let secs: f64 = rest
        .split_once('s')
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("seconds: {line}"));
    assert!((100.0..=120.0).contains(&secs), "{secs} s: {line}");
}

// ---- t85: demo ------------------------------------------------------------------------------

/// The redis-server ports a demo printed.
fn ports_in(stdout: &str) -> Vec<u16> {
    stdout
        .lines()
        .filter_map(|l| l.split("redis://127.0.0.1:").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

fn assert_closed(ports: &[u16]) {
    assert!(ports.len() >= 5, "{ports:?}");
    for &port in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "redis-server on {port} was stopped"
        );
    }
}

#[tokio::test]
async fn t85_demo_tells_the_story_to_the_end_and_cleans_up() {
    let mut cmd = bare();
    cmd.arg("demo");
    let out = finish_within(cmd.spawn().unwrap(), Instant::now(), DEMO_LIMIT).await;
    assert_eq!(out.code(), 0, "{out:?}");
    for needle in [
        "acquired  token 1,",
        "waiting",
        "killed node 3",
        "unreachable: connection refused",
        "freezing the holder",
        "after the freeze",
        "refused   stale fencing token",
        "two holders at once: never",
        "Cleaned up",
    ] {
        assert!(
            out.stdout.contains(needle),
            "{needle:?} in:\n{}",
            out.stdout
        );
    }
    assert!(
        out.took < DEMO_CONTRACT,
        "the demo finishes in under a minute: took {:?}:\n{}",
        out.took,
        out.stdout
    );
    assert_closed(&ports_in(&out.stdout));
}

#[tokio::test]
async fn t86_demo_interrupted_stops_its_servers() {
    let mut cmd = bare();
    cmd.arg("demo");
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let seen = read_until(&mut lines, "acquired").await;
    kill(pid_of(&child), Signal::SIGINT).unwrap();
    read_until(&mut lines, "Cleaned up").await;
    let out = finish_within(child, Instant::now(), DEMO_LIMIT).await;
    assert_eq!(out.code(), 128 + 2, "{out:?}");
    assert_closed(&ports_in(&seen));
}
