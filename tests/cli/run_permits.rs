//! `redlock run -n N`: CMD runs only while one of N permits is free.

use crate::harness::*;
use crate::support::*;

/// Three `redlock run -n 2` at once, each holding its permit until told to go: two run, the
/// third is refused (exit 75, held) while both permits are held, and one that waits runs once
/// a permit is released.
#[tokio::test]
async fn p30_redlock_run_n_runs_cmd_only_while_a_permit_is_free() {
    let cluster = cluster(5);
    let nodes = cluster.urls().join(",");
    let scratch = scratch();
    let dir = scratch.path();
    let gate = dir.join("go");
    let run = |name: &str, wait: &str| {
        let mut cmd = bare();
        cmd.env("REDLOCK_NODES", &nodes)
            .env("REDLOCK_RESTART_GUARD", "off")
            .args([
                "run", "-n", "2", "--ttl", "5s", "--wait", wait, "jobs", "--",
            ])
            .args([
                "sh",
                "-c",
                &format!(
                    "echo \"$REDLOCK_KEY\" > {d}/{name}; while [ ! -e {g} ]; do sleep 0.05; done",
                    d = dir.display(),
                    g = gate.display()
                ),
            ]);
        cmd
    };
    let mut first = run("one", "0s").spawn().unwrap();
    let mut second = run("two", "0s").spawn().unwrap();
    wait_until(WAIT, "both permits taken", || async {
        dir.join("one").exists() && dir.join("two").exists()
    })
    .await;
    let third = run("three", "0s").output().await.unwrap();
    assert_eq!(third.status.code(), Some(75), "a third ran with 2 permits");
    assert!(!dir.join("three").exists());
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(stderr.contains("jobs"), "{stderr}");
    // Once a permit is free, a waiting third runs.
    let mut waiting = run("three", "30s").spawn().unwrap();
    std::fs::write(&gate, b"").unwrap();
    for child in [&mut first, &mut second, &mut waiting] {
        let status = tokio::time::timeout(WAIT, child.wait())
            .await
            .expect("exits")
            .unwrap();
        assert!(status.success());
    }
    assert!(dir.join("three").exists());
    let keys: Vec<String> = ["one", "two", "three"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(dir.join(f))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    assert!(
        keys.iter().all(|k| k.starts_with("jobs:permit:")),
        "{keys:?}"
    );
    assert_ne!(keys[0], keys[1], "two CMDs on one permit");
}
