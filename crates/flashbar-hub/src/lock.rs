//! One download of a blob at a time, across processes: an exclusive `flock`
//! on `.locks/<repo folder>/<blob>.lock` under the store, the file the Python
//! client locks (with the same kind of lock), so we also exclude it.

use crate::error::HubError;
use std::path::Path;

/// Held while a blob is written; released when dropped (the fd closes).
pub(crate) struct BlobLock {
    _file: std::fs::File,
}

/// Takes the lock, or says that another download holds it.
pub(crate) fn try_lock(path: &Path, file_name: &str) -> Result<BlobLock, HubError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(HubError::io(parent))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(HubError::io(path))?;
    if !lock_exclusive(&file).map_err(HubError::io(path))? {
        return Err(HubError::Busy {
            file: file_name.to_owned(),
            lock: path.to_owned(),
        });
    }
    Ok(BlobLock { _file: file })
}

#[cfg(unix)]
fn lock_exclusive(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor this function borrows.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    if error.kind() == std::io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(error)
    }
}

#[cfg(not(unix))]
fn lock_exclusive(_file: &std::fs::File) -> std::io::Result<bool> {
    // No cross-process lock here; the sha256 check still keeps blobs whole.
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = crate::store::lock_path(dir.path(), "models--a--b", "abc");
        let first = try_lock(&path, "f").unwrap();
        match try_lock(&path, "f") {
            Err(HubError::Busy { file, .. }) => assert_eq!(file, "f"),
            Err(other) => panic!("expected Busy, got {other}"),
            Ok(_) => panic!("expected Busy, got the lock"),
        }
        drop(first);
        assert!(try_lock(&path, "f").is_ok());
    }
}
