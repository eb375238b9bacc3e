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
