//! The desktop shell around the views: the tray / menu-bar icon, its
//! menu and its speed at a glance, the main window (shown, focused, told which view to open), and the
//! small macOS-only parts (no Dock icon, window under the menu-bar icon).

pub mod glance;
pub mod relaunch;
pub mod tray;
pub mod window;

/// macOS: a menu-bar app has no Dock icon and no app menu.
#[cfg(target_os = "macos")]
pub fn menu_bar_only(app: &mut tauri::App) {
    app.set_activation_policy(tauri::ActivationPolicy::Accessory);
}

#[cfg(not(target_os = "macos"))]
pub fn menu_bar_only(_app: &mut tauri::App) {}
