//! Item 11: lock deadlines are measured on a clock that keeps counting while the machine is
//! suspended (CLOCK_BOOTTIME on Linux and Android), not on CLOCK_MONOTONIC, which stops: a
//! holder that resumes after its deadline sees its lock lost (`is_lost`, `validity`, `extend`,
//! `lost()`), and its lease does not extend it.
//!
//! This machine cannot be suspended. tokio's paused clock stands still while real time goes on,
//! which is what CLOCK_MONOTONIC (tokio's clock) does during a suspend; the library must notice
//! from its own deadline clock. A child process in a Linux time namespace, whose boot time is far
//! from its monotonic time, pins which clock that is.

use std::time::Duration;

use quorumlock::LostReason;

use crate::support::{client, cluster, is_expired, warm};

/// Shorter than the suspend: the lock's deadline passes during it.
const SHORT_TTL: Duration = Duration::from_millis(1500);
/// Longer than the lock's validity.
const SUSPEND: Duration = Duration::from_millis(2500);

#[tokio::test]
async fn a_lock_whose_deadline_passed_while_the_monotonic_clock_stood_still_is_lost() {
    let c = cluster(3);
    let locks = client(&c);
    warm(&locks).await;
    let lock = locks
        .try_acquire("suspend", SHORT_TTL)
        .await
        .expect("acquire");
    lock.keep_alive();
    let watched = lock.lost();
    // The "suspend": the runtime's clock stands still and nothing runs, while real time passes.
    tokio::time::pause();
    std::thread::sleep(SUSPEND);
    tokio::time::resume();
    // Back, with the runtime's clock SUSPEND behind real time (as after a resume).
    assert!(
        lock.is_lost(),
        "the deadline passed during the suspend; validity still {:?}",
        lock.validity()
    );
    assert_eq!(lock.validity(), Duration::ZERO);
    assert!(lock.deadline() <= std::time::Instant::now());
    // The lost() future taken before the suspend wakes within one sleep slice (250 ms) and
    // reads the deadline clock: not when the runtime's clock reaches the old deadline, about a
    // validity (1.5 s) later. (Nothing has fired the lost signal yet.)
    tokio::time::timeout(Duration::from_secs(1), watched)
        .await
        .expect("lost() fires soon after the resume");
    let err = lock
        .extend(SHORT_TTL)
        .await
        .expect_err("no extension after the deadline");
    assert!(is_expired(&err), "{err}");
    assert!(
        matches!(lock.lost_reason(), Some(LostReason::Expired)),
        "{:?}",
        lock.lost_reason()
    );
}

#[cfg(target_os = "linux")]
/// Set in the child process that runs inside a time namespace.
const CHILD: &str = "QUORUMLOCK_TIMENS_CHILD";
#[cfg(target_os = "linux")]
/// The child's boot time is this far ahead of its monotonic time.
const OFFSET_S: u64 = 1_000_000;

#[cfg(target_os = "linux")]
fn read(clock: nix::time::ClockId) -> Duration {
    Duration::from(nix::time::clock_gettime(clock).expect("clock_gettime"))
}

#[cfg(target_os = "linux")]
#[test]
fn lock_deadlines_are_measured_on_clock_boottime() {
    use nix::time::ClockId;
    let ours = quorumlock::testkit::deadline_clock_now();
    let boot = read(ClockId::CLOCK_BOOTTIME);
    assert!(
        boot.abs_diff(ours) < Duration::from_secs(1),
        "deadline clock {ours:?}, CLOCK_BOOTTIME {boot:?}"
    );
    if std::env::var_os(CHILD).is_some() {
        // Inside the namespace: only CLOCK_BOOTTIME is that far ahead.
        let mono = read(ClockId::CLOCK_MONOTONIC);
        assert!(
            ours.abs_diff(mono) > Duration::from_secs(OFFSET_S - 1000),
            "deadline clock {ours:?} follows CLOCK_MONOTONIC {mono:?}"
        );
        return;
    }
    // Re-run this test in a time namespace (needs root and unshare(1)); skipped where unavailable.
    let exe = std::env::current_exe().expect("test binary");
    let run = std::process::Command::new("unshare")
        .args(["--time", "--boottime", &OFFSET_S.to_string()])
        .arg(&exe)
        .args([
            "s11_suspend::lock_deadlines_are_measured_on_clock_boottime",
            "--exact",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output();
    match run {
        Ok(out) if out.status.success() => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains("1 passed"),
                "the child ran nothing: {stdout}"
            );
        }
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("unshare failed") || stderr.contains("Operation not permitted") {
                eprintln!("skipped: no time namespace here: {stderr}");
            } else {
                panic!(
                    "child in a time namespace failed:\n{}\n{stderr}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
        Err(e) => eprintln!("skipped: unshare(1) not available: {e}"),
    }
}
