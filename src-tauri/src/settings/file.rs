//! The settings file (`settings.json` in the app's data folder, as
//! `{"settings": {...}}`, the layout tauri-plugin-store wrote before), saved
//! so that a crash or SIGKILL at any moment leaves it readable: the new text
//! goes to a temp file in the same folder, is fsynced, then renamed over the
//! old one (and the folder fsynced). At worst the last change is lost. The
//! store plugin truncates and rewrites in place, which a kill can leave
//! empty or half-written.

use super::Settings;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

const KEY: &str = "settings";

/// One write at a time in this process: two saves must not share the temp
/// file (the app is single-instance, so no other process writes it).
static WRITING: Mutex<()> = Mutex::new(());

/// Replaces `path` with `bytes` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // One fixed temp name: a killed write leaves at most one behind, which
    // the next write truncates.
    let temp = dir.join(format!(".{name}.tmp"));
    let mut file = File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temp, path)?;
    File::open(dir)?.sync_all()
}

/// The saved settings; `Ok(None)` when there are none yet.
pub fn read(path: &Path) -> Result<Option<Settings>, String> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    match value.get_mut(KEY).map(serde_json::Value::take) {
        Some(settings) => serde_json::from_value(settings)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        None => Ok(None),
    }
}

/// Saves `settings` to `path` crash-safely.
pub fn write(path: &Path, settings: &Settings) -> Result<(), String> {
    let text = serde_json::to_vec_pretty(&serde_json::json!({ KEY: settings }))
        .map_err(|e| e.to_string())?;
    write_atomic(path, &text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
