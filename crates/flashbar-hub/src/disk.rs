//! Free space on the disk that holds the store, checked before a pull starts.

use crate::error::HubError;
use std::path::{Path, PathBuf};

/// Fails with [`HubError::DiskFull`] unless `needed` bytes fit under `dir`.
/// `assume_free` replaces the measured free space (a simulated limit).
pub fn ensure_free(dir: &Path, needed: u64, assume_free: Option<u64>) -> Result<(), HubError> {
    if needed == 0 {
        return Ok(());
    }
    let probe = existing_ancestor(dir);
    let free = match assume_free {
        Some(free) => free,
        None => free_bytes(&probe).map_err(HubError::io(&probe))?,
    };
    if needed > free {
        return Err(HubError::DiskFull {
            dir: dir.to_owned(),
            needed,
            free,
        });
    }
    Ok(())
}

/// The store may not exist yet: measure the nearest folder that does.
pub(crate) fn existing_ancestor(dir: &Path) -> PathBuf {
    let mut probe = dir.to_owned();
    while !probe.exists() {
        match probe.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => probe = parent.to_owned(),
            _ => return PathBuf::from("."),
        }
    }
    probe
}

/// Bytes an unprivileged user may still write on the disk holding `path`.
#[cfg(unix)]
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a valid C string and stats a writable statvfs.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let stats = unsafe { stats.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok(stats.f_bavail as u64 * stats.f_frsize as u64)
}

#[cfg(not(unix))]
pub fn free_bytes(_path: &Path) -> std::io::Result<u64> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "free disk space is only measured on Unix",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_real_disk() {
        let free = free_bytes(Path::new("/")).unwrap();
        assert!(free > 0);
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let dir = Path::new("/nonexistent/store/root");
        assert!(ensure_free(dir, 10, Some(10)).is_ok());
        match ensure_free(dir, 11, Some(10)) {
            Err(HubError::DiskFull { needed, free, .. }) => assert_eq!((needed, free), (11, 10)),
            other => panic!("expected DiskFull, got {other:?}"),
        }
    }
}
