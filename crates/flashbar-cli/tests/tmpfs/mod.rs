//! A real full disk: a tmpfs of a given size, mounted by the test itself
//! (as root: CI runs as root) and unmounted when dropped. Where mounting is
//! refused (not root, no CAP_SYS_ADMIN, not Linux) the test says why and
//! is skipped (docs/reliability.md, "Disk full").

// Each test binary uses a different part of it.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// A tmpfs of `bytes` (rounded up to pages by the kernel), or why not.
    pub fn mount(bytes: u64) -> Result<Tmpfs, String> {
        if !cfg!(target_os = "linux") {
            return Err("tmpfs mounts are Linux's".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("flashbar-test")
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs was refused (needs root / CAP_SYS_ADMIN): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file that takes every byte left, as another program
    /// filling the disk would; returns its path (delete it to free them).
    pub fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0xa5u8; 64 * 1024];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        drop(file);
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy, so a file a child process still holds does not keep it.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Skips the calling test, saying why, when the tmpfs cannot be mounted.
#[macro_export]
macro_rules! tmpfs_or_skip {
    ($bytes:expr) => {
        match tmpfs::Tmpfs::mount($bytes) {
            Ok(fs) => fs,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        }
    };
}
