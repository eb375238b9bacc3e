//! `redlock check` and `redlock break` (t100): a running `redlock run` is broken by an
//! operator's fresh process; its token stops being current; it exits 79 saying it was revoked.

use crate::harness::*;
use crate::support::*;

#[tokio::test]
async fn t100_break_revokes_a_running_holder_and_check_sees_it() {
    let mut cluster = cluster(5);
    let dir = scratch();
    let tokenfile = file(&dir, "token");
    let script = format!(
        "echo $REDLOCK_TOKEN > {}; exec sleep 60",
        path_str(&tokenfile)
    );
    let holder = run_sh(
        redlock(&cluster),
        &["--ttl", "3s", "--kill-after", "2s"],
        &script,
    )
    .spawn()
    .unwrap();
    let token = line_in(&tokenfile).await;
    let token = token.trim();

    let check = |cluster: &quorumlock::testkit::LocalCluster, token: &str| {
        let mut cmd = redlock(cluster);
        cmd.args(["check", KEY, token]);
        output(cmd)
    };
    let current = check(&cluster, token).await;
    assert_eq!(current.code(), 0, "{current:?}");
    assert!(current.stdout.contains("is current"), "{current:?}");

    let mut cmd = redlock(&cluster);
    cmd.args(["break", KEY]);
    let broken = output(cmd).await;
    assert_eq!(broken.code(), 0, "{broken:?}");
    assert!(
        broken.stdout.starts_with("revoked \"job\" from "),
        "{broken:?}"
    );
    assert_eq!(broken.stderr, "");

    let stale = check(&cluster, token).await;
    assert_eq!(stale.code(), 1, "{stale:?}");
    assert!(stale.stdout.contains("superseded"), "{stale:?}");

    let out = finish(holder, tokio::time::Instant::now()).await;
    assert_eq!(out.code(), 79, "{out:?}");
    assert!(out.lost_line().contains("revoked"), "{}", out.lost_line());

    // Nothing left to break: exit 1, nothing done.
    let mut cmd = redlock(&cluster);
    cmd.args(["break", KEY]);
    let again = output(cmd).await;
    assert_eq!(again.code(), 1, "{again:?}");
    assert!(again.stdout.contains("nothing revoked"), "{again:?}");

    let mut cmd = redlock(&cluster);
    cmd.args(["check", KEY, "not-a-token"]);
    assert_eq!(output(cmd).await.code(), 64);

    for i in 0..3 {
        cluster.kill(i).unwrap();
    }
    let down = check(&cluster, token).await;
    assert_eq!(down.code(), 69, "{down:?}");
    down.one_line_error();
    let mut cmd = redlock(&cluster);
    cmd.args(["break", KEY]);
    assert_eq!(output(cmd).await.code(), 69);
}

/// `redlock ls`: a table with one line per held lock under the prefix, `--json` the same as one
/// object; a node down is named on stderr (exit 0); too few nodes, 69.
#[tokio::test]
async fn t101_ls_lists_the_held_locks() {
    let mut cluster = cluster(5);
    let locks = client(&cluster);
    let a = locks.try_acquire("jobs:a", LONG_TTL).await.unwrap();
    let b = locks.try_acquire("jobs:b", LONG_TTL).await.unwrap();
    let other = locks.try_acquire("other", LONG_TTL).await.unwrap();
    wait_until(WAIT, "every lock on every node", || async {
        ["jobs:a", "jobs:b"]
            .iter()
            .all(|k| holders(&cluster.urls(), k) == 5)
    })
    .await;
    cluster.kill(4).unwrap();

    let mut cmd = redlock(&cluster);
    cmd.args(["ls", "jobs:"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    assert!(
        lines[0].starts_with("KEY") && lines[0].ends_with("FENCE"),
        "{}",
        lines[0]
    );
    for (line, lock) in lines[1..].iter().zip([&a, &b]) {
        assert!(line.starts_with(lock.key()), "{line}");
        assert!(line.contains(lock.value()), "{line}");
        assert!(line.contains(" 4/5 "), "{line}");
        assert!(line.ends_with(&format!(" {}", lock.token())), "{line}");
    }
    assert!(out.stderr.contains("not scanned"), "{out:?}");

    let mut cmd = redlock(&cluster);
    cmd.args(["ls", "--json"]);
    let out = output(cmd).await;
    assert_eq!(out.code(), 0, "{out:?}");
    let doc: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(doc["schema"], 1);
    let keys: Vec<&str> = doc["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["jobs:a", "jobs:b", "other"]);
    assert_eq!(doc["locks"][0]["held_on"], 4);
    assert_eq!(doc["failures"].as_array().unwrap().len(), 1);

    for i in 0..2 {
        cluster.kill(i).unwrap();
    }
    let mut cmd = redlock(&cluster);
    cmd.arg("ls");
    let out = output(cmd).await;
    assert_eq!(out.code(), 69, "{out:?}");
    out.one_line_error();
    drop((a, b, other));
}

/// `redlock ls --older-than D`: a lock held (and extended, on a 1 s ttl) by a `redlock run` for
/// more than 2 s is listed with `--older-than 2s` and its AGE, not with `--older-than 1h` (exit
/// 1); a lock another client wrote (a random value) has AGE `-`, and `--older-than` leaves it
/// out and says so on stderr; `--json` carries `acquired_at_ms` (null for it).
#[tokio::test]
async fn t102_ls_older_than_lists_the_locks_held_longer() {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    let cluster = cluster(5);
    let dir = scratch();
    let tokenfile = file(&dir, "token");
    let started = SystemTime::now();
    let script = format!(
        "echo $REDLOCK_TOKEN > {}; exec sleep 60",
        path_str(&tokenfile)
    );
    let holder = run_sh(redlock(&cluster), &["--ttl", "1s"], &script)
        .spawn()
        .unwrap();
    line_in(&tokenfile).await;
    let seen = SystemTime::now(); // the lock was acquired before this
    write_foreign_lock(&cluster);
    let ls = |args: &[&str]| {
        let mut cmd = redlock(&cluster);
        cmd.arg("ls").args(args);
        output(cmd)
    };
    let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;

    let all = ls(&[]).await;
    assert_eq!(all.code(), 0, "{all:?}");
    let rows: Vec<Vec<&str>> = all
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["KEY", "HOLDER", "NODES", "AGE", "TTL", "FENCE"]);
    assert_eq!((rows.len(), rows[1][0], rows[1][3]), (3, "foreign", "-"));
    assert_eq!(rows[2][0], KEY);
    let age = humantime::parse_duration(rows[2][3]).unwrap();
    assert!(
        age <= started.elapsed().unwrap() + Duration::from_millis(1),
        "{all:?}"
    );

    // Wait out the age itself: the holder has held the lock over 2 s once 2 s have passed
    // since it was seen acquired.
    let two = Duration::from_secs(2);
    tokio::time::sleep(
        (seen + two + Duration::from_millis(200))
            .duration_since(SystemTime::now())
            .unwrap_or_default(),
    )
    .await;
    let old = ls(&["--older-than", "2s"]).await;
    assert_eq!(old.code(), 0, "{old:?}");
    let lines: Vec<&str> = old.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "only the dated lock: {old:?}");
    assert!(lines[1].starts_with(&format!("{KEY} ")), "{old:?}");
    let age: Duration =
        humantime::parse_duration(lines[1].split_whitespace().nth(3).unwrap()).unwrap();
    assert!(
        age >= two && age <= started.elapsed().unwrap() + Duration::from_millis(1),
        "{old:?}"
    );
    assert!(
        old.stderr
            .contains("1 lock of unknown age (values of other Redlock clients) not listed"),
        "{old:?}"
    );

    let none = ls(&["--older-than", "1h"]).await;
    assert_eq!(none.code(), 1, "{none:?}");
    assert_eq!(none.stdout.lines().count(), 1, "the header alone: {none:?}");

    assert_json_ages(ls(&["--json"]).await, ms(started), ms(seen));
    let json = ls(&["--json", "--older-than", "2s"]).await;
    let doc: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(
        (
            &doc["older_than_ms"],
            &doc["unknown_age_not_listed"],
            doc["locks"].as_array().unwrap().len()
        ),
        (&serde_json::json!(2000), &serde_json::json!(1), 1),
        "{doc}"
    );

    nix::sys::signal::kill(pid_of(&holder), nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = finish(holder, tokio::time::Instant::now()).await;
    assert_eq!(out.code(), 143, "{out:?}");
}

/// A lock another client wrote on every node: a random value, of unknown age.
fn write_foreign_lock(cluster: &quorumlock::testkit::LocalCluster) {
    for url in cluster.urls() {
        let _: () = redis::cmd("SET")
            .arg(lock_key("foreign"))
            .arg("0123456789abcdef0123456789abcdef")
            .arg("PX")
            .arg(LONG_TTL.as_millis() as u64)
            .query(&mut conn(&url))
            .unwrap();
    }
}

/// `redlock ls --json` of t102: the foreign lock first, without `acquired_at_ms`; the run's
/// lock acquired between `started_ms` and `seen_ms`.
fn assert_json_ages(json: Outcome, started_ms: u64, seen_ms: u64) {
    assert_eq!(json.code(), 0, "{json:?}");
    let doc: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(doc["locks"][0]["key"], "foreign");
    assert!(doc["locks"][0]["acquired_at_ms"].is_null(), "{doc}");
    let at = doc["locks"][1]["acquired_at_ms"]
        .as_u64()
        .expect("a number");
    assert!(at + 1 > started_ms && at <= seen_ms, "{doc}");
}
