//! Handing a lock over between processes: a dispatcher acquires and forgets its guard, a worker
//! with a client of its own resumes the lock from its key, value and token (checked by an
//! extension round), and then extends, keeps alive and releases it. Against real redis-server
//! processes, with fresh clients for each side.

use std::time::Duration;

use crate::support::*;
use quorumlock::{ArgumentError, Error, FencingToken, LostReason, Redlock};

/// What a dispatcher passes on: key, value and token of a lock it acquired and then forgot.
async fn dispatch(dispatcher: &Redlock, key: &str, ttl: Duration) -> (String, FencingToken) {
    let lock = dispatcher.try_acquire(key, ttl).await.expect("acquire");
    let handed = (lock.value().to_owned(), lock.token());
    lock.forget();
    handed
}

/// The whole hand-off: the worker's lock has the dispatcher's token and value, extends, keeps
/// alive (a later extension by keep-alive moves the key's expiry on the nodes) and releases;
/// the key is then gone everywhere and free for a third client.
#[tokio::test]
async fn h1_a_worker_resumes_extends_keeps_alive_and_releases_a_dispatched_lock() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dispatcher = client(&cluster);
    let (value, token) = dispatch(&dispatcher, "job-42", LONG_TTL).await;
    assert!(token.get() >= 1);

    let worker = client(&cluster);
    let lock = worker
        .resume("job-42", &value, token, Duration::from_secs(3))
        .await
        .expect("resume");
    assert_eq!(lock.key(), "job-42");
    assert_eq!(lock.value(), value);
    assert_eq!(lock.token(), token);
    assert_eq!(lock.ttl(), Duration::from_secs(3));
    assert!(lock.validity() > Duration::ZERO && lock.validity() <= Duration::from_secs(3));
    // The resume's extension shortened the key to the worker's lease where it stands.
    let holders_now = urls
        .iter()
        .filter(|u| value_on(u, "job-42").is_some())
        .count();
    assert!(holders_now >= 3, "{holders_now}");

    let validity = lock.extend(Duration::from_secs(3)).await.expect("extend");
    assert!(validity > Duration::ZERO);
    // Keep-alive every 100 ms: the lock outlives its 3 s lease, for as long as it runs.
    lock.keep_alive_every(Duration::from_millis(100));
    let first = lock.deadline();
    wait_until(WAIT, "keep-alive moved the deadline on", || async {
        lock.deadline() > first + Duration::from_millis(500)
    })
    .await;
    assert!(!lock.is_lost());
    assert!(
        matches!(
            client(&cluster).try_acquire("job-42", LONG_TTL).await,
            Err(Error::Held { .. })
        ),
        "held for the worker"
    );
    lock.release().await.expect("release");
    wait_until(WAIT, "the key is gone from every node", || async {
        holders(&urls, "job-42") == 0
    })
    .await;
    let next = client(&cluster)
        .try_acquire("job-42", LONG_TTL)
        .await
        .expect("free after the worker's release");
    assert!(next.token() > token, "{} after {token}", next.token());
    next.release().await.unwrap();
}

/// A value that does not stand on a quorum does not resume: a wrong value, a lock released,
/// and a lock expired are each `Lost` with `NotOwner` (the refusals alone rule out a quorum),
/// and nothing is written: an absent key is not re-set, another owner's is left alone.
#[tokio::test]
async fn h2_a_wrong_released_or_expired_value_is_not_ours() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let dispatcher = client(&cluster);
    let worker = client(&cluster);
    warm(&worker).await;

    // A wrong value while the real lock is held.
    let (value, token) = dispatch(&dispatcher, "wrong", LONG_TTL).await;
    let wrong = format!("{:032x}", 7u128);
    let err = worker
        .resume("wrong", &wrong, token, LONG_TTL)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::NotOwner { owned: 0, .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_retryable(), "{err}");
    assert!(
        urls.iter()
            .all(|u| value_on(u, "wrong").as_deref() != Some(wrong.as_str()))
    );
    let held = worker
        .resume("wrong", &value, token, LONG_TTL)
        .await
        .expect("the right one");
    held.release().await.unwrap();

    // Released: the value stands nowhere.
    let err = worker
        .resume("wrong", &value, token, LONG_TTL)
        .await
        .unwrap_err();
    assert!(is_not_owner(&err), "{err}");
    assert_eq!(holders(&urls, "wrong"), 0, "an absent key is never re-set");

    // Expired: a 300 ms lock, resumed after its key is gone from every node.
    let (value, token) = dispatch(&dispatcher, "short", Duration::from_millis(300)).await;
    wait_until(WAIT, "the short lock expired everywhere", || async {
        holders(&urls, "short") == 0
    })
    .await;
    let err = worker
        .resume("short", &value, token, LONG_TTL)
        .await
        .unwrap_err();
    assert!(is_not_owner(&err), "{err}");
    assert_eq!(holders(&urls, "short"), 0);
}

/// The value on a minority only (2 of 5 nodes, the others free) does not resume, and the free
/// nodes stay free: unlike a held lock's extension, a resume never re-sets a missing key.
#[tokio::test]
async fn h3_a_value_on_a_minority_does_not_resume_and_is_not_spread() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let worker = client(&cluster);
    warm(&worker).await;
    let value = "0123456789abcdef0123456789abcdef@dispatcher";
    for url in &urls[..2] {
        set_foreign(url, "minority", value, LONG_TTL);
    }
    let err = worker
        .resume("minority", value, FencingToken::new(1), LONG_TTL)
        .await
        .unwrap_err();
    assert!(is_not_owner(&err), "{err}");
    for url in &urls[2..] {
        assert_eq!(value_on(url, "minority"), None, "{url}");
    }
}

/// Too few nodes reachable is told apart from "not ours": `NoQuorum`, retryable, naming the
/// nodes; once they are back, the same hand-off resumes.
#[tokio::test]
async fn h4_too_few_nodes_reachable_is_no_quorum_not_a_loss() {
    let mut cluster = cluster(5);
    let urls = cluster.urls();
    let dispatcher = client(&cluster);
    let lock = dispatcher.try_acquire("job", LONG_TTL).await.unwrap();
    spread(&lock, &urls).await;
    let (value, token) = (lock.value().to_owned(), lock.token());
    lock.forget();
    for i in [0, 1, 2] {
        cluster.pause(i).unwrap();
    }
    let worker = client(&cluster);
    let err = worker
        .resume("job", &value, token, LONG_TTL)
        .await
        .unwrap_err();
    assert!(err.is_no_quorum(), "{err}");
    assert!(err.is_retryable(), "{err}");
    match &err {
        Error::NoQuorum { failures, .. } => assert_eq!(failures.len(), 3, "{err}"),
        other => panic!("{other}"),
    }
    for i in [0, 1, 2] {
        cluster.resume(i).unwrap();
    }
    // Reconnecting takes a moment: retried (bounded) while it is still too few nodes.
    let deadline = tokio::time::Instant::now() + WAIT;
    let lock = loop {
        match worker.resume("job", &value, token, LONG_TTL).await {
            Ok(lock) => break lock,
            Err(e) if e.is_no_quorum() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("resumes once the nodes are back: {e}"),
        }
    };
    assert_eq!(lock.token(), token);
    lock.release().await.unwrap();
}

/// Values and keys that cannot be ours are refused before any round.
#[tokio::test]
async fn h5_invalid_values_are_argument_errors() {
    let cluster = cluster(3);
    let worker = client(&cluster);
    for bad in ["", "with space", "line\nbreak", &"x".repeat(1025)] {
        match worker
            .resume("k", bad, FencingToken::new(1), LONG_TTL)
            .await
        {
            Err(Error::InvalidArgument(ArgumentError::InvalidValue { .. })) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(matches!(
        worker.resume("", "v", FencingToken::new(1), LONG_TTL).await,
        Err(Error::InvalidArgument(ArgumentError::InvalidKey { .. }))
    ));
}
