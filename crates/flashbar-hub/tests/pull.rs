//! Pulls against a real local HTTP server that speaks the hub's protocol and
//! serves the embedded fixture checkpoint, through the faults a download
//! meets on the way: a cut connection, a server that ignores Range, bytes
//! corrupted in flight. Nothing lost, nothing corrupted.

mod common;

use common::fake_hub::Faults;
use common::fixture::*;
use flashbar_hub::{pull, CancelToken, HubError, PullEvent, PullRequest};
use std::path::Path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_download_lands_in_the_hf_cache_layout() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    let events = Events::default();
    let sink = events.sink();
    let pulled = pull_from(&hub, store.path(), 0, &PullRequest::new(REPO), &sink)
        .await
        .unwrap();
    assert_eq!(pulled.commit, COMMIT);
    let repo_dir = store.path().join("models--flashbar-test--tiny-target");
    assert_eq!(pulled.snapshot, repo_dir.join("snapshots").join(COMMIT));
    assert_snapshot_matches(&pulled.snapshot);
    // LFS blobs are named by sha256, links are relative, refs/main holds the commit.
    assert!(repo_dir.join("blobs").join(weights_sha()).is_file());
    let link = std::fs::read_link(pulled.snapshot.join(WEIGHTS)).unwrap();
    assert_eq!(link, Path::new("../../blobs").join(weights_sha()));
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    let total: u64 = fixture_repo()
        .files
        .iter()
        .map(|f| f.bytes.len() as u64)
        .sum();
    assert_eq!(pulled.downloaded_bytes, total);

    let events = events.all();
    assert!(
        matches!(&events[0], PullEvent::Resolved { total_bytes, to_download_bytes, .. }
        if *total_bytes == total && *to_download_bytes == total)
    );
    let checked: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            PullEvent::FileDone {
                file,
                sha256_checked,
                ..
            } => Some((file.clone(), *sha256_checked)),
            _ => None,
        })
        .collect();
    assert_eq!(checked.len(), fixture_repo().files.len());
    assert!(checked.contains(&(WEIGHTS.to_owned(), true)));
    assert!(checked.contains(&("config.json".to_owned(), false)));
    let last_progress = events
        .iter()
        .rev()
        .find_map(|e| match e {
            PullEvent::Progress(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(last_progress.done_bytes, total);
    assert!(
        matches!(events.last(), Some(PullEvent::Done { snapshot }) if *snapshot == pulled.snapshot)
    );

    // The pulled folder is a loadable model: the doctor's file and loader checks pass.
    let report = flashbar_hub::doctor::diagnose(&pulled.snapshot, None);
    for check in &report.checks {
        if check.name != "memory" && check.name != "chat template" {
            assert_eq!(check.status, flashbar_hub::doctor::Status::Ok, "{check:?}");
        }
    }

    // A second pull finds everything in place and fetches no file body.
    hub.clear_seen();
    let again = pull_from(&hub, store.path(), 0, &PullRequest::new(REPO), &|_| {})
        .await
        .unwrap();
    assert_eq!(again.downloaded_bytes, 0);
    assert!(hub
        .seen()
        .iter()
        .all(|s| s.method != "GET" || s.path.starts_with("/api/")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_killed_mid_file_resumes_with_range() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    let cut = 50_000u64;
    hub.set_faults(Faults {
        cut_after: Some(cut),
        cuts_left: 1,
        ..Faults::default()
    });
    let request = weights_request();
    let error = pull_from(&hub, store.path(), 0, &request, &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(error, HubError::Transient { .. }), "{error}");
    let partial = blob_dir(store.path()).join(format!("{}.incomplete", weights_sha()));
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept <= cut, "kept {kept} bytes");
    // What was kept is exactly the start of the file.
    let source = std::fs::read(fixture_dir().join(WEIGHTS)).unwrap();
    assert_eq!(std::fs::read(&partial).unwrap(), source[..kept as usize]);

    // Only the asked-for file is probed and fetched.
    let probed: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.path.contains("/resolve/"))
        .collect();
    assert!(
        !probed.is_empty() && probed.iter().all(|s| s.path.ends_with(WEIGHTS)),
        "{probed:?}"
    );
    hub.clear_seen();
    let pulled = pull_from(&hub, store.path(), 0, &request, &|_| {})
        .await
        .unwrap();
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), weights_sha());
    assert_eq!(pulled.downloaded_bytes, source.len() as u64 - kept);
    let body_gets: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET" && s.path.contains("/resolve/"))
        .collect();
    assert_eq!(body_gets.len(), 1, "{body_gets:?}");
    assert_eq!(
        body_gets[0].range.as_deref(),
        Some(format!("bytes={kept}-").as_str())
    );
    assert_eq!(body_gets[0].status, 206);
    assert!(!partial.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_carry_a_cut_download_through_in_one_pull() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    hub.set_faults(Faults {
        cut_after: Some(40_000),
        cuts_left: 2,
        ..Faults::default()
    });
    let events = Events::default();
    let sink = events.sink();
    let pulled = pull_from(&hub, store.path(), 3, &PullRequest::new(REPO), &sink)
        .await
        .unwrap();
    assert_snapshot_matches(&pulled.snapshot);
    let retries = events
        .all()
        .iter()
        .filter(|e| matches!(e, PullEvent::Retrying { .. }))
        .count();
    assert_eq!(retries, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_range_never_corrupts_the_file() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    hub.set_faults(Faults {
        cut_after: Some(30_000),
        cuts_left: 1,
        ..Faults::default()
    });
    let request = weights_request();
    assert!(pull(
        &config(&hub, store.path(), 0),
        &request,
        &|_| {},
        &CancelToken::new()
    )
    .await
    .is_err());
    hub.set_faults(Faults {
        ignore_range: true,
        ..Faults::default()
    });
    hub.clear_seen();
    let pulled = pull_from(&hub, store.path(), 0, &request, &|_| {})
        .await
        .unwrap();
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), weights_sha());
    let body_gets: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET" && s.path.contains("/resolve/"))
        .collect();
    assert_eq!(body_gets.len(), 1);
    assert!(body_gets[0].range.is_some(), "the resume asked for a range");
    assert_eq!(
        body_gets[0].status, 200,
        "and the server sent the whole file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_corrupted_in_flight_are_detected() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    let request = weights_request();
    // Corrupt every time: the pull fails, and no corrupt file is left anywhere.
    hub.set_faults(Faults {
        corrupt_left: 100,
        ..Faults::default()
    });
    let error = pull_from(&hub, store.path(), 1, &request, &|_| {})
        .await
        .unwrap_err();
    match &error {
        HubError::Corrupt {
            file,
            expected,
            actual,
        } => {
            assert_eq!(file, WEIGHTS);
            assert_eq!(expected, &weights_sha());
            assert_ne!(actual, expected);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    let blobs: Vec<_> = std::fs::read_dir(blob_dir(store.path()))
        .unwrap()
        .flatten()
        .collect();
    assert!(blobs.is_empty(), "left behind: {blobs:?}");
    // Corrupt once: detected, fetched again, correct.
    hub.set_faults(Faults {
        corrupt_left: 1,
        ..Faults::default()
    });
    let events = Events::default();
    let sink = events.sink();
    let pulled = pull_from(&hub, store.path(), 1, &request, &sink)
        .await
        .unwrap();
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), weights_sha());
    assert!(events
        .all()
        .iter()
        .any(|e| matches!(e, PullEvent::Retrying { reason, .. } if reason.contains("sha256"))));
}
