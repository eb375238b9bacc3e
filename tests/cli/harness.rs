//! What every `redlock` test needs: the binary with a clean environment, its outcome, CMD
//! scripts that report their pid, and guards that leave no process behind.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use quorumlock::testkit::LocalCluster;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Lines};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

use crate::support::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_redlock");
/// Upper bound for one `redlock` run in these tests (each normally takes well under a second).
pub const RUN_LIMIT: Duration = Duration::from_secs(30);
/// How long a demo test waits for `redlock demo` before giving up. Above the contract's minute
/// (`DEMO_CONTRACT`), so that a slow demo fails the timing assertion, with its output, rather
/// than this bound.
pub const DEMO_LIMIT: Duration = Duration::from_secs(90);
/// The contract: `redlock demo` finishes by itself in under a minute.
pub const DEMO_CONTRACT: Duration = Duration::from_secs(60);
/// A shell loop bound for CMDs that wait: `seq 400` steps of 50 ms, 20 s at most, so that no
/// CMD outlives a failed test for long even if its guard cannot reach it.
pub const STEPS: &str = "$(seq 400)";
pub const KEY: &str = "job";

/// `redlock --nodes <cluster>`, with no `REDLOCK_*` inherited from the caller and the restart
/// guard off: every test starts a fresh cluster, which the strict default (tested on its own,
/// t80..) holds out for one max ttl.
pub fn redlock(cluster: &LocalCluster) -> Command {
    let mut cmd = bare();
    cmd.env("REDLOCK_RESTART_GUARD", "off")
        .arg("--nodes")
        .arg(cluster.urls().join(","));
    cmd
}

/// `redlock` with a clean environment and captured output.
pub fn bare() -> Command {
    init_tracing();
    let mut cmd = Command::new(BIN);
    for var in [
        "REDLOCK_NODES",
        "REDLOCK_NODE_TIMEOUT",
        "REDLOCK_RESTART_GUARD",
        "REDLOCK_MAX_TTL",
        "REDLOCK_LOG",
        "REDLOCK_TLS_CA",
        "REDLOCK_TLS_CERT",
        "REDLOCK_TLS_KEY",
        "REDLOCK_KEY_PREFIX",
        "REDLOCK_COMPAT",
        "REDLOCK_OWNER",
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
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Outcome {
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("redlock died of a signal: {self:?}"))
    }

    /// The contract for a lost lock: exit 79 and one line on stderr, which is returned.
    pub fn lost_line(&self) -> &str {
        assert_eq!(self.code(), 79, "{self:?}");
        self.one_line_error()
    }

    /// The contract: a failure is one line on stderr, prefixed `redlock: `.
    pub fn one_line_error(&self) -> &str {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self:?}");
        assert!(lines[0].starts_with("redlock: "), "{self:?}");
        lines[0]
    }
}

pub async fn output(mut cmd: Command) -> Outcome {
    let child = cmd.spawn().expect("spawn redlock");
    finish(child, Instant::now()).await
}

pub async fn finish(child: Child, started: Instant) -> Outcome {
    finish_within(child, started, RUN_LIMIT).await
}

pub async fn finish_within(child: Child, started: Instant, limit: Duration) -> Outcome {
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
pub fn run_sh(mut cmd: Command, flags: &[&str], script: &str) -> Command {
    cmd.arg("run")
        .args(flags)
        .args([KEY, "--", "sh", "-c", script]);
    cmd
}

/// Another owner overwrites the key on every node (30 s): the next extension of a running
/// `redlock` finds it is not ours. Returns when it was taken.
pub fn usurp(urls: &[String]) -> Instant {
    let taken = Instant::now();
    for url in urls {
        set_foreign(url, KEY, "usurper", Duration::from_secs(30));
    }
    taken
}

/// Spawns `cmd`, a `redlock` whose CMD first writes its pid to `pidfile`; once CMD runs,
/// another owner overwrites the key everywhere ([`usurp`]). Returns how `redlock` ended (timed
/// from the takeover), CMD's pid and a guard on CMD's group.
pub async fn lost_while_running(
    mut cmd: Command,
    pidfile: &Path,
    urls: &[String],
) -> (Outcome, Pid, KillGroup) {
    let child = cmd.spawn().unwrap();
    let (pid, group) = cmd_in(pidfile).await;
    let taken = usurp(urls);
    (finish(child, taken).await, pid, group)
}

/// Another owner (a client of its own) holds the key for 30 s.
pub async fn held_elsewhere(cluster: &LocalCluster) -> quorumlock::Lock {
    client(cluster)
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .unwrap()
}

/// A scratch directory, a marker file in it and a CMD that creates the marker: whether CMD ran.
pub fn marker_cmd() -> (tempfile::TempDir, PathBuf, String) {
    let dir = scratch();
    let marker = file(&dir, "ran");
    let script = format!("touch {}", path_str(&marker));
    (dir, marker, script)
}

pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

/// Waits until `path` holds a full line, and returns it.
pub async fn line_in(path: &Path) -> String {
    wait_until(WAIT, &format!("a line in {}", path.display()), || async {
        std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    std::fs::read_to_string(path)
        .expect("read")
        .trim()
        .to_owned()
}

pub async fn pid_in(path: &Path) -> Pid {
    Pid::from_raw(line_in(path).await.parse().expect("a pid"))
}

/// Kills a process group when dropped, so that a failing test leaves no CMD behind:
/// `kill_on_drop` kills `redlock`, not CMD (which runs in a process group of its own, whose id
/// is CMD's pid).
#[must_use]
pub struct KillGroup(pub Pid);

impl Drop for KillGroup {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

/// Kills one process when dropped (a CMD's child that may have left CMD's group).
#[must_use]
pub struct KillProcess(pub Pid);

impl Drop for KillProcess {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
    }
}

/// CMD's pid from its pidfile, and a guard that kills its process group.
pub async fn cmd_in(path: &Path) -> (Pid, KillGroup) {
    let pid = pid_in(path).await;
    (pid, KillGroup(pid))
}

/// A CMD that forks: `grandchild` runs in the background while CMD waits for it, and each
/// writes its pid to a file of a scratch directory. The grandchild works on after CMD unless
/// its group is signalled; its output must go elsewhere (`>/dev/null 2>&1`) so that, if it
/// survives, a test fails on its checks rather than waiting for redlock's output pipes to
/// close.
pub struct Forking {
    _dir: tempfile::TempDir,
    pidfile: PathBuf,
    gpidfile: PathBuf,
    /// The CMD, for `sh -c`.
    pub script: String,
}

impl Forking {
    pub fn new(grandchild: &str) -> Self {
        let dir = scratch();
        let (pidfile, gpidfile) = (file(&dir, "pid"), file(&dir, "gpid"));
        let script = format!(
            "{grandchild} & echo $! > {}; echo $$ > {}; wait",
            path_str(&gpidfile),
            path_str(&pidfile)
        );
        Self {
            _dir: dir,
            pidfile,
            gpidfile,
            script,
        }
    }

    /// CMD's pid and the grandchild's, once both are written.
    pub async fn pids(&self) -> (Pid, Pid) {
        let cmd = pid_in(&self.pidfile).await;
        (cmd, pid_in(&self.gpidfile).await)
    }

    /// The same, with guards that kill CMD's group and the grandchild (which may have left it)
    /// when dropped.
    pub async fn guarded_pids(&self) -> (Pid, Pid, (KillGroup, KillProcess)) {
        let (cmd, group) = cmd_in(&self.pidfile).await;
        let grandchild = pid_in(&self.gpidfile).await;
        (cmd, grandchild, (group, KillProcess(grandchild)))
    }
}

/// True when no process has this pid (not even a zombie).
pub fn is_gone(pid: Pid) -> bool {
    kill(pid, None) == Err(Errno::ESRCH)
}

/// True when the process exists and has not exited: a zombie (exited, not yet reaped by its
/// parent) does not count. Orphans here may be reparented to an init that never reaps them
/// (as in many containers), so a process that died can stay a zombie for good.
pub fn is_running(pid: Pid) -> bool {
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
pub fn wait_for_file(path: &Path) -> String {
    format!(
        "for i in {STEPS}; do [ -e {p} ] && break; sleep 0.05; done",
        p = path_str(path)
    )
}

pub fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid"))
}

pub fn is_alive(pid: Pid) -> bool {
    !is_gone(pid)
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

pub fn file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// Reads `child`'s stderr until a line containing `needle` (bounded); returns what was read.
/// The rest of stderr is closed: `redlock` must not mind.
pub async fn stderr_until(child: &mut Child, needle: &str) -> String {
    let stderr = child.stderr.take().expect("piped stderr");
    read_until(&mut BufReader::new(stderr).lines(), needle).await
}

/// Reads lines until one contains `needle` (bounded); returns what was read.
pub async fn read_until<R: AsyncRead + Unpin>(
    lines: &mut Lines<BufReader<R>>,
    needle: &str,
) -> String {
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
pub const RETRYING: &str = "retrying acquisition";

/// SIGSTOPs `redlock` and waits until its keys have expired on every node.
pub async fn stop_past_its_ttl(redlock: Pid, urls: &[String]) {
    kill(redlock, Signal::SIGSTOP).unwrap();
    wait_until(WAIT, "the stopped holder's keys expire", || async {
        holders(urls, KEY) == 0
    })
    .await;
}
