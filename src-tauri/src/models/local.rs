//! The models on this machine: every repo in the hub crate's store (the
//! standard HF cache, so models fetched by other tools show too), the disk
//! they take and what is left, and deleting one that is not in use.

use flashbar_hub::Store;
use serde::Serialize;
use std::path::Path;

/// The store as the UI shows it.
#[derive(Debug, Serialize, PartialEq, ts_rs::TS)]
pub struct LocalModels {
    /// The store's folder.
    pub store: String,
    /// Bytes every repo there takes, unfinished downloads included.
    #[ts(type = "number")]
    pub used_bytes: u64,
    /// Free space on its disk (None when it cannot be measured).
    #[ts(type = "number | null")]
    pub free_bytes: Option<u64>,
    pub repos: Vec<LocalModel>,
}

#[derive(Debug, Serialize, PartialEq, ts_rs::TS)]
pub struct LocalModel {
    pub repo: String,
    #[ts(type = "number")]
    pub size_bytes: u64,
    /// Bytes of an unfinished (resumable) download.
    #[ts(type = "number")]
    pub incomplete_bytes: u64,
    /// The newest complete snapshot's folder, if any.
    pub path: Option<String>,
}

/// Lists the store.
pub fn list(store: &Store) -> Result<LocalModels, String> {
    let repos = store.list().map_err(|e| e.to_string())?;
    let free_bytes =
        nearest_existing(store.root()).and_then(|dir| flashbar_hub::disk::free_bytes(&dir).ok());
    Ok(LocalModels {
        store: store.root().display().to_string(),
        used_bytes: repos.iter().map(|r| r.size_bytes).sum(),
        free_bytes,
        repos: repos
            .into_iter()
            .map(|r| LocalModel {
                path: r
                    .snapshots
                    .iter()
                    .find(|s| s.missing_files == 0 && s.files > 0)
                    .map(|s| s.path.display().to_string()),
                repo: r.repo,
                size_bytes: r.size_bytes,
                incomplete_bytes: r.incomplete_bytes,
            })
            .collect(),
    })
}

/// Deletes `repo` unless the loaded pair lives in it (`in_use`: the
/// engine's target and drafter folders). Returns the bytes freed.
pub fn delete(store: &Store, repo: &str, in_use: &[&str]) -> Result<u64, String> {
    if let Some(found) = store.get(repo).map_err(|e| e.to_string())? {
        if in_use
            .iter()
            .any(|dir| Path::new(dir).starts_with(&found.path))
        {
            return Err(format!(
                "{repo} is the model in use; choose another pair before deleting it"
            ));
        }
    }
    store.delete(repo).map_err(|e| e.to_string())
}

/// The store may not exist yet: its disk is the nearest folder's that does.
fn nearest_existing(dir: &Path) -> Option<std::path::PathBuf> {
    dir.ancestors().find(|d| d.is_dir()).map(Path::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repo in the HF cache layout with one snapshot file.
    fn put_repo(root: &Path, repo: &str, bytes: usize) -> std::path::PathBuf {
        let folder = root.join(format!("models--{}", repo.replace('/', "--")));
        let blob = folder.join("blobs").join("abc123");
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::write(&blob, vec![0u8; bytes]).unwrap();
        let snapshot = folder.join("snapshots").join("0".repeat(40));
        std::fs::create_dir_all(&snapshot).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join("config.json")).unwrap();
        snapshot
    }

    #[test]
    fn lists_sizes_and_refuses_to_delete_the_model_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let in_use = put_repo(dir.path(), "me/used", 10);
        put_repo(dir.path(), "me/spare", 32);
        let listed = list(&store).unwrap();
        assert_eq!(listed.used_bytes, 42);
        assert!(listed.free_bytes.unwrap() > 0);
        assert_eq!(listed.repos.len(), 2);
        assert_eq!(listed.repos[0].repo, "me/spare");
        assert!(listed.repos[0].path.is_some());
        let used = in_use.display().to_string();
        let error = delete(&store, "me/used", &[&used]).unwrap_err();
        assert!(error.contains("in use"), "{error}");
        assert_eq!(delete(&store, "me/spare", &[&used]).unwrap(), 32);
        assert_eq!(list(&store).unwrap().repos.len(), 1);
        let gone = delete(&store, "me/spare", &[]).unwrap_err();
        assert!(gone.contains("not in the store"), "{gone}");
    }

    #[test]
    fn a_missing_store_is_empty() {
        let listed = list(&Store::new("/nonexistent/flashbar/store")).unwrap();
        assert!(listed.repos.is_empty());
        assert_eq!(listed.used_bytes, 0);
    }
}
