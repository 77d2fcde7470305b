//! The main window: shown and focused on demand, told which view to open
//! (`navigate` event). Closing it hides it while a tray icon can bring it
//! back; without a tray, closing it quits. On macOS it starts hidden
//! (`tauri.macos.conf.json`) and drops down under the menu-bar icon when
//! that is clicked; elsewhere it opens at launch.

use serde::Serialize;
use tauri::{AppHandle, Emitter, Manager};

pub const MAIN: &str = "main";

/// The views the tray can open.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum View {
    Chat,
    Models,
    Metrics,
}

/// Shows the window (and the given view).
pub fn show(app: &AppHandle, view: Option<View>) {
    if let Some(window) = app.get_webview_window(MAIN) {
        let _ = window.unminimize();
        let _ = window.show();
        let _ = window.set_focus();
    }
    if let Some(view) = view {
        let _ = app.emit("navigate", view);
    }
}

/// macOS: the window drops down under the menu-bar icon.
#[cfg(target_os = "macos")]
pub fn place_under_tray(app: &AppHandle) {
    use tauri_plugin_positioner::{Position, WindowExt};
    if let Some(window) = app.get_webview_window(MAIN) {
        let _ = window.move_window(Position::TrayBottomCenter);
    }
}

#[cfg(not(target_os = "macos"))]
pub fn place_under_tray(_app: &AppHandle) {}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn main_window(config: &str) -> Value {
        let config: Value = serde_json::from_str(config).expect("valid JSON");
        config["app"]["windows"][0].clone()
    }

    /// Tauri replaces the whole windows list with the macOS file's: its
    /// window must be the base one, hidden at launch.
    #[test]
    fn the_macos_window_is_the_base_window_hidden() {
        let mut base = main_window(include_str!("../../tauri.conf.json"));
        let macos = main_window(include_str!("../../tauri.macos.conf.json"));
        base["visible"] = Value::Bool(false);
        assert_eq!(macos, base);
    }
}
