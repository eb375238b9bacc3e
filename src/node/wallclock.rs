//! The clock-jump check: Redis expires keys on its wall clock, so a node whose clock steps
//! forward drops lock keys early. Each connection to one server reads the node's clock when it
//! connects (`server_time_usec` in the connect's `INFO`) and again with an acquire whose last
//! reading is [`CLOCK_PERIOD`] old or more (`TIME`, sent just before the acquire on the same
//! connection: no extra round trip; one reading per node per period at most), and compares how
//! far the node's clock moved with how much time passed on ours (`CLOCK_BOOTTIME`,
//! [`crate::core::clock`]). A forward move beyond that plus the drift
//! allowance ([`clock_jump`]) is treated like a restart: the node is held out for the max ttl
//! from then and its fencing counters are checked, the acquire that saw it does not count, a
//! warning is logged and `quorumlock_node_clock_jumps_total` counts it. A node that refuses
//! `TIME` (an ACL without it) is not checked. Cluster members are not checked (their
//! connection spans shards).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;

use super::Node;
use crate::core::clock;
use crate::core::health::{ClockReading, clock_jump};
use crate::core::lock;
use crate::error::NodeError;

/// How old the last reading of a node's clock must be for an acquire to read it again: an
/// acquire within this of the last reading carries no `TIME` (a jump in between is seen at the
/// next reading). Busy clients pay one `TIME` per node per period, not one per acquire; a fresh
/// process's first acquire, right after its connect read the clock, pays none.
pub(crate) const CLOCK_PERIOD: Duration = Duration::from_millis(10);

/// The last reading of the node's clock and the connection it was made on.
pub(super) struct WallClock {
    drift_factor: f64,
    last: Mutex<Option<(u64, ClockReading)>>,
    /// When (our clock, µs) an acquire last took it upon itself to read the clock: the
    /// acquires meanwhile do not read it too.
    asked: AtomicU64,
}

impl WallClock {
    pub(super) fn new(drift_factor: f64) -> Self {
        WallClock {
            drift_factor,
            last: Mutex::new(None),
            asked: AtomicU64::new(0),
        }
    }
}

/// The server time in a `TIME` reply (`[seconds, microseconds]`), if it is one.
pub(super) fn parse_time(reply: Value) -> Option<Duration> {
    let (secs, micros): (u64, u64) = redis::from_redis_value(reply).ok()?;
    Some(Duration::from_secs(secs) + Duration::from_micros(micros))
}

/// Our clock now, as a duration since its origin.
pub(super) fn ours() -> Duration {
    clock::now().since_origin()
}

impl Node {
    /// Records the reading a connect made: the baseline of connection `generation` (`None`:
    /// `TIME` unreadable, the connection is not checked). When the connect met the server the
    /// last reading was made on (`same_server`: the same run id and replication id), the
    /// reading is also compared with that one, so a jump while the client was disconnected is
    /// seen too; a jump there holds the node out as [`check_clock`](Self::check_clock) does.
    pub(super) fn clock_baseline(
        &self,
        generation: u64,
        reading: Option<ClockReading>,
        same_server: bool,
    ) {
        let mut last = lock(&self.wallclock.last);
        let jump = match (*last, reading) {
            (Some((_, earlier)), Some(later)) if same_server => {
                clock_jump(earlier, later, self.wallclock.drift_factor)
            }
            _ => None,
        };
        *last = reading.map(|r| (generation, r));
        drop(last);
        if let Some(forward) = jump {
            self.clock_jumped(forward);
        }
    }

    /// Whether an acquire on connection `generation` reads the clock: the connection is checked
    /// (its connect read the clock) and neither its last reading nor another acquire's request
    /// for one is [`CLOCK_PERIOD`] old. A `true` is the request: one acquire per period gets it.
    pub(super) fn clock_due(&self, generation: u64) -> bool {
        let received = match *lock(&self.wallclock.last) {
            Some((g, reading)) if g == generation => reading.received,
            _ => return false,
        };
        let now = ours();
        let asked = self.wallclock.asked.load(Ordering::Relaxed);
        let since = received.max(Duration::from_micros(asked));
        if now.saturating_sub(since) < CLOCK_PERIOD {
            return false;
        }
        let now = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
        self.wallclock
            .asked
            .compare_exchange(asked, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Reads `TIME` on `conn` with our clock around it. The command is handed to the
    /// connection's queue at the first poll, so a send started after that poll travels after it.
    pub(super) async fn read_clock(
        mut conn: super::link::Single,
    ) -> redis::RedisResult<ClockReading> {
        let sent = ours();
        let reply = conn.send_packed_command(&redis::cmd("TIME")).await?;
        let received = ours();
        let server = parse_time(reply)
            .ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Parse, "TIME reply")))?;
        Ok(ClockReading {
            sent,
            received,
            server,
        })
    }

    /// Compares a reading on connection `generation` with the last one on it. A forward jump
    /// beyond the allowance holds the node out and marks it for repair, as a restart does, and
    /// is the call's error; an unreadable reading leaves the baseline as it was.
    pub(super) fn check_clock(
        &self,
        generation: u64,
        reading: redis::RedisResult<ClockReading>,
    ) -> Result<(), NodeError> {
        let Ok(reading) = reading else {
            return Ok(());
        };
        let mut last = lock(&self.wallclock.last);
        let jump = match *last {
            Some((g, earlier)) if g == generation => {
                clock_jump(earlier, reading, self.wallclock.drift_factor)
            }
            // A reconnect in between: its connect made a new baseline, later than this reading.
            _ => return Ok(()),
        };
        *last = Some((generation, reading));
        drop(last);
        let Some(forward) = jump else {
            return Ok(());
        };
        self.clock_jumped(forward);
        Err(NodeError::ClockJumped { forward })
    }

    /// A jump seen: counted, logged once, and the node held out and marked for repair.
    fn clock_jumped(&self, forward: Duration) {
        crate::metrics::node_clock_jump(&self.name);
        tracing::warn!(
            node = %self.name,
            forward = ?forward,
            "the node's clock jumped forward: it may have expired lock keys early; it counts \
             toward no quorum for the max ttl and its fencing counters are checked"
        );
        self.observe_clock_jump();
    }
}
