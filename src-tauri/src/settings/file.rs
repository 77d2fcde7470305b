//! The settings file (`settings.json` in the app's data folder, as
//! `{"settings": {...}}`, the layout tauri-plugin-store wrote before), saved
//! with [`crate::atomic::write`] so that a crash or SIGKILL at any moment
//! leaves it readable, at worst without the last change. (The store plugin
//! truncated and rewrote it in place, which a kill can leave empty or
//! half-written.)

use super::Settings;
use std::fs;
use std::path::Path;

const KEY: &str = "settings";

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
    crate::atomic::write(path, &text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
