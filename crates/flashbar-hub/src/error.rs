//! Everything a pull or a store operation can fail with, each as one line a
//! user can act on.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{repo} (revision {revision}) was not found at {endpoint}")]
    RepoNotFound {
        repo: String,
        revision: String,
        endpoint: String,
    },
    #[error("{repo}: access denied at {endpoint} (HTTP {status}); a gated or private repo needs a token (HF_TOKEN)")]
    AccessDenied {
        repo: String,
        endpoint: String,
        status: u16,
    },
    #[error("{file} is not in {repo}")]
    FileNotFound { repo: String, file: String },
    #[error("not enough free disk space in {}: the download needs {needed} bytes, {free} are free", dir.display())]
    DiskFull {
        dir: PathBuf,
        needed: u64,
        free: u64,
    },
    #[error("{file}: the downloaded bytes do not match the hub's sha256 (expected {expected}, got {actual})")]
    Corrupt {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("{file}: {detail}")]
    SizeMismatch { file: String, detail: String },
    #[error("{file} is being downloaded by another process (lock {})", lock.display())]
    Busy { file: String, lock: PathBuf },
    #[error("download cancelled (partial files are kept; pull again to resume)")]
    Cancelled,
    /// A fault worth retrying: connection lost, timeout, 5xx, 429.
    #[error("{context}: {detail}")]
    Transient { context: String, detail: String },
    /// The server answered something the protocol does not allow.
    #[error("{context}: {detail}")]
    Protocol { context: String, detail: String },
    /// The disk filled up while the pull was writing: what was downloaded
    /// stays (the partial file resumes on the next pull), and the message
    /// says how much more room the rest needs.
    #[error("the disk holding {} is full: the rest of the download needs {needed} more bytes ({}), {free} are free; free some space and pull again to resume (the {kept} bytes downloaded so far are kept)", dir.display(), human_bytes(*needed))]
    DiskFilled {
        dir: PathBuf,
        needed: u64,
        free: u64,
        kept: u64,
    },
    /// Not marked `#[source]`: the message already ends with the OS error,
    /// and a printer that walks the source chain (anyhow's `{:#}`) would
    /// say it twice.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl HubError {
    /// Whether trying again (after a pause) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            HubError::Transient { .. } | HubError::Corrupt { .. } | HubError::SizeMismatch { .. }
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HubError {
        let path = path.into();
        move |error| HubError::Io { path, error }
    }

    /// Whether this is a write that failed because the disk (or the
    /// user's quota) is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(
            self,
            HubError::Io { error, .. } if is_disk_full(error)
        )
    }

    pub(crate) fn transient(context: impl Into<String>, detail: impl ToString) -> HubError {
        HubError::Transient {
            context: context.into(),
            detail: detail.to_string(),
        }
    }

    pub(crate) fn protocol(context: impl Into<String>, detail: impl ToString) -> HubError {
        HubError::Protocol {
            context: context.into(),
            detail: detail.to_string(),
        }
    }
}

pub(crate) fn is_disk_full(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// `14.0 MiB`: a size a person reads at a glance.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A reqwest failure as a retryable fault, without the URL's query noise.
pub(crate) fn from_reqwest(context: &str, error: reqwest::Error) -> HubError {
    let mut detail = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(inner) = source {
        detail.push_str(": ");
        detail.push_str(&inner.to_string());
        source = inner.source();
    }
    HubError::transient(context, detail)
}
