//! What a repo revision holds, as the hub lists it: plain data, shared by
//! the store (which files are here), the remote (what the hub says) and the
//! downloads. A leaf: it imports nothing of this crate.

use serde::{Deserialize, Serialize};

/// A file of a repo revision as the hub describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteFile {
    /// Path inside the repo.
    pub path: String,
    pub size: u64,
    /// Present for LFS files (all weights); checked after download.
    pub sha256: Option<String>,
    /// The blob's name in the cache: the sha256 for LFS files, else the git blob id.
    pub etag: String,
}

/// A repo revision pinned to its commit.
#[derive(Clone, Debug)]
pub(crate) struct RemoteRepo {
    pub commit: String,
    pub files: Vec<RemoteFile>,
}
