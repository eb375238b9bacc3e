//! Servers that die with the process: a watchdog `sh` that waits for its standard input to
//! close and then kills the servers it was given and removes their directories. The pipe's
//! write end is the only thing the process holds, and the kernel closes it however the process
//! ends (return from `main`, `exit`, a panic, SIGKILL), so a cluster kept in a `static` (whose
//! destructor never runs) still leaves nothing behind.

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use super::{TestkitError, io};

/// Kills a set of `redis-server` processes when this process ends, however it ends, unless
/// disarmed first; see [`LocalCluster::reap_at_exit`](super::LocalCluster::reap_at_exit).
///
/// Dropping a `Reaper` disarms it: the servers' own owner (a [`LocalCluster`](super::LocalCluster)
/// being dropped) stops them then. Keep the `Reaper` wherever the servers are kept past the end
/// of their owner's scope, a `static` pool say.
#[derive(Debug)]
pub struct Reaper {
    watchdog: Child,
    /// Held open until the process ends or the reaper is disarmed; its closing is the signal.
    _stdin: ChildStdin,
}

/// The watchdog's script: `$1` is a space-separated list of process ids, the rest are the
/// directories. The `read` loop (a builtin: no child of the watchdog's own) ends when standard
/// input closes; a process id is killed only while it is still a `redis-server` (a pid freed
/// since may belong to something else).
const SCRIPT: &str = r#"while read -r _; do :; done
for p in $1; do
  [ "$(cat /proc/$p/comm 2>/dev/null)" = redis-server ] && kill -9 "$p" 2>/dev/null
done
shift
rm -rf -- "$@"
"#;

impl Reaper {
    pub(super) fn watch<'a>(
        pids: impl IntoIterator<Item = u32>,
        dirs: impl IntoIterator<Item = &'a Path>,
    ) -> Result<Self, TestkitError> {
        let pids = pids
            .into_iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let mut watchdog = Command::new("sh")
            .args(["-c", SCRIPT, "quorumlock-reaper", &pids])
            .args(dirs)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("spawn the reaper (sh)"))?;
        let mut stdin = watchdog.stdin.take().ok_or_else(|| TestkitError::Io {
            what: "open the reaper's standard input".to_owned(),
            source: std::io::Error::other("no pipe"),
        })?;
        // Nothing is read but the end of the stream; an empty write proves the pipe is open.
        stdin
            .write_all(b"")
            .map_err(io("write to the reaper's standard input"))?;
        Ok(Reaper {
            watchdog,
            _stdin: stdin,
        })
    }

    /// Stops the watchdog without touching the servers.
    pub fn disarm(self) {
        drop(self);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // SIGKILL before the pipe closes (fields drop after this body), so the script never
        // reaches its `kill`.
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}
