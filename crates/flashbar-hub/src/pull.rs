//! A pull: list a repo revision, check the disk, fetch each missing file with
//! retries, and publish the snapshot in the standard HF cache layout.

use crate::config::HubConfig;
use crate::disk;
use crate::download::Fetch;
use crate::error::HubError;
use crate::files::{RemoteFile, RemoteRepo};
use crate::lock;
use crate::progress::{EventSink, PullEvent, Tracker};
use crate::remote::Remote;
use crate::retry::{backoff, pause};
use crate::store::validate_repo_id;
use crate::store::RepoLayout;
use crate::CancelToken;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::path::PathBuf;

/// What to fetch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PullRequest {
    /// `owner/name` on the hub.
    pub repo: String,
    /// Branch, tag or commit; `main` when empty.
    pub revision: String,
    /// Glob patterns (`*` and `?`) of the files to fetch; all when empty.
    pub files: Vec<String>,
}

impl PullRequest {
    pub fn new(repo: impl Into<String>) -> Self {
        PullRequest {
            repo: repo.into(),
            revision: "main".to_owned(),
            files: Vec::new(),
        }
    }
}

/// A finished pull.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PulledRepo {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    /// The snapshot folder: a model folder the loader can open.
    pub snapshot: PathBuf,
    pub files: Vec<RemoteFile>,
    /// Bytes fetched by this pull (less than the total when resumed or cached).
    pub downloaded_bytes: u64,
}

/// What a pull would fetch: the commit, the files with sizes and hashes,
/// and how much of it is already on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PullPlan {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<RemoteFile>,
    pub total_bytes: u64,
    /// Bytes already in the store, whole files and resumable partials.
    pub present_bytes: u64,
}

/// Asks the hub what a pull would fetch, downloading nothing.
pub async fn plan(config: &HubConfig, request: &PullRequest) -> Result<PullPlan, HubError> {
    let remote = Remote::new(config)?;
    make_plan(config, &remote, request, &|_| {}, &CancelToken::new()).await
}

async fn make_plan(
    config: &HubConfig,
    remote: &Remote,
    request: &PullRequest,
    on_event: EventSink<'_>,
    cancel: &CancelToken,
) -> Result<PullPlan, HubError> {
    validate_repo_id(&request.repo)?;
    let revision = match request.revision.trim() {
        "" => "main",
        r => r,
    };
    let wanted =
        |path: &str| request.files.is_empty() || request.files.iter().any(|p| glob_match(p, path));
    let listed: RemoteRepo = with_retries(config, cancel, on_event, || {
        remote.list(&request.repo, revision, wanted)
    })
    .await?;
    let files = listed.files;
    if files.is_empty() {
        return Err(HubError::Invalid(format!(
            "{}@{revision} has no files matching {:?}",
            request.repo, request.files
        )));
    }
    let layout = config.store.repo_layout(&request.repo);
    let mut present_bytes = 0u64;
    for file in &files {
        present_bytes += layout.bytes_present(file).await;
    }
    Ok(PullPlan {
        repo: request.repo.clone(),
        revision: revision.to_owned(),
        commit: listed.commit,
        total_bytes: files.iter().map(|f| f.size).sum(),
        files,
        present_bytes,
    })
}

/// Fetches a repo revision into the store; see the crate docs.
pub async fn pull(
    config: &HubConfig,
    request: &PullRequest,
    on_event: EventSink<'_>,
    cancel: &CancelToken,
) -> Result<PulledRepo, HubError> {
    let remote = Remote::new(config)?;
    let plan = make_plan(config, &remote, request, on_event, cancel).await?;
    let layout = config.store.repo_layout(&request.repo);
    let needed = plan.total_bytes - plan.present_bytes;
    disk::ensure_free(config.store.root(), needed, config.assume_free_bytes)?;
    let mut tracker = Tracker::new(on_event, plan.total_bytes, plan.present_bytes);
    tracker.emit(PullEvent::Resolved {
        repo: plan.repo.clone(),
        revision: plan.revision.clone(),
        commit: plan.commit.clone(),
        files: plan.files.len(),
        total_bytes: plan.total_bytes,
        to_download_bytes: needed,
    });
    let fetched = fetch_all(config, &remote, &plan, &layout, cancel, &mut tracker).await;
    if let Err(error) = fetched {
        return Err(if error.is_disk_full() {
            disk_filled(config, &plan, &layout).await
        } else {
            error
        });
    }
    if plan.revision != plan.commit {
        layout
            .set_ref(&plan.revision, &plan.commit)
            .map_err(HubError::io(layout.root()))?;
    }
    let snapshot = layout.snapshot(&plan.commit);
    tracker.emit(PullEvent::Done {
        snapshot: snapshot.clone(),
    });
    Ok(PulledRepo {
        repo: plan.repo,
        revision: plan.revision,
        commit: plan.commit,
        snapshot,
        files: plan.files,
        downloaded_bytes: needed,
    })
}

/// Fetches every file of the plan that is not complete yet, and links it
/// into the snapshot.
async fn fetch_all(
    config: &HubConfig,
    remote: &Remote,
    plan: &PullPlan,
    layout: &RepoLayout,
    cancel: &CancelToken,
    tracker: &mut Tracker<'_>,
) -> Result<(), HubError> {
    layout.create_dirs().map_err(HubError::io(layout.root()))?;
    for file in &plan.files {
        let blob = layout.blob(&file.etag);
        if !layout.is_complete(file).await {
            let _lock = lock::try_lock(&layout.lock_path(&file.etag), &file.path)?;
            // Another process may have finished it while we waited for nothing.
            if !layout.is_complete(file).await {
                let url = remote.file_url(&plan.repo, &plan.commit, &file.path);
                fetch_with_retries(config, remote, &url, file, &blob, cancel, tracker).await?;
            }
        }
        layout
            .link(&plan.commit, file)
            .map_err(HubError::io(layout.root()))?;
    }
    Ok(())
}

/// The disk filled up mid-pull (another program wrote to it, or the free
/// space measured before the start was not really there): how much the rest
/// needs, measured now, so the user knows what to free. The partial file
/// stays, so the next pull resumes it (docs/reliability.md).
async fn disk_filled(config: &HubConfig, plan: &PullPlan, layout: &RepoLayout) -> HubError {
    let mut kept = 0u64;
    for file in &plan.files {
        kept += layout.bytes_present(file).await;
    }
    let root = config.store.root();
    HubError::DiskFilled {
        dir: root.to_owned(),
        needed: plan.total_bytes.saturating_sub(kept),
        free: disk::free_bytes(&disk::existing_ancestor(root)).unwrap_or(0),
        kept,
    }
}

async fn fetch_with_retries(
    config: &HubConfig,
    remote: &Remote,
    url: &str,
    file: &RemoteFile,
    blob: &std::path::Path,
    cancel: &CancelToken,
    tracker: &mut Tracker<'_>,
) -> Result<(), HubError> {
    let fetch = Fetch {
        client: remote.client(),
        url,
        file,
        blob,
        cancel,
        stall_timeout: config.stall_timeout,
    };
    let mut attempt = 0;
    loop {
        match fetch.run(tracker).await {
            Ok(()) => return Ok(()),
            Err(error) if error.is_retryable() && attempt < config.retry.max_retries => {
                attempt += 1;
                let wait = backoff(&config.retry, attempt);
                tracker.emit(PullEvent::Retrying {
                    file: file.path.clone(),
                    attempt,
                    wait_ms: wait.as_millis() as u64,
                    reason: error.to_string(),
                });
                pause(wait, cancel).await?;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Runs a request again after transient faults, with backoff.
async fn with_retries<T, F, Fut>(
    config: &HubConfig,
    cancel: &CancelToken,
    on_event: EventSink<'_>,
    mut attempt_once: F,
) -> Result<T, HubError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, HubError>>,
{
    let mut attempt = 0;
    loop {
        // Each request inside carries its own timeout.
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return Err(HubError::Cancelled),
            outcome = attempt_once() => outcome,
        };
        match outcome {
            Err(HubError::Transient { context, detail }) if attempt < config.retry.max_retries => {
                attempt += 1;
                let wait = backoff(&config.retry, attempt);
                let event = PullEvent::Retrying {
                    file: String::new(),
                    attempt,
                    wait_ms: wait.as_millis() as u64,
                    reason: format!("{context}: {detail}"),
                };
                event.log();
                on_event(&event);
                pause(wait, cancel).await?;
            }
            other => return other,
        }
    }
}

/// Shell-style match of `*` (any run, `/` included) and `?` (one character).
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn the_pull_future_can_be_spawned() {
        // A GUI spawns pulls on a multi-threaded runtime: the future must be Send.
        let config = HubConfig::from_env();
        let request = PullRequest::new("a/b");
        let cancel = CancelToken::new();
        let future = pull(&config, &request, &|_| {}, &cancel);
        assert_send(&future);
        let planned = plan(&config, &request);
        assert_send(&planned);
    }

    #[test]
    fn globs() {
        assert!(glob_match(
            "*.safetensors",
            "model-00001-of-00002.safetensors"
        ));
        assert!(glob_match("*.json", "config.json"));
        assert!(!glob_match("*.json", "model.safetensors"));
        assert!(glob_match("tok?nizer.json", "tokenizer.json"));
        assert!(glob_match("*", "a/b"));
        assert!(!glob_match("config.json", "config.json.bak"));
    }
}
