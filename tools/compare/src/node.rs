//! node-redlock 5 (ioredis 5) as an implementation: `node/driver.mjs` runs in a child process,
//! connected once to the same nodes, and runs whole workloads sent as JSON lines on its stdin,
//! answering each with the workers' latencies and counts (see the header of `driver.mjs`).
//!
//! Its packages are pinned in `node/package.json` / `package-lock.json` and installed with
//! `npm ci` into `node/node_modules` (gitignored) the first time the tool needs them.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::workload::{Op, Spec, WorkerOut};

/// The driver's directory, next to this crate's manifest.
fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("node")
}

/// Installs the pinned packages (`npm ci`) unless they are there already.
fn install() {
    let dir = dir();
    if dir.join("node_modules/redlock/package.json").exists()
        && dir.join("node_modules/ioredis/package.json").exists()
    {
        return;
    }
    eprintln!("installing node-redlock: npm ci in {}", dir.display());
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("run npm (node-redlock needs Node.js and npm): {e}"));
    assert!(status.success(), "npm ci in {} failed", dir.display());
}

/// The running driver process.
pub(crate) struct NodeDriver {
    child: Mutex<Child>,
    io: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    pid: u32,
}

/// What one workload did in the driver.
pub(crate) struct NodeOut {
    pub(crate) workers: Vec<WorkerOut>,
    pub(crate) elapsed: Duration,
}

impl NodeDriver {
    /// Installs the packages if needed, starts the driver and waits until it is connected.
    pub(crate) fn start(urls: &[String]) -> NodeDriver {
        install();
        let mut child = Command::new("node")
            .arg("driver.mjs")
            .args(urls)
            .current_dir(dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start node (node-redlock): {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the driver");
        assert!(line.contains("ready"), "node-redlock driver: {line:?}");
        NodeDriver {
            pid: child.id(),
            child: Mutex::new(child),
            io: Mutex::new((stdin, stdout)),
        }
    }

    /// The driver's process id (its CPU time is the client's).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Runs one workload in the driver and reads its figures back; `None` when the driver
    /// gives no answer (then the run counts as hung).
    pub(crate) fn run(&self, spec: &Spec) -> Option<NodeOut> {
        let op = match spec.op {
            Op::Acquire => "acquire",
            Op::AcquireRelease => "acquire_release",
            Op::Extend => "extend",
            Op::Contended | Op::ContendedWait => "contended",
        };
        let request = serde_json::json!({
            "op": op,
            "tasks": spec.tasks,
            "max_ops": spec.max_ops.min(1 << 50),
            "budget_ms": spec.budget.as_millis() as u64,
            "prefix": spec.prefix,
            "names": spec.names,
        });
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(io.0, "{request}").ok()?;
        io.0.flush().ok()?;
        let mut line = String::new();
        io.1.read_line(&mut line).ok()?;
        let v: Value = serde_json::from_str(&line).ok()?;
        let us = |v: &Value| Duration::from_micros(v.as_u64().unwrap_or(0));
        let list = |v: &Value| -> Vec<Duration> {
            v.as_array()
                .map(|a| a.iter().map(us).collect())
                .unwrap_or_default()
        };
        let workers = v["workers"]
            .as_array()?
            .iter()
            .map(|w| WorkerOut {
                lat: list(&w["lat_us"]),
                ok: w["ok"].as_u64().unwrap_or(0),
                busy: w["busy"].as_u64().unwrap_or(0),
                err: w["err"].as_u64().unwrap_or(0),
                first_err: w["first_err"].as_str().map(str::to_owned),
                handover: list(&w["handover_us"]),
            })
            .collect();
        Some(NodeOut {
            workers,
            elapsed: us(&v["elapsed_us"]),
        })
    }
}

impl Drop for NodeDriver {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}
