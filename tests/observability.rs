//! Observability as a team runs it: `examples/prometheus.rs`'s recorder serving `/metrics`,
//! scraped over HTTP while the gauges move with the scenario (t10); the Grafana dashboard's
//! queries name only metrics the crate emits (t11).

mod support;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/prometheus.rs"]
mod example;

use quorumlock::{Error, Lock, LostReason, Redlock};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET /metrics` over one HTTP/1.0 connection: the body.
async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .expect("the exporter answers")
        .unwrap();
    assert!(
        response.starts_with("HTTP/1.") && response.contains(" 200 "),
        "{response}"
    );
    response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned()
}

/// The value of the sample `series` (name and labels as Prometheus renders them).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn t10_the_gauges_move_as_the_scenario_does_on_a_scraped_endpoint() {
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    example::install(addr).expect("the recorder is installed once in this binary");
    let mut cluster = cluster(3);
    let urls = cluster.urls();
    let locks = client(&cluster);
    let a = locks.try_acquire("obs:a", TTL).await.unwrap();
    let b = locks.try_acquire("obs:b", TTL).await.unwrap();

    let body = scrape(addr).await;
    assert!(body.contains("# HELP quorumlock_locks_held"), "{body}");
    assert_eq!(sample(&body, "quorumlock_locks_held"), Some(2.0), "{body}");
    for url in &urls {
        assert_eq!(node_up(&body, url), Some(1.0), "{body}");
    }
    let c = node_gauges_follow_a_restart(&mut cluster, &locks, addr).await;
    counters_follow_release_and_revoke(&cluster, [a, b, c], addr).await;
    leader_gauge_follows_terms(&cluster, addr).await;
    a_takeover_is_timed(&cluster, addr).await;
}

/// The `quorumlock_node_up` sample of node `url`.
fn node_up(body: &str, url: &str) -> Option<f64> {
    sample(body, &format!("quorumlock_node_up{{node=\"{url}\"}}"))
}

/// Node 2 killed, then restarted empty: its gauges read down, up, then held out. Returns the
/// lock "obs:c" taken while it was down.
async fn node_gauges_follow_a_restart(
    cluster: &mut Cluster,
    locks: &Redlock,
    addr: std::net::SocketAddr,
) -> Lock {
    let urls = cluster.urls();
    // A node killed: down on its first failed call; back up once it answers again.
    cluster.kill(2).unwrap();
    let c = locks.try_acquire("obs:c", TTL).await.unwrap();
    wait_until(WAIT, "node 2 reads down", || async {
        let _ = locks.status("obs:c").await;
        node_up(&scrape(addr).await, &urls[2]) == Some(0.0)
    })
    .await;
    // Back empty: it answers (up), but the restart guard holds it out of quorums until its
    // counters are safe again; the held-out gauge says so, with the reason.
    cluster.restart_empty(2).unwrap();
    wait_until(WAIT, "node 2 reads up", || async {
        let _ = locks.status("obs:c").await;
        node_up(&scrape(addr).await, &urls[2]) == Some(1.0)
    })
    .await;
    let held_out = |body: &str| {
        body.lines()
            .filter(|l| l.starts_with(&format!("quorumlock_node_held_out{{node=\"{}\"", urls[2])))
            .any(|l| l.ends_with(" 1"))
    };
    wait_until(WAIT, "node 2 reads held out", || async {
        if let Ok(lock) = locks.try_acquire("obs:d", TTL).await {
            lock.release().await.ok();
        }
        held_out(&scrape(addr).await)
    })
    .await;
    c
}

/// Locks "obs:a" released, "obs:b" revoked (its extension then fails), "obs:c" released: the
/// held gauge, hold times, the revoke and the failed extension as counted.
async fn counters_follow_release_and_revoke(
    cluster: &Cluster,
    [a, b, c]: [Lock; 3],
    addr: std::net::SocketAddr,
) {
    // Released, revoked: the gauge goes down, hold times are recorded, the revoke and the
    // failed extension are counted.
    a.release().await.unwrap();
    let revocation = client(cluster).revoke("obs:b").await.unwrap();
    assert!(revocation.revoked());
    let err = b.extend(TTL).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::Revoked,
                ..
            }
        ),
        "{err}"
    );
    c.release().await.unwrap();
    let body = scrape(addr).await;
    assert_eq!(sample(&body, "quorumlock_locks_held"), Some(0.0), "{body}");
    assert!(
        body.contains("# HELP quorumlock_lock_hold_seconds"),
        "{body}"
    );
    assert!(
        sample(&body, "quorumlock_lock_hold_seconds_count").is_some_and(|n| n >= 3.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "quorumlock_revokes_total{outcome=\"revoked\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "quorumlock_extensions_failed_total{reason=\"revoked\"}"
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "quorumlock_locks_lost_total"),
        Some(1.0),
        "{body}"
    );
}

/// An election's leader gauge and term counters, through a resign and a revoke.
async fn leader_gauge_follows_terms(cluster: &Cluster, addr: std::net::SocketAddr) {
    // A leadership: the leader gauge while this process leads, the term counted; resigned,
    // the gauge goes back and no term is counted lost. A term revoked under its leader is.
    let leader = |body: &str| sample(body, "quorumlock_leader{election=\"obs:e\"}");
    let election = quorumlock::Election::builder(client(cluster), "obs:e")
        .candidate("a")
        .build()
        .unwrap();
    let term = election.campaign().await.unwrap();
    let body = scrape(addr).await;
    assert!(body.contains("# HELP quorumlock_leader"), "{body}");
    assert_eq!(leader(&body), Some(1.0), "{body}");
    term.resign().await.unwrap();
    let body = scrape(addr).await;
    assert_eq!(leader(&body), Some(0.0), "{body}");
    let term = election.campaign().await.unwrap();
    let body = scrape(addr).await;
    assert_eq!(leader(&body), Some(1.0), "{body}");
    assert_eq!(
        sample(&body, "quorumlock_terms_total{election=\"obs:e\"}"),
        Some(2.0),
        "{body}"
    );
    assert!(client(cluster).revoke("obs:e").await.unwrap().revoked());
    wait_until(WAIT, "the revoked term reads lost", || async {
        let body = scrape(addr).await;
        leader(&body) == Some(0.0)
            && sample(&body, "quorumlock_terms_lost_total{election=\"obs:e\"}") == Some(1.0)
    })
    .await;
    drop(term);
}

/// A waiter woken by the holder's release takes over, and the takeover is timed.
async fn a_takeover_is_timed(cluster: &Cluster, addr: std::net::SocketAddr) {
    let urls = cluster.urls();
    let holder = client(cluster).try_acquire("obs:t", TTL).await.unwrap();
    // The waiter reads the holder's key (`PTTL` on every node) once its marker stands, and
    // waits for the release only if the key still stands then: the release follows that read.
    let pttls = |urls: &[String]| -> Vec<u64> { urls.iter().map(|u| calls(u, "pttl")).collect() };
    let before = pttls(&urls);
    let waiting = client(cluster);
    let waiter = tokio::spawn(async move {
        waiting
            .acquire_timeout("obs:t", TTL, std::time::Duration::from_secs(30))
            .await
    });
    let subscribed = |url: &str| {
        let (_, n): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(format!("{}:waiters", lock_key("obs:t")))
            .query(&mut conn(url))
            .expect("PUBSUB NUMSUB");
        n > 0
    };
    wait_until(WAIT, "the waiter waits", || async {
        urls.iter().all(|u| subscribed(u)) && pttls(&urls).iter().zip(&before).all(|(n, b)| n > b)
    })
    .await;
    holder.release().await.unwrap();
    let taken = waiter.await.unwrap().expect("the waiter takes over");
    let body = scrape(addr).await;
    assert!(
        body.contains("# HELP quorumlock_takeover_seconds"),
        "{body}"
    );
    // Woken by the notice, or by its timer should the notice have come before its marker.
    let takeovers = ["release", "expiry"]
        .iter()
        .filter_map(|after| {
            sample(
                &body,
                &format!("quorumlock_takeover_seconds_count{{after=\"{after}\"}}"),
            )
        })
        .sum::<f64>();
    assert_eq!(takeovers, 1.0, "{body}");
    taken.release().await.unwrap();
}

/// Every query of the committed Grafana dashboard names only metrics that some
/// `metrics::counter!` / `gauge!` / `histogram!` of the crate's source emits (a histogram's
/// `_bucket`, `_sum` and `_count` series included), and every panel has a query.
#[test]
fn t11_every_dashboard_panel_plots_a_metric_the_crate_emits() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut emitted = std::collections::BTreeSet::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for m in ["counter!(\"", "gauge!(\"", "histogram!(\""] {
                    for part in text.split(m).skip(1) {
                        emitted.insert(part.split('"').next().unwrap().to_owned());
                    }
                }
            }
        }
    }
    assert!(emitted.contains("quorumlock_locks_held"), "{emitted:?}");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("quorumlock_"))
                .collect();
            assert!(!names.is_empty(), "{title}: {expr} names no metric");
            for name in names {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| emitted.contains(*b)))
                    .unwrap_or(name);
                assert!(
                    emitted.contains(base),
                    "{title}: {name} is not emitted ({emitted:?})"
                );
            }
        }
    }
}

/// The dashboard's table in `docs/observability.md` names every panel of the committed
/// dashboard once, each row two cells (the panel's title, the metric its queries plot).
#[test]
fn t12_the_dashboard_table_names_each_panel_and_its_metric() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("docs/observability.md")).unwrap();
    let section = guide.split("\n## Dashboard\n").nth(1).unwrap();
    let section = section.split("\n## ").next().unwrap();
    let rows: Vec<Vec<&str>> = section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("| ---") && !l.starts_with("| panel"))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert_eq!(rows.len(), panels.len(), "{rows:?}");
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        let row = rows.iter().find(|r| r[0] == title);
        let row = row.unwrap_or_else(|| panic!("panel {title:?} is not in the table"));
        assert_eq!(
            row.len(),
            2,
            "row of {title:?} has {} cells: {row:?}",
            row.len()
        );
        let metric = row[1].trim_matches('`');
        let plotted = panel["targets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["expr"].as_str().unwrap().contains(metric));
        assert!(plotted, "panel {title:?} plots no {metric}");
    }
}
