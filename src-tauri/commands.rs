//! The app's commands as the invoke handler registers them, read from
//! `src/lib.rs` (`tauri::generate_handler![...]`). Shared by `build.rs`,
//! which generates an `allow-*` permission for each (so each must then be
//! granted in `capabilities/`, or the webview is refused it), and by the
//! test that checks the grants.

/// Command names (the last path segment) in the handler, in order;
/// Err(one line) when the handler is not found.
pub fn registered(lib_rs: &str) -> Result<Vec<String>, String> {
    let start = lib_rs
        .find("generate_handler![")
        .ok_or("src/lib.rs has no tauri::generate_handler![...]")?
        + "generate_handler![".len();
    let end = lib_rs[start..]
        .find(']')
        .ok_or("tauri::generate_handler![ is not closed")?;
    Ok(lib_rs[start..start + end]
        .split(',')
        .map(|path| path.split("::").last().unwrap_or_default().trim())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect())
}
