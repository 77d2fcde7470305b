//! A flaky hub, for real: the local test hub (a real HTTP server on a real
//! TCP socket) drops connections mid-body, stalls mid-body, answers 500,
//! 503 and 429, and declares a wrong Content-Length, one fault per body GET
//! (`Fault` in common/fake_hub.rs). Every pull ends either with the file's
//! sha256 right or with a clear one-line error, and never leaves a wrong
//! file as the final file: only `<blob>.incomplete` holds unchecked bytes
//! (docs/reliability.md, "A flaky hub").

mod common;

use common::fake_hub::{FakeFile, FakeHub, FakeRepo, Fault, Faults};
use common::fixture::{config, sha256_file, Events, COMMIT};
use flashbar_hub::{pull, CancelToken, PullEvent, PullRequest};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const REPO: &str = "flaky/tiny";
const WEIGHTS: &str = "model.safetensors";
/// 1 MiB: 64 of the hub's 16 KiB chunks, quick to fetch many times over.
const SIZE: usize = 1 << 20;

/// Seeded pseudo-random weights (xorshift), the same on every machine.
fn weights() -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..SIZE)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

async fn start() -> (FakeHub, String) {
    let bytes = weights();
    let sha = hex::encode(Sha256::digest(&bytes));
    let repo = FakeRepo {
        commit: COMMIT.into(),
        files: vec![FakeFile {
            path: WEIGHTS.into(),
            bytes: Arc::new(bytes),
            lfs: true,
        }],
    };
    (
        FakeHub::start(HashMap::from([(REPO.to_owned(), repo)])).await,
        sha,
    )
}

fn request() -> PullRequest {
    PullRequest::new(REPO)
}

fn blob(store: &Path, sha: &str) -> std::path::PathBuf {
    store.join("models--flaky--tiny/blobs").join(sha)
}

fn snapshot_file(store: &Path) -> std::path::PathBuf {
    store
        .join("models--flaky--tiny/snapshots")
        .join(COMMIT)
        .join(WEIGHTS)
}

/// The pull's outcome against `faults`, with `retries` retries and a stall
/// timeout of 2 s (a stalled body sends nothing, ever, so any timeout ends
/// it; 2 s only keeps the test short).
async fn pull_through(
    hub: &FakeHub,
    store: &Path,
    retries: u32,
    script: Vec<Fault>,
) -> (
    Result<flashbar_hub::PulledRepo, flashbar_hub::HubError>,
    Vec<PullEvent>,
) {
    hub.set_faults(Faults {
        script: VecDeque::from(script),
        ..Faults::default()
    });
    let mut config = config(hub, store, retries);
    config.stall_timeout = Duration::from_secs(2);
    let events = Events::default();
    let sink = events.sink();
    let outcome = pull(&config, &request(), &sink, &CancelToken::new()).await;
    (outcome, events.all())
}

/// Each fault alone, with no retry: the pull fails with a one-line error
/// that names the file and says what went wrong, the final blob is not
/// there (nor its link), and the next pull, from a healthy hub, resumes
/// from what was kept and ends with the right sha256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_alone_is_a_clear_error_and_the_next_pull_is_sha256_right() {
    let (hub, sha) = start().await;
    let faults: [(Fault, &str); 7] = [
        (Fault::Cut(300_000), "connection"),
        (Fault::Status(500), "HTTP 500"),
        (Fault::Status(503), "HTTP 503"),
        (Fault::Status(429), "HTTP 429"),
        (Fault::Stall(200_000), "stalled"),
        (Fault::Length(-1000), "ended at"),
        (Fault::Length(1000), "model.safetensors"),
    ];
    for (fault, says) in faults {
        let what = format!("{fault:?}");
        let store = tempfile::tempdir().unwrap();
        let (outcome, _) = pull_through(&hub, store.path(), 0, vec![fault]).await;
        let error = match outcome {
            Ok(_) => panic!("{what}: the pull succeeded through the fault"),
            Err(error) => error.to_string(),
        };
        eprintln!("{what}: {error}");
        assert!(!error.contains('\n'), "{what}: not one line: {error}");
        assert!(error.starts_with(WEIGHTS), "{what}: {error}");
        assert!(error.contains(says), "{what}: {error:?} lacks {says:?}");
        assert!(!blob(store.path(), &sha).exists(), "{what}: a final blob");
        assert!(
            std::fs::symlink_metadata(snapshot_file(store.path())).is_err(),
            "{what}: a snapshot link to unchecked bytes"
        );
        let kept =
            std::fs::metadata(flashbar_partial(&blob(store.path(), &sha))).map_or(0, |m| m.len());
        hub.clear_seen();
        let (outcome, _) = pull_through(&hub, store.path(), 0, vec![]).await;
        let pulled = outcome.unwrap_or_else(|e| panic!("{what}: the clean pull failed: {e}"));
        assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), sha, "{what}");
        let range = hub
            .seen()
            .into_iter()
            .find(|s| s.method == "GET" && s.path.ends_with(WEIGHTS))
            .and_then(|s| s.range);
        // Nothing kept: from the start; all of it kept: no GET at all.
        let expected = (kept > 0 && kept < SIZE as u64).then(|| format!("bytes={kept}-"));
        assert_eq!(range, expected, "{what}: resumed from the wrong byte");
    }
}

/// All the faults in a row, with retries: the pull carries through them
/// in one go and ends sha256-right; with too few retries it ends with a
/// clear error and no final file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_through_a_run_of_faults_is_sha256_right_or_a_clear_error() {
    let (hub, sha) = start().await;
    // Offsets count from each answer's first byte: the faults that cut a
    // body short come while there is body left to cut, and the last one
    // sends the final 5,000 bytes with a Content-Length 5,000 too long.
    let script = || {
        vec![
            Fault::Cut(100_000),
            Fault::Status(500),
            Fault::Stall(50_000),
            Fault::Status(503),
            Fault::Cut(1),
            Fault::Length(-5000),
            Fault::Length(5000),
        ]
    };

    let store = tempfile::tempdir().unwrap();
    let (outcome, events) = pull_through(&hub, store.path(), 3, script()).await;
    let error = outcome.expect_err("3 retries cannot outlast 7 faults");
    assert_eq!(
        error.to_string(),
        "model.safetensors: HTTP 503 Service Unavailable"
    );
    let retries = events
        .iter()
        .filter(|e| matches!(e, PullEvent::Retrying { .. }))
        .count();
    assert_eq!(retries, 3);
    assert!(!error.to_string().contains('\n'), "{error}");
    assert!(!blob(store.path(), &sha).exists());
    assert!(std::fs::symlink_metadata(snapshot_file(store.path())).is_err());

    let store = tempfile::tempdir().unwrap();
    let (outcome, events) = pull_through(&hub, store.path(), 10, script()).await;
    let pulled = outcome.unwrap();
    assert_eq!(sha256_file(&pulled.snapshot.join(WEIGHTS)), sha);
    assert_eq!(sha256_file(&blob(store.path(), &sha)), sha);
    let reasons: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            PullEvent::Retrying { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 7, "one retry per fault: {reasons:#?}");
    assert!(reasons.iter().all(|r| !r.contains('\n')), "{reasons:#?}");
}

fn flashbar_partial(blob: &Path) -> std::path::PathBuf {
    let mut name = blob.as_os_str().to_owned();
    name.push(".incomplete");
    name.into()
}
