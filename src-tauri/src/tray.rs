//! The tray / menu-bar icon and its menu.
//!
//! On Linux the tray goes through libayatana-appindicator, loaded at run time:
//! if the library is missing, tauri panics while building the tray, so we
//! contain that and run without a tray, showing the window instead.

use tauri::menu::{Menu, MenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Manager};

pub fn install(app: &AppHandle) {
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(app)));
    match built {
        Ok(Ok(())) => {}
        Ok(Err(error)) => without_tray(app, &error.to_string()),
        Err(_) => without_tray(app, "the tray library could not be loaded"),
    }
}

fn build(app: &AppHandle) -> tauri::Result<()> {
    let open = MenuItem::with_id(app, "open", "Open Flashbar", true, None::<&str>)?;
    let quit = MenuItem::with_id(app, "quit", "Quit", true, None::<&str>)?;
    let menu = Menu::with_items(app, &[&open, &quit])?;
    let mut tray = TrayIconBuilder::with_id("flashbar")
        .tooltip("Flashbar")
        .menu(&menu)
        .on_menu_event(|app, event| match event.id().as_ref() {
            "open" => show_main_window(app),
            "quit" => app.exit(0),
            _ => {}
        });
    if let Some(icon) = app.default_window_icon() {
        tray = tray.icon(icon.clone());
    }
    tray.build(app)?;
    Ok(())
}

fn without_tray(app: &AppHandle, reason: &str) {
    eprintln!("flashbar-app: no tray icon ({reason}); the window stays open");
    show_main_window(app);
}

fn show_main_window(app: &AppHandle) {
    if let Some(window) = app.get_webview_window("main") {
        let _ = window.show();
        let _ = window.set_focus();
    }
}
