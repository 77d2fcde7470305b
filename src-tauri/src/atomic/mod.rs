//! The app's own state files (`settings.json`, `conversations.json` in the
//! app's data folder), written so that a crash or SIGKILL at any moment
//! leaves them readable: the new text goes to a temp file in the same
//! folder, is fsynced, then renamed over the old file (and the folder
//! fsynced, so the rename itself survives a power cut). A reader sees the
//! old text or the new one, never a mix; at worst the last change is lost.
//! A full disk fails the write before the rename, so the old file stays
//! whole; the temp file is removed (it would hold the space the user must
//! free) and the error says how much room the save needs
//! (docs/reliability.md, "Disk full").

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use tauri::{AppHandle, Manager};

/// One write at a time in this process, so two saves never share a temp
/// file (the app is single-instance: no other process writes these files).
static WRITING: Mutex<()> = Mutex::new(());

/// Replaces `path` with `bytes` atomically (creating its folder if needed).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // One fixed temp name per file: a killed write leaves at most one
    // behind, which the next write truncates.
    let temp = dir.join(format!(".{name}.tmp"));
    let written = write_temp(&temp, bytes);
    if let Err(error) = written {
        let _ = fs::remove_file(&temp);
        return Err(explain(error, dir, bytes.len()));
    }
    fs::rename(&temp, path)?;
    File::open(dir)?.sync_all()
}

fn write_temp(temp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = File::create(temp)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// A full disk said in words, with the room the save needs; other errors
/// as they are.
fn explain(error: std::io::Error, dir: &Path, needed: usize) -> std::io::Error {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    if !matches!(error.kind(), StorageFull | QuotaExceeded) {
        return error;
    }
    let free = flashbar_hub::disk::free_bytes(dir)
        .map_or_else(|_| "an unknown number of".to_owned(), |f| f.to_string());
    std::io::Error::new(
        error.kind(),
        format!(
            "the disk is full: saving needs {needed} bytes and {free} are free; \
             the previous version is kept"
        ),
    )
}

/// Moves an unreadable state file out of the way as `<name>.bad-<unix
/// time>[-k]` beside it, so starting afresh never overwrites what the user
/// had; returns the new name.
pub fn keep_aside(path: &Path) -> std::io::Result<PathBuf> {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let aside = (1..)
        .map(|k| match k {
            1 => path.with_file_name(format!("{name}.bad-{seconds}")),
            k => path.with_file_name(format!("{name}.bad-{seconds}-{k}")),
        })
        .find(|aside| !aside.exists())
        .unwrap_or_default();
    fs::rename(path, &aside)?;
    Ok(aside)
}

/// `name` in the app's data folder.
pub fn app_data_file(app: &AppHandle, name: &str) -> Result<PathBuf, String> {
    let dir = app
        .path()
        .app_data_dir()
        .map_err(|e| format!("no app data folder: {e}"))?;
    Ok(dir.join(name))
}

#[cfg(test)]
mod disk_full_tests;
#[cfg(test)]
pub mod kill_test;
