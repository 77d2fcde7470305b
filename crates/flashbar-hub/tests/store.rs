//! The local store against the standard HF cache layout, both ways: the
//! official Python client (`huggingface_hub`, from the project's venv) reads
//! what we pull, and we find (and reuse) what it downloads. Plus list, disk
//! usage and delete.

mod common;

use common::fake_hub::{repo_from_dir, FakeHub};
use flashbar_hub::config::RetryPolicy;
use flashbar_hub::{pull, CancelToken, HubConfig, PullRequest, Store};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const TARGET: &str = "flashbar-test/tiny-target";
const DRAFTER: &str = "flashbar-test/tiny-drafter";
const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default")
}

async fn start_hub() -> FakeHub {
    FakeHub::start(HashMap::from([
        (
            TARGET.to_owned(),
            repo_from_dir(&models().join("target"), COMMIT),
        ),
        (
            DRAFTER.to_owned(),
            repo_from_dir(&models().join("drafter"), COMMIT),
        ),
    ]))
    .await
}

fn config(hub: &FakeHub, store: &Path) -> HubConfig {
    HubConfig {
        endpoint: hub.url.clone(),
        token: None,
        send_token_to_mirror: false,
        store: Store::new(store),
        retry: RetryPolicy::default(),
        assume_free_bytes: None,
        stall_timeout: Duration::from_secs(20),
    }
}

fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python")
}

/// Runs a Python snippet with the venv; returns stdout.
async fn run_python(script: &str, args: &[&str]) -> String {
    let output = tokio::process::Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .env_remove("HF_TOKEN")
        .output()
        .await
        .expect("the project's venv (scripts/setup.sh) has Python with huggingface_hub");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_usage_and_delete() {
    let hub = start_hub().await;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    assert!(store.list().unwrap().is_empty());
    for repo in [TARGET, DRAFTER] {
        pull(
            &config(&hub, dir.path()),
            &PullRequest::new(repo),
            &|_| {},
            &CancelToken::new(),
        )
        .await
        .unwrap();
    }
    let listed = store.list().unwrap();
    let names: Vec<&str> = listed.iter().map(|r| r.repo.as_str()).collect();
    assert_eq!(names, vec![DRAFTER, TARGET]);
    let target = &listed[1];
    let served: u64 = std::fs::read_dir(models().join("target"))
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    // Blobs count once; links add nothing.
    assert_eq!(target.size_bytes, served);
    assert_eq!(target.incomplete_bytes, 0);
    assert_eq!(store.disk_usage(TARGET).unwrap(), served);
    assert_eq!(target.snapshots.len(), 1);
    assert_eq!(target.snapshots[0].refs, vec!["main".to_owned()]);
    assert_eq!(target.snapshots[0].missing_files, 0);
    assert_eq!(
        store.snapshot_dir(TARGET, "main"),
        Some(target.snapshots[0].path.clone())
    );
    assert_eq!(
        store.snapshot_dir(TARGET, COMMIT),
        store.snapshot_dir(TARGET, "main")
    );
    assert_eq!(store.snapshot_dir(TARGET, "v2"), None);

    assert_eq!(store.delete(TARGET).unwrap(), served);
    assert_eq!(store.list().unwrap().len(), 1);
    assert_eq!(store.disk_usage(TARGET).unwrap(), 0);
    let error = store.delete(TARGET).unwrap_err().to_string();
    assert!(error.contains("is not in the store"), "{error}");
    assert!(store.delete("../etc").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_reads_what_we_pull() {
    let hub = start_hub().await;
    let dir = tempfile::tempdir().unwrap();
    pull(
        &config(&hub, dir.path()),
        &PullRequest::new(TARGET),
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap();
    let ours = Store::new(dir.path()).disk_usage(TARGET).unwrap();
    let script = r#"
import sys
from huggingface_hub import scan_cache_dir, try_to_load_from_cache
info = scan_cache_dir(sys.argv[1])
repo = [r for r in info.repos if r.repo_id == sys.argv[2]][0]
rev = list(repo.revisions)[0]
path = try_to_load_from_cache(sys.argv[2], "model.safetensors", cache_dir=sys.argv[1])
print(repo.size_on_disk, repo.nb_files, rev.commit_hash, sorted(rev.refs), path is not None)
"#;
    let out = run_python(script, &[dir.path().to_str().unwrap(), TARGET]).await;
    let files = std::fs::read_dir(models().join("target")).unwrap().count();
    assert_eq!(
        out.trim(),
        format!("{ours} {files} {COMMIT} ['main'] True"),
        "huggingface_hub's view of our store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_find_and_reuse_what_the_python_client_downloads() {
    let hub = start_hub().await;
    let dir = tempfile::tempdir().unwrap();
    // The official client fetches from our fake hub: it also checks that the
    // server speaks the protocol the way real clients expect.
    let script = r#"
import os, sys
from huggingface_hub import hf_hub_download
for name in ("config.json", "model.safetensors"):
    path = hf_hub_download(sys.argv[2], name, cache_dir=sys.argv[1], endpoint=sys.argv[3])
print(os.path.dirname(path))
"#;
    let out = run_python(script, &[dir.path().to_str().unwrap(), DRAFTER, &hub.url]).await;
    let store = Store::new(dir.path());
    let found = store
        .snapshot_dir(DRAFTER, "main")
        .expect("found the Python download");
    assert_eq!(Path::new(out.trim()), found);
    assert!(
        hub.seen().iter().any(|s| s.method == "HEAD"),
        "the Python client probed with HEAD"
    );
    let listed = store.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].snapshots[0].files, 2);

    hub.clear_seen();
    let pulled = pull(
        &config(&hub, dir.path()),
        &PullRequest::new(DRAFTER),
        &|_| {},
        &CancelToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(pulled.downloaded_bytes, 0, "every blob was already there");
    assert_eq!(pulled.snapshot, found);
    assert!(hub
        .seen()
        .iter()
        .all(|s| s.method != "GET" || s.path.starts_with("/api/")));
}

#[test]
fn blocking_pull_works_without_a_runtime() {
    // The server runs on its own runtime thread; the caller has none.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let hub = runtime.block_on(start_hub());
    let dir = tempfile::tempdir().unwrap();
    let config = config(&hub, dir.path());
    let count = std::sync::atomic::AtomicUsize::new(0);
    let on_event = |_: &flashbar_hub::PullEvent| {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let plan = flashbar_hub::blocking::plan(&config, &PullRequest::new(DRAFTER)).unwrap();
    assert_eq!(plan.present_bytes, 0);
    assert_eq!(plan.commit, COMMIT);
    let pulled = flashbar_hub::blocking::pull(
        &config,
        &PullRequest::new(DRAFTER),
        &on_event,
        &CancelToken::new(),
    )
    .unwrap();
    assert_eq!(pulled.downloaded_bytes, plan.total_bytes);
    assert!(count.load(std::sync::atomic::Ordering::Relaxed) >= 4);
    // Inside a runtime it refuses instead of panicking.
    let inside = runtime.block_on(async {
        flashbar_hub::blocking::plan(&config, &PullRequest::new(DRAFTER)).unwrap_err()
    });
    assert!(
        inside.to_string().contains("inside an async runtime"),
        "{inside}"
    );
}
