//! The fixture repo served by the fake hub, a pull configuration against it,
//! and checks on what lands in the store.

// Each test binary uses a different part of it.
#![allow(dead_code)]

use super::fake_hub::{repo_from_dir, FakeHub, FakeRepo};
use flashbar_hub::config::RetryPolicy;
use flashbar_hub::{
    pull, CancelToken, HubConfig, HubError, PullEvent, PullRequest, PulledRepo, Store,
};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const REPO: &str = "flashbar-test/tiny-target";
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
pub const WEIGHTS: &str = "model.safetensors";

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target")
}

pub fn fixture_repo() -> FakeRepo {
    repo_from_dir(&fixture_dir(), COMMIT)
}

pub async fn start_hub() -> FakeHub {
    FakeHub::start(HashMap::from([(REPO.to_owned(), fixture_repo())])).await
}

pub fn config(hub: &FakeHub, store: &Path, retries: u32) -> HubConfig {
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

/// A pull of the fixture's weights file alone.
pub fn weights_request() -> PullRequest {
    PullRequest {
        files: vec![WEIGHTS.to_owned()],
        ..PullRequest::new(REPO)
    }
}

/// Pulls `request` from the fake hub into `store`, with `retries` retries
/// and nothing cancelling it.
pub async fn pull_from(
    hub: &FakeHub,
    store: &Path,
    retries: u32,
    request: &PullRequest,
    on_event: &(dyn Fn(&PullEvent) + Send + Sync),
) -> Result<PulledRepo, HubError> {
    let cancel = CancelToken::new();
    pull(&config(hub, store, retries), request, on_event, &cancel).await
}

/// Collects events for assertions.
#[derive(Default, Clone)]
pub struct Events(Arc<Mutex<Vec<PullEvent>>>);

impl Events {
    pub fn sink(&self) -> impl Fn(&PullEvent) + Send + Sync + 'static {
        let events = self.0.clone();
        move |e: &PullEvent| events.lock().unwrap().push(e.clone())
    }
    pub fn all(&self) -> Vec<PullEvent> {
        self.0.lock().unwrap().clone()
    }
}

pub fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// Every fixture file is in the snapshot with the same bytes.
pub fn assert_snapshot_matches(snapshot: &Path) {
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

pub fn weights_sha() -> String {
    sha256_file(&fixture_dir().join(WEIGHTS))
}

pub fn blob_dir(store: &Path) -> PathBuf {
    store
        .join("models--flashbar-test--tiny-target")
        .join("blobs")
}
