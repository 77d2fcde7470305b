//! Conversation history, kept in `conversations.json` in the app's data
//! folder (not the webview's localStorage, which a kill can leave
//! half-written or lose): the UI holds the conversations and sends the whole
//! JSON array on each change; it is checked and written with
//! [`crate::atomic::write`], so a crash or SIGKILL at any moment leaves the
//! last saved array, at worst without the last change. The UI waits for
//! each save before sending the next, so saves land in order.

use serde::de::IgnoredAny;
use std::fs;
use std::path::Path;
use tauri::AppHandle;

const FILE_NAME: &str = "conversations.json";

/// The most a saved history may weigh.
pub const MAX_BYTES: usize = 64 << 20;

/// The saved history as JSON text (`[]` when there is none). A file that is
/// not a JSON array is kept aside as `conversations.json.bad-<unix time>`
/// (with a warning) rather than lost, and the history starts empty.
pub fn load(path: &Path) -> Result<String, String> {
    let problem = match fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => match check(&text) {
                Ok(()) => return Ok(text),
                Err(e) => e,
            },
            Err(e) => e.to_string(),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok("[]".to_owned()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let aside = crate::atomic::keep_aside(path).map_err(|e| {
        format!(
            "{} is unreadable ({problem}) and cannot be moved aside: {e}",
            path.display()
        )
    })?;
    tracing::warn!(
        "{} is unreadable ({problem}); kept as {}, starting an empty history",
        path.display(),
        aside.display()
    );
    Ok("[]".to_owned())
}

/// Saves `json` (a JSON array, at most [`MAX_BYTES`]) to `path` crash-safely.
pub fn save(path: &Path, json: &str) -> Result<(), String> {
    if json.len() > MAX_BYTES {
        return Err(format!(
            "the conversation history is {} MiB, over the {} MiB limit: delete some conversations",
            json.len() >> 20,
            MAX_BYTES >> 20
        ));
    }
    check(json).map_err(|e| format!("not saved: {e}"))?;
    crate::atomic::write(path, json.as_bytes())
        .map_err(|e| format!("cannot save the history to {}: {e}", path.display()))
}

/// Ok when `text` is one JSON array (checked without building it).
fn check(text: &str) -> Result<(), String> {
    serde_json::from_str::<Vec<IgnoredAny>>(text)
        .map(drop)
        .map_err(|e| format!("the history is not a JSON array: {e}"))
}

/// The saved conversations, as the JSON text the UI wrote.
#[tauri::command]
pub async fn history_load(app: AppHandle) -> Result<String, String> {
    let path = crate::atomic::app_data_file(&app, FILE_NAME)?;
    blocking(move || load(&path)).await
}

/// Replaces the saved conversations with `json` (a JSON array).
#[tauri::command]
pub async fn history_save(app: AppHandle, json: String) -> Result<(), String> {
    let path = crate::atomic::app_data_file(&app, FILE_NAME)?;
    blocking(move || save(&path, &json)).await
}

/// File work off the async runtime's threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tauri::async_runtime::spawn_blocking(work)
        .await
        .map_err(|e| format!("the history writer stopped: {e}"))?
}

#[cfg(test)]
mod tests;
