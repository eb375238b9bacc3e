//! A lock client in its own process, so that it can be frozen with SIGSTOP the way a GC pause
//! or a VM stall freezes a real worker (its keep-alive task included).
//!
//! The child is this very test binary, re-run with `--exact t00_child_client_process` and its
//! configuration in `QUORUMLOCK_CHAOS_CHILD`: nothing else has to be built, and it runs the same
//! client loop as the in-process clients ([`crate::workload`]). It writes to a resource kept in
//! a separate Redis ([`fenced_set`](quorumlock::fenced_set)) and prints every record on stdout
//! (`CHAOS ...` lines, `CLOCK_MONOTONIC` stamps), which the test parses into its history.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::history::{Mono, Op, OpKind, Pause, PendingWrite, Recorder, Section, SessionId, Write};
use crate::resource::{Resource, holder_of_value};
use crate::workload::{ClientSpec, run_client};

pub const PREFIX: &str = "CHAOS ";
pub const ENV: &str = "QUORUMLOCK_CHAOS_CHILD";
/// The test that turns this binary into a child client.
pub const ENTRY: &str = "t00_child_client_process";

pub fn encode_section(s: &Section) -> String {
    format!(
        "section {} {} {} {} {} {}",
        s.session,
        s.client,
        s.token,
        s.acquired.0,
        s.valid_until.0,
        s.released.map_or(0, |r| r.0)
    )
}

pub fn encode_write(w: &Write) -> String {
    format!(
        "write {} {} {} {} {}",
        w.session,
        w.token,
        w.start.0,
        w.end.0,
        u8::from(w.accepted)
    )
}

pub fn encode_op(op: &Op) -> String {
    let kind = match op.kind {
        OpKind::Acquire => "acquire",
        OpKind::Extend => "extend",
        OpKind::Release => "release",
        OpKind::Write => "write",
    };
    format!(
        "op {} {kind} {} {} {} {}",
        op.client,
        op.start.0,
        op.end.0,
        op.bound.as_nanos(),
        op.outcome
    )
}

/// One line a child printed.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Section(Section),
    Write(Write),
    Op(Op),
    Acquired {
        session: SessionId,
        token: u64,
        at: Mono,
        until: Mono,
    },
    /// The session's deadline moved (an extension): the last one stands if the child dies.
    Extended {
        session: SessionId,
        until: Mono,
    },
    Checked {
        session: SessionId,
        at: Mono,
    },
    /// A write is about to be sent.
    Writing(PendingWrite),
    /// The session's lost signal fired.
    Lost {
        session: SessionId,
        at: Mono,
    },
    /// The child's loop ended normally.
    Done,
}

/// What a line of the child's stdout is.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Record(Event),
    /// Not ours (libtest's own output).
    Other,
    /// Looks like a record (has [`PREFIX`]) but does not parse: a bug, and fails the run.
    Malformed,
}

/// Classifies one line of the child's stdout.
pub fn classify(line: &str) -> Line {
    match decode(line) {
        Some(e) => Line::Record(e),
        None if line.contains(PREFIX.trim_end()) => Line::Malformed,
        None => Line::Other,
    }
}

/// The fields of one record, after [`PREFIX`].
struct Fields<'a>(Vec<&'a str>);

impl Fields<'_> {
    /// Field `i`, as text.
    fn text(&self, i: usize) -> Option<&str> {
        self.0.get(i).copied()
    }
    /// Field `i`, as a number.
    fn n(&self, i: usize) -> Option<u64> {
        self.text(i)?.parse::<u64>().ok()
    }
    /// Field `i`, as a monotonic time.
    fn m(&self, i: usize) -> Option<Mono> {
        self.n(i).map(Mono)
    }
    /// Every record has an exact number of fields.
    fn exactly(&self, k: usize) -> Option<()> {
        (self.0.len() == k).then_some(())
    }
}

pub fn decode(line: &str) -> Option<Event> {
    let f = Fields(line.strip_prefix(PREFIX)?.split_whitespace().collect());
    let n = |i: usize| f.n(i);
    let m = |i: usize| f.m(i);
    let fields = |k: usize| f.exactly(k);
    Some(match f.text(0)? {
        "section" => {
            fields(7)?;
            Event::Section(Section {
                session: n(1)?,
                client: n(2)? as usize,
                token: n(3)?,
                acquired: m(4)?,
                valid_until: m(5)?,
                released: m(6).filter(|r| r.0 != 0),
            })
        }
        "write" => {
            fields(6)?;
            Event::Write(Write {
                session: n(1)?,
                token: n(2)?,
                start: m(3)?,
                end: m(4)?,
                accepted: match n(5)? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
            })
        }
        "acquired" => {
            fields(5)?;
            Event::Acquired {
                session: n(1)?,
                token: n(2)?,
                at: m(3)?,
                until: m(4)?,
            }
        }
        "extended" => {
            fields(3)?;
            Event::Extended {
                session: n(1)?,
                until: m(2)?,
            }
        }
        "checked" => {
            fields(3)?;
            Event::Checked {
                session: n(1)?,
                at: m(2)?,
            }
        }
        "writing" => {
            fields(5)?;
            Event::Writing(PendingWrite {
                session: n(1)?,
                client: n(2)? as usize,
                token: n(3)?,
                start: m(4)?,
            })
        }
        "lost" => {
            fields(3)?;
            Event::Lost {
                session: n(1)?,
                at: m(2)?,
            }
        }
        "done" => {
            fields(1)?;
            Event::Done
        }
        "op" => {
            fields(7)?;
            Event::Op(decode_op(&f)?)
        }
        _ => return None,
    })
}

/// An `op` record: client, kind, start, end, bound (ns), outcome.
fn decode_op(f: &Fields) -> Option<Op> {
    Some(Op {
        client: f.n(1)? as usize,
        kind: match f.text(2)? {
            "acquire" => OpKind::Acquire,
            "extend" => OpKind::Extend,
            "release" => OpKind::Release,
            "write" => OpKind::Write,
            _ => return None,
        },
        start: f.m(3)?,
        end: f.m(4)?,
        bound: Duration::from_nanos(f.n(5)?),
        outcome: match f.text(6)? {
            "ok" => "ok",
            "held" => "held",
            "no_quorum" => "no_quorum",
            "expired" => "expired",
            "lost" => "lost",
            "error" => "error",
            _ => return None,
        },
    })
}

/// What the child is told to do, passed in [`ENV`] as `key=value` pairs separated by `;`.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub client: ClientSpec,
    pub resource_url: String,
    pub first_session: SessionId,
}

impl ChildSpec {
    fn encode(&self) -> String {
        let c = &self.client;
        format!(
            "client={};urls={};ttl_ms={};work_ms={};writes={}-{};once={};seed={};resource={};first_session={}",
            c.client,
            c.urls.join(","),
            c.ttl.as_millis(),
            c.work.as_millis(),
            c.writes.start(),
            c.writes.end(),
            u8::from(c.once),
            c.seed,
            self.resource_url,
            self.first_session
        )
    }

    fn decode(s: &str) -> ChildSpec {
        let get = |k: &str| {
            s.split(';')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("{ENV} lacks {k}: {s}"))
                .to_owned()
        };
        let num = |k: &str| get(k).parse::<u64>().expect("a number");
        let (lo, hi) = get("writes")
            .split_once('-')
            .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
            .expect("writes=a-b");
        let mut client = ClientSpec::new(
            num("client") as usize,
            get("urls").split(',').map(str::to_owned).collect(),
            Duration::from_millis(num("ttl_ms")),
            num("seed"),
        );
        client.work = Duration::from_millis(num("work_ms"));
        client.writes = lo..=hi;
        client.once = num("once") == 1;
        // The heartbeat a real worker would run: it freezes with the process.
        client.keep_alive = true;
        // Checks its validity before its work, not again before writing.
        client.recheck = false;
        ChildSpec {
            client,
            resource_url: get("resource"),
            first_session: num("first_session"),
        }
    }
}

/// The child's side: runs when this binary was started by [`ChildClient::spawn`].
pub fn child_main() {
    let Ok(spec) = std::env::var(ENV) else {
        return;
    };
    let spec = ChildSpec::decode(&spec);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let rec = Recorder::with_sessions_from(spec.first_session, true);
        let resource = Resource::redis(&spec.resource_url).await;
        let stop = CancellationToken::new();
        // The test closes our stdin to ask for a clean stop.
        let stopper = stop.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(_)) = lines.next_line().await {}
            stopper.cancel();
        });
        run_client(spec.client, resource, rec, stop).await;
        println!("{PREFIX}done");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    });
}

/// The test's handle on a child client.
pub struct ChildClient {
    child: Child,
    pid: Pid,
    index: usize,
    rec: Recorder,
    resource_url: String,
    paused_at: Option<Mono>,
    /// Every event as it arrives.
    pub events: mpsc::UnboundedReceiver<Event>,
    reader: tokio::task::JoinHandle<bool>,
}

impl ChildClient {
    /// Starts a child client; its records go to `rec`.
    pub fn spawn(spec: &ChildSpec, rec: Recorder) -> ChildClient {
        // /proc/self/exe still runs this very binary if cargo rebuilt it in the meantime.
        let exe = match std::path::Path::new("/proc/self/exe") {
            p if p.exists() => p.to_path_buf(),
            _ => std::env::current_exe().expect("the test binary"),
        };
        let mut child = Command::new(exe)
            .args([ENTRY, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .env(ENV, spec.encode())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the child client");
        let pid = Pid::from_raw(child.id().expect("running") as i32);
        let stdout = child.stdout.take().expect("piped");
        let (tx, events) = mpsc::unbounded_channel();
        let rec2 = rec.clone();
        let index = spec.client.client;
        // Returns whether the child said it was done.
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut done = false;
            loop {
                let line = match lines.next_line().await {
                    Ok(Some(line)) => line,
                    Ok(None) => break,
                    Err(e) => {
                        rec2.malformed(format!("unreadable output of the child: {e}"));
                        break;
                    }
                };
                let event = match classify(&line) {
                    Line::Record(event) => event,
                    Line::Other => continue,
                    Line::Malformed => {
                        rec2.malformed(line);
                        continue;
                    }
                };
                match &event {
                    Event::Section(s) => rec2.section(s.clone()),
                    Event::Write(w) => rec2.write(w.clone()),
                    Event::Op(op) => rec2.op(op.clone()),
                    Event::Acquired {
                        session,
                        token,
                        at,
                        until,
                    } => rec2.open(Section {
                        session: *session,
                        client: index,
                        token: *token,
                        acquired: *at,
                        valid_until: *until,
                        released: None,
                    }),
                    Event::Extended { session, until } => rec2.extended(*session, *until),
                    Event::Writing(p) => rec2.write_started(p.clone()),
                    Event::Lost { session, at } => rec2.lost(*session, *at),
                    Event::Checked { .. } => {}
                    Event::Done => done = true,
                }
                let _ = tx.send(event);
            }
            done
        });
        ChildClient {
            child,
            pid,
            index,
            rec,
            resource_url: spec.resource_url.clone(),
            paused_at: None,
            events,
            reader,
        }
    }

    /// Waits for the next event matching `pred`, at most `within`.
    pub async fn wait_for(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> Event {
        tokio::time::timeout(within, async {
            loop {
                match self.events.recv().await {
                    Some(e) if pred(&e) => return e,
                    Some(_) => {}
                    None => panic!("the child client exited while waiting for {what}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out after {within:?} waiting for the child: {what}"))
    }

    /// SIGSTOP: the whole process freezes, its heartbeat too.
    pub fn pause(&mut self) {
        kill(self.pid, Signal::SIGSTOP).expect("SIGSTOP the child");
        self.paused_at = Some(Mono::now());
    }

    /// SIGCONT, and the pause goes into the history.
    pub fn resume(&mut self) {
        kill(self.pid, Signal::SIGCONT).expect("SIGCONT the child");
        if let Some(start) = self.paused_at.take() {
            self.rec.pause(Pause {
                client: self.index,
                start,
                end: Mono::now(),
            });
        }
    }

    /// Asks the child to stop after its current section and waits (bounded) for it to exit.
    /// A child that does not exit in time is killed, which is an incident (it fails the run):
    /// the sections it left open are closed at its death, with the last deadline it reported
    /// (its keep-alive died with it), and a write it had in flight is resolved from the
    /// resource: accepted if the resource holds its session's value, otherwise left unfinished
    /// (rejected, never applied, or applied and overwritten: the history cannot tell).
    pub async fn stop(mut self, within: Duration) {
        if self.paused_at.is_some() {
            self.resume();
        }
        drop(self.child.stdin.take());
        let died = match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => {
                if !status.success() {
                    self.rec
                        .incident(format!("the child client exited with {status}"));
                }
                Mono::now()
            }
            Ok(Err(e)) => {
                self.rec
                    .incident(format!("waiting for the child client failed: {e}"));
                Mono::now()
            }
            Err(_) => {
                let _ = self.child.start_kill();
                let at = Mono::now();
                self.rec.incident(format!(
                    "the child client did not stop within {within:?}: killed"
                ));
                if tokio::time::timeout(within, self.child.wait())
                    .await
                    .is_err()
                {
                    self.rec
                        .incident(format!("the killed child did not exit within {within:?}"));
                }
                at
            }
        };
        match tokio::time::timeout(within, &mut self.reader).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => self
                .rec
                .incident("the child client's output ended without `done`".to_owned()),
            Ok(Err(e)) => self
                .rec
                .incident(format!("the child's output reader failed: {e}")),
            Err(_) => {
                self.reader.abort();
                self.rec.incident(format!(
                    "the child's output did not end within {within:?} of its exit"
                ));
            }
        }
        let closed = self.rec.close_open(self.index, died);
        if closed > 0 {
            self.rec.incident(format!(
                "the child client died with {closed} section(s) open: closed at its death"
            ));
        }
        let pending = self.rec.pending_writes(self.index);
        if !pending.is_empty() {
            let holder = holder_of_value(&self.resource_url, Duration::from_secs(5)).await;
            for p in pending {
                if holder == Some(p.session) {
                    self.rec.write(Write {
                        session: p.session,
                        token: p.token,
                        start: p.start,
                        end: died,
                        accepted: true,
                    });
                }
            }
        }
    }
}
