//! Pulls against a real local HTTP server that speaks the hub's protocol and
//! serves the embedded fixture checkpoint, through every fault the hub
//! manager must survive: nothing lost, nothing corrupted.

mod common;

use common::fake_hub::{repo_from_dir, FakeHub, FakeRepo, Faults};
use flashbar_hub::config::RetryPolicy;
use flashbar_hub::{pull, CancelToken, HubConfig, HubError, PullEvent, PullRequest, Store};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const REPO: &str = "flashbar-test/tiny-target";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const WEIGHTS: &str = "model.safetensors";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target")
}

fn fixture_repo() -> FakeRepo {
    repo_from_dir(&fixture_dir(), COMMIT)
}

async fn start_hub() -> FakeHub {
    FakeHub::start(HashMap::from([(REPO.to_owned(), fixture_repo())])).await
}

fn config(hub: &FakeHub, store: &Path, retries: u32) -> HubConfig {
    HubConfig {
        endpoint: hub.url.clone(),
        token: None,
        send_token_to_mirror: false,
        store: Store::new(store),
        retry: RetryPolicy {
            max_retries: retries,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(20),
        },
        assume_free_bytes: None,
        stall_timeout: Duration::from_secs(20),
    }
}

/// Collects events for assertions.
#[derive(Default, Clone)]
struct Events(Arc<Mutex<Vec<PullEvent>>>);

impl Events {
    fn sink(&self) -> impl Fn(&PullEvent) + Send + Sync + 'static {
        let events = self.0.clone();
        move |e: &PullEvent| events.lock().unwrap().push(e.clone())
    }
    fn all(&self) -> Vec<PullEvent> {
        self.0.lock().unwrap().clone()
    }
}

fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// Every fixture file is in the snapshot with the same bytes.
fn assert_snapshot_matches(snapshot: &Path) {
    let source = fixture_repo();
    for file in &source.files {
        let pulled = snapshot.join(&file.path);
        assert_eq!(
            sha256_file(&pulled),
            file.sha256(),
            "{} differs from the served file",
            file.path
        );
    }
}

fn weights_sha() -> String {
    sha256_file(&fixture_dir().join(WEIGHTS))
}

fn blob_dir(store: &Path) -> PathBuf {
    store
        .join("models--flashbar-test--tiny-target")
        .join("blobs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_download_lands_in_the_hf_cache_layout() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    let events = Events::default();
    let sink = events.sink();
    let pulled = pull(
        &config(&hub, store.path(), 0),
        &PullRequest::new(REPO),
        &sink,
        &CancelToken::new(),
    )
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
    let again = pull(
        &config(&hub, store.path(), 0),
        &PullRequest::new(REPO),
        &|_| {},
        &CancelToken::new(),
    )
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
    let request = PullRequest {
        files: vec![WEIGHTS.to_owned()],
        ..PullRequest::new(REPO)
    };
    let error = pull(
        &config(&hub, store.path(), 0),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, HubError::Transient { .. }), "{error}");
    let partial = blob_dir(store.path()).join(format!("{}.incomplete", weights_sha()));
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept <= cut, "kept {kept} bytes");
    // What was kept is exactly the start of the file.
    let source = std::fs::read(fixture_dir().join(WEIGHTS)).unwrap();
    assert_eq!(std::fs::read(&partial).unwrap(), source[..kept as usize]);

    hub.clear_seen();
    let pulled = pull(
        &config(&hub, store.path(), 0),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
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
    let pulled = pull(
        &config(&hub, store.path(), 3),
        &PullRequest::new(REPO),
        &sink,
        &CancelToken::new(),
    )
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
    let request = PullRequest {
        files: vec![WEIGHTS.to_owned()],
        ..PullRequest::new(REPO)
    };
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
    let pulled = pull(
        &config(&hub, store.path(), 0),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
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
    let request = PullRequest {
        files: vec![WEIGHTS.to_owned()],
        ..PullRequest::new(REPO)
    };
    // Corrupt every time: the pull fails, and no corrupt file is left anywhere.
    hub.set_faults(Faults {
        corrupt_left: 100,
        ..Faults::default()
    });
    let error = pull(
        &config(&hub, store.path(), 1),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
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
    let pulled = pull(
        &config(&hub, store.path(), 1),
        &request,
        &sink,
        &CancelToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), weights_sha());
    assert!(events
        .all()
        .iter()
        .any(|e| matches!(e, PullEvent::Retrying { reason, .. } if reason.contains("sha256"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_repo_or_revision_is_a_clear_error() {
    let hub = start_hub().await;
    let store = tempfile::tempdir().unwrap();
    let error = pull(
        &config(&hub, store.path(), 2),
        &PullRequest::new("nobody/nothing"),
        &|_| {},
        &CancelToken::new(),
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
    let error = pull(
        &config(&hub, store.path(), 0),
        &PullRequest::new("not a repo"),
        &|_| {},
        &CancelToken::new(),
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
    let request = PullRequest {
        files: vec![WEIGHTS.to_owned()],
        ..PullRequest::new(REPO)
    };
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
    let pulled = pull(
        &config(&hub, store.path(), 0),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
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
    let request = PullRequest {
        files: vec![WEIGHTS.to_owned()],
        ..PullRequest::new(REPO)
    };
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
    let error = pull(
        &config(&hub, store.path(), 0),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
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
    let pulled = pull(
        &config(&hub, store.path(), 0),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
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
    let request = PullRequest {
        files: vec![WEIGHTS.to_owned()],
        ..PullRequest::new(REPO)
    };
    let events = Events::default();
    let sink = events.sink();
    let pulled = pull(
        &config(&hub, store.path(), 3),
        &request,
        &sink,
        &CancelToken::new(),
    )
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
    let error = pull(
        &config(&hub, store.path(), 1),
        &request,
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("503"), "{error}");
}
