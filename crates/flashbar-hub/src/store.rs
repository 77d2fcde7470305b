//! The local store: the standard Hugging Face cache layout
//! (`models--owner--name/{blobs,snapshots/<commit>,refs/<revision>}`), so a
//! model fetched by `huggingface-cli`, mlx-lm or any other HF client is found,
//! and ours are found by them. List, disk usage, delete. This file owns the
//! whole layout (where the store is, which repo ids name a folder, blobs,
//! snapshots, refs, a blob's partial file and its lock) and is the crate's
//! bottom layer: it imports only the error type and the listing's plain
//! data (`files.rs`).

use crate::error::HubError;
use crate::files::RemoteFile;
use hf_hub::{Cache, Repo, RepoType};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// A store root (an HF hub cache folder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    root: PathBuf,
}

/// A repo found in the store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalRepo {
    pub repo: String,
    pub path: PathBuf,
    /// Bytes on disk, partial downloads included.
    pub size_bytes: u64,
    /// Bytes of unfinished downloads (`*.incomplete`).
    pub incomplete_bytes: u64,
    pub snapshots: Vec<LocalSnapshot>,
}

/// One commit's folder in the store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalSnapshot {
    pub commit: String,
    pub path: PathBuf,
    /// Branches or tags that point here (`refs/`).
    pub refs: Vec<String>,
    pub files: usize,
    /// Files whose link leads nowhere (a blob was deleted or never finished).
    pub missing_files: usize,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Store { root: root.into() }
    }

    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub fn from_env() -> Self {
        Store::new(default_store_root())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn repo_layout(&self, repo: &str) -> RepoLayout {
        let repo = Repo::model(repo.to_owned());
        RepoLayout {
            root: self.root.join(repo.folder_name()),
            cache: Cache::new(self.root.clone()),
            repo_id: repo_id_of(&repo),
        }
    }

    /// Every model repo in the store, by name.
    pub fn list(&self) -> Result<Vec<LocalRepo>, HubError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(HubError::io(&self.root)(e)),
        };
        let mut repos = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(repo) = repo_id_from_folder(&name) else {
                continue;
            };
            if entry.path().is_dir() {
                repos.push(self.describe(&repo)?);
            }
        }
        repos.sort_by(|a, b| a.repo.cmp(&b.repo));
        Ok(repos)
    }

    /// One repo, if present.
    pub fn get(&self, repo: &str) -> Result<Option<LocalRepo>, HubError> {
        validate_repo_id(repo)?;
        let layout = self.repo_layout(repo);
        if !layout.root.is_dir() {
            return Ok(None);
        }
        self.describe(repo).map(Some)
    }

    /// The snapshot folder for a revision (branch, tag or commit), if present.
    pub fn snapshot_dir(&self, repo: &str, revision: &str) -> Option<PathBuf> {
        validate_repo_id(repo).ok()?;
        let layout = self.repo_layout(repo);
        let commit = std::fs::read_to_string(layout.root.join("refs").join(revision))
            .map(|c| c.trim().to_owned())
            .unwrap_or_else(|_| revision.to_owned());
        if commit.is_empty() || commit.contains(['/', '\\']) || commit.starts_with('.') {
            return None;
        }
        let dir = layout.snapshot(&commit);
        dir.is_dir().then_some(dir)
    }

    /// Bytes a repo takes on disk (0 when absent).
    pub fn disk_usage(&self, repo: &str) -> Result<u64, HubError> {
        Ok(self.get(repo)?.map_or(0, |r| r.size_bytes))
    }

    /// Removes a repo and everything it holds; returns the bytes freed.
    pub fn delete(&self, repo: &str) -> Result<u64, HubError> {
        validate_repo_id(repo)?;
        let Some(found) = self.get(repo)? else {
            return Err(HubError::Invalid(format!(
                "{repo} is not in the store at {}",
                self.root.display()
            )));
        };
        std::fs::remove_dir_all(&found.path).map_err(HubError::io(&found.path))?;
        if let Some(folder) = found.path.file_name() {
            // Its lock files are empty; a failure to remove them is harmless.
            let _ = std::fs::remove_dir_all(self.root.join(".locks").join(folder));
        }
        Ok(found.size_bytes)
    }

    fn describe(&self, repo: &str) -> Result<LocalRepo, HubError> {
        let layout = self.repo_layout(repo);
        let (size_bytes, incomplete_bytes) = usage(&layout.root);
        let refs = read_refs(&layout.root.join("refs"));
        let mut snapshots = Vec::new();
        if let Ok(entries) = std::fs::read_dir(layout.root.join("snapshots")) {
            for entry in entries.flatten() {
                let commit = entry.file_name().to_string_lossy().into_owned();
                let (files, missing_files) = count_files(&entry.path());
                snapshots.push(LocalSnapshot {
                    refs: refs
                        .iter()
                        .filter(|(_, c)| *c == commit)
                        .map(|(r, _)| r.clone())
                        .collect(),
                    commit,
                    path: entry.path(),
                    files,
                    missing_files,
                });
            }
        }
        snapshots.sort_by(|a, b| {
            b.refs
                .len()
                .cmp(&a.refs.len())
                .then(a.commit.cmp(&b.commit))
        });
        Ok(LocalRepo {
            repo: layout.repo_id.clone(),
            path: layout.root.clone(),
            size_bytes,
            incomplete_bytes,
            snapshots,
        })
    }
}

/// One repo's folders, through hf-hub's naming of them.
pub(crate) struct RepoLayout {
    root: PathBuf,
    cache: Cache,
    repo_id: String,
}

impl RepoLayout {
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cross-process lock file of a blob (`<store>/.locks/<folder>/`).
    pub fn lock_path(&self, etag: &str) -> PathBuf {
        let store_root = self.root.parent().unwrap_or(Path::new("."));
        let folder = self.root.file_name().unwrap_or_default().to_string_lossy();
        lock_path(store_root, &folder, etag)
    }

    fn cache_repo(&self, revision: &str) -> hf_hub::CacheRepo {
        self.cache.repo(Repo::with_revision(
            self.repo_id.clone(),
            RepoType::Model,
            revision.to_owned(),
        ))
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.cache_repo("main").blob_path(etag)
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.cache_repo("main").pointer_path(commit)
    }

    pub fn create_dirs(&self) -> io::Result<()> {
        std::fs::create_dir_all(self.root.join("blobs"))?;
        std::fs::create_dir_all(self.root.join("snapshots"))
    }

    /// Whether the file's blob is in place with its full size.
    pub async fn is_complete(&self, file: &RemoteFile) -> bool {
        tokio::fs::metadata(self.blob(&file.etag))
            .await
            .is_ok_and(|m| m.is_file() && m.len() == file.size)
    }

    /// Bytes of the file already on disk, whole or partial.
    pub async fn bytes_present(&self, file: &RemoteFile) -> u64 {
        if self.is_complete(file).await {
            return file.size;
        }
        let partial = partial_path(&self.blob(&file.etag));
        tokio::fs::metadata(partial)
            .await
            .map_or(0, |m| m.len().min(file.size))
    }

    /// Points `snapshots/<commit>/<path>` at the file's blob.
    pub fn link(&self, commit: &str, file: &RemoteFile) -> io::Result<()> {
        let pointer = self.snapshot(commit).join(&file.path);
        let parent = pointer.parent().expect("a snapshot path has a parent");
        std::fs::create_dir_all(parent)?;
        let depth = Path::new(&file.path).components().count();
        // From snapshots/<commit>/<dirs..>/ up to the repo folder.
        let mut target = PathBuf::new();
        for _ in 0..depth + 1 {
            target.push("..");
        }
        target.push("blobs");
        target.push(&file.etag);
        if std::fs::symlink_metadata(&pointer).is_ok() {
            std::fs::remove_file(&pointer)?;
        }
        make_link(&target, &self.blob(&file.etag), &pointer)
    }

    pub fn set_ref(&self, revision: &str, commit: &str) -> io::Result<()> {
        self.cache_repo(revision).create_ref(commit)
    }
}

#[cfg(unix)]
fn make_link(relative: &Path, _blob: &Path, pointer: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(relative, pointer)
}

#[cfg(not(unix))]
fn make_link(_relative: &Path, blob: &Path, pointer: &Path) -> io::Result<()> {
    // Symlinks need privileges on Windows: keep a copy, as the Python client does.
    std::fs::copy(blob, pointer).map(|_| ())
}

fn repo_id_of(repo: &Repo) -> String {
    repo_id_from_folder(&repo.folder_name()).unwrap_or_default()
}

/// `models--owner--name` -> `owner/name`.
fn repo_id_from_folder(folder: &str) -> Option<String> {
    let rest = folder.strip_prefix("models--")?;
    let (owner, name) = rest.split_once("--")?;
    Some(format!("{owner}/{name}"))
}

/// (all bytes, bytes of partial downloads) of the files under `blobs/` and
/// `snapshots/` (as the Python client counts); links are not followed, so a
/// blob counts once.
fn usage(dir: &Path) -> (u64, u64) {
    let mut total = 0;
    let mut partial = 0;
    let mut stack = vec![dir.join("blobs"), dir.join("snapshots")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
                if entry.file_name().to_string_lossy().ends_with(".incomplete") {
                    partial += meta.len();
                }
            }
        }
    }
    (total, partial)
}

/// (files, files whose link is dangling) under a snapshot folder.
fn count_files(dir: &Path) -> (usize, usize) {
    let mut files = 0;
    let mut missing = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_link_or_file = std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir());
            if is_link_or_file {
                files += 1;
                if !path.is_file() {
                    missing += 1;
                }
            } else {
                stack.push(path);
            }
        }
    }
    (files, missing)
}

/// (revision, commit) pairs under `refs/` (branch names may hold `/`).
fn read_refs(refs: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut stack = vec![refs.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let (Ok(name), Ok(commit)) =
                (path.strip_prefix(refs), std::fs::read_to_string(&path))
            {
                found.push((
                    name.to_string_lossy().replace('\\', "/"),
                    commit.trim().to_owned(),
                ));
            }
        }
    }
    found.sort();
    found
}

// The layout's names and places, in one file: where the store is
// (`HF_HUB_CACHE`, else `$HF_HOME/hub`), which repo ids name a folder,
// a blob's partial file and its lock.

pub(crate) fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `HF_HOME`, else `~/.cache/huggingface`.
pub(crate) fn hf_home() -> PathBuf {
    match env_nonempty("HF_HOME") {
        Some(home) => PathBuf::from(home),
        None => home_dir().join(".cache").join("huggingface"),
    }
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `HF_HUB_CACHE`, else `$HF_HOME/hub`.
pub(crate) fn default_store_root() -> PathBuf {
    match env_nonempty("HF_HUB_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => hf_home().join("hub"),
    }
}

/// `owner/name` with the characters the hub allows.
pub(crate) fn validate_repo_id(repo: &str) -> Result<(), HubError> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match repo.split_once('/') {
        Some((owner, name)) if ok_part(owner) && ok_part(name) => Ok(()),
        _ => Err(HubError::Invalid(format!(
            "{repo:?} is not a hub repo id (expected owner/name)"
        ))),
    }
}

/// The partial file beside a blob (the Python client's name for it).
pub(crate) fn partial_path(blob: &Path) -> PathBuf {
    let mut name = blob.as_os_str().to_owned();
    name.push(".incomplete");
    PathBuf::from(name)
}

/// Where the lock of a blob lives.
pub(crate) fn lock_path(store_root: &Path, repo_folder: &str, etag: &str) -> PathBuf {
    store_root
        .join(".locks")
        .join(repo_folder)
        .join(format!("{etag}.lock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_sits_beside_the_blob() {
        let p = partial_path(Path::new("/s/blobs/abc"));
        assert_eq!(p, Path::new("/s/blobs/abc.incomplete"));
    }

    #[test]
    fn repo_ids() {
        assert!(validate_repo_id("mlx-community/Qwen3.5-9B-4bit").is_ok());
        for bad in ["", "noslash", "a/b/c", "../x", "a/..", "a b/c"] {
            assert!(validate_repo_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn folder_names_round_trip() {
        assert_eq!(
            repo_id_from_folder("models--mlx-community--Qwen3.5-9B-4bit").as_deref(),
            Some("mlx-community/Qwen3.5-9B-4bit")
        );
        assert_eq!(repo_id_from_folder("datasets--a--b"), None);
        let store = Store::new("/s");
        assert_eq!(
            store.repo_layout("z-lab/Qwen3.5-9B-DFlash").root(),
            Path::new("/s/models--z-lab--Qwen3.5-9B-DFlash")
        );
    }
}
