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
