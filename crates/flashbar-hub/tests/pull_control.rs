//! Pulls that must stop, or not start, cleanly: an unknown repo, a cancel, a
//! disk too small, a file another process is downloading, server errors
//! past the retries; and the token policy toward mirrors.

mod common;

use common::fake_hub::Faults;
use common::fixture::*;
use flashbar_hub::{pull, CancelToken, HubError, PullEvent, PullRequest, Store};
use std::sync::Mutex;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_repo_or_revision_is_a_clear_error() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    let error = pull_from(
        &hub,
        store.path(),
        2,
        &PullRequest::new("nobody/nothing"),
        &|_| {},
    )
    .await
    .unwrap_err();
    assert!(matches!(error, HubError::RepoNotFound { .. }), "{error}");
    assert!(error.to_string().contains("nobody/nothing"), "{error}");
    let error = pull(
        &config(&hub, store.path(), 2),
        &PullRequest {
            revision: "v9".into(),
            ..PullRequest::new(REPO)
        },
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, HubError::RepoNotFound { .. }), "{error}");
    // Not found is final: no retries, and nothing written.
    assert_eq!(hub.seen().len(), 2);
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0);
    let error = pull_from(
        &hub,
        store.path(),
        0,
        &PullRequest::new("not a repo"),
        &|_| {},
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("not a hub repo id"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_pull_keeps_its_partial_and_resumes() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    hub.set_faults(Faults {
        chunk_delay: Some(Duration::from_millis(30)),
        ..Faults::default()
    });
    let request = weights_request();
    let cancel = CancelToken::new();
    let trigger = cancel.clone();
    let on_event = move |e: &PullEvent| {
        if let PullEvent::Progress(p) = e {
            if p.file_bytes >= 32 * 1024 {
                trigger.cancel();
            }
        }
    };
    let error = pull(&config(&hub, store.path(), 3), &request, &on_event, &cancel)
        .await
        .unwrap_err();
    assert!(matches!(error, HubError::Cancelled), "{error}");
    let partial = blob_dir(store.path()).join(format!("{}.incomplete", weights_sha()));
    let kept = std::fs::metadata(&partial).unwrap().len();
    let size = std::fs::metadata(fixture_dir().join(WEIGHTS))
        .unwrap()
        .len();
    assert!(kept >= 32 * 1024 && kept < size, "kept {kept} of {size}");

    hub.set_faults(Faults::default());
    let pulled = pull_from(&hub, store.path(), 0, &request, &|_| {})
        .await
        .unwrap();
    assert_eq!(pulled.downloaded_bytes, size - kept);
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), weights_sha());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_is_too_small_stops_the_pull_before_it_starts() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    let total: u64 = fixture_repo()
        .files
        .iter()
        .map(|f| f.bytes.len() as u64)
        .sum();
    let mut small = config(&hub, store.path(), 0);
    small.assume_free_bytes = Some(total - 1);
    let error = pull(
        &small,
        &PullRequest::new(REPO),
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap_err();
    match error {
        HubError::DiskFull { needed, free, .. } => assert_eq!((needed, free), (total, total - 1)),
        other => panic!("expected DiskFull, got {other}"),
    }
    assert!(hub
        .seen()
        .iter()
        .all(|s| s.method != "GET" || s.path.starts_with("/api/")));
    assert!(!blob_dir(store.path()).exists());
    small.assume_free_bytes = Some(total);
    pull(
        &small,
        &PullRequest::new(REPO),
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_goes_to_a_mirror_only_when_asked_and_never_across_a_redirect() {
    let hub = start_hub().await;
    hub.set_faults(Faults {
        redirect_lfs: true,
        ..Faults::default()
    });
    let store = tempfile::tempdir().unwrap();
    let mut mirror = config(&hub, store.path(), 0);
    mirror.token = Some("hf_secret".into());
    let pulled = pull(
        &mirror,
        &PullRequest::new(REPO),
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap();
    assert_snapshot_matches(&pulled.snapshot);
    assert!(
        hub.seen().iter().any(|s| s.path.starts_with("/cdn/")),
        "LFS files came through the redirect"
    );
    assert!(
        hub.seen().iter().all(|s| s.authorization.is_none()),
        "{:?}",
        hub.seen()
    );

    let store = tempfile::tempdir().unwrap();
    hub.clear_seen();
    mirror.store = Store::new(store.path());
    mirror.send_token_to_mirror = true;
    pull(
        &mirror,
        &PullRequest::new(REPO),
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap();
    for seen in hub.seen() {
        let expected = (!seen.path.starts_with("/cdn/")).then_some("Bearer hf_secret");
        assert_eq!(seen.authorization.as_deref(), expected, "{seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_pull_of_the_same_file_is_refused_while_the_first_runs() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    hub.set_faults(Faults {
        chunk_delay: Some(Duration::from_millis(400)),
        ..Faults::default()
    });
    let request = weights_request();
    let first_cancel = CancelToken::new();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let started_tx = Mutex::new(Some(started_tx));
    let first = {
        let config = config(&hub, store.path(), 0);
        let request = request.clone();
        let cancel = first_cancel.clone();
        tokio::spawn(async move {
            let on_event = move |e: &PullEvent| {
                if matches!(e, PullEvent::Progress(_)) {
                    if let Some(tx) = started_tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                }
            };
            pull(&config, &request, &on_event, &cancel).await
        })
    };
    started_rx.await.unwrap();
    let error = pull_from(&hub, store.path(), 0, &request, &|_| {})
        .await
        .unwrap_err();
    match &error {
        HubError::Busy { file, lock } => {
            assert_eq!(file, WEIGHTS);
            assert!(lock.starts_with(store.path().join(".locks")), "{lock:?}");
        }
        other => panic!("expected Busy, got {other}"),
    }
    first_cancel.cancel();
    assert!(matches!(first.await.unwrap(), Err(HubError::Cancelled)));
    // Once the first lets go, the file can be fetched.
    hub.set_faults(Faults::default());
    let pulled = pull_from(&hub, store.path(), 0, &request, &|_| {})
        .await
        .unwrap();
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), weights_sha());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_with_growing_backoff() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    hub.set_faults(Faults {
        unavailable_left: 3,
        ..Faults::default()
    });
    let request = weights_request();
    let events = Events::default();
    let sink = events.sink();
    let pulled = pull_from(&hub, store.path(), 3, &request, &sink)
        .await
        .unwrap();
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), weights_sha());
    let waits: Vec<(u32, u64)> = events
        .all()
        .iter()
        .filter_map(|e| match e {
            PullEvent::Retrying {
                attempt,
                wait_ms,
                reason,
                ..
            } => {
                assert!(reason.contains("503"), "{reason}");
                Some((*attempt, *wait_ms))
            }
            _ => None,
        })
        .collect();
    // base 5 ms, doubling, capped at 20 ms (see `config`).
    assert_eq!(waits, vec![(1, 5), (2, 10), (3, 20)]);

    // One more failure than retries: the pull gives up with the reason.
    let store = tempfile::tempdir().unwrap();
    hub.set_faults(Faults {
        unavailable_left: 2,
        ..Faults::default()
    });
    let error = pull_from(&hub, store.path(), 1, &request, &|_| {})
        .await
        .unwrap_err();
    assert!(error.to_string().contains("503"), "{error}");
}
