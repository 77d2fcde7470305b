//! The tray / menu-bar icon and its menu: Open chat, Models, Metrics, the
//! "Local server" switch showing its address, Open logs folder, Quit.
//!
//! On Linux the tray goes through libayatana-appindicator, loaded at run
//! time: if the library is missing, tauri panics while building the tray,
//! so that is contained and the app runs without a tray, window shown.

use super::glance::{self, Glance};
use super::window::{self, View};
use flashbar_engine::{Mode, RoundStats};
use std::sync::Mutex;
use std::time::Instant;
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::tray::{MouseButton, MouseButtonState, TrayIconBuilder, TrayIconEvent};
use tauri::{AppHandle, Manager, Wry};

/// The menu item that shows the server's state (updated as it changes).
pub struct ServerItem(CheckMenuItem<Wry>);

/// Whether a tray icon exists (else closing the window quits).
pub struct HasTray(pub bool);

/// The tray's speed at a glance, and the clock its rounds are stamped with.
pub struct GlanceState(Mutex<Glance>, Instant);

impl Default for GlanceState {
    fn default() -> Self {
        GlanceState(Mutex::new(Glance::default()), Instant::now())
    }
}

const TOOLTIP: &str = "Flashbar";

/// Installs the tray; returns whether it exists. `toggle_server` runs when
/// the "Local server" item is clicked.
pub fn install(app: &AppHandle, toggle_server: fn(&AppHandle)) -> bool {
    let built =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(app, toggle_server)));
    let reason = match built {
        Ok(Ok(())) => return true,
        Ok(Err(error)) => error.to_string(),
        Err(_) => "the tray library could not be loaded".to_owned(),
    };
    tracing::warn!("no tray icon ({reason}); the window stays open");
    window::show(app, None);
    false
}

fn build(app: &AppHandle, toggle_server: fn(&AppHandle)) -> tauri::Result<()> {
    let chat = MenuItem::with_id(app, "chat", "Open chat", true, None::<&str>)?;
    let models = MenuItem::with_id(app, "models", "Models", true, None::<&str>)?;
    let metrics = MenuItem::with_id(app, "metrics", "Metrics", true, None::<&str>)?;
    let server = CheckMenuItem::with_id(app, "server", label(None), true, false, None::<&str>)?;
    let logs = MenuItem::with_id(app, "logs", "Open logs folder", true, None::<&str>)?;
    let quit = MenuItem::with_id(app, "quit", "Quit Flashbar", true, None::<&str>)?;
    let separator = PredefinedMenuItem::separator(app)?;
    let menu = Menu::with_items(
        app,
        &[
            &chat, &models, &metrics, &separator, &server, &separator, &logs, &quit,
        ],
    )?;
    let mut tray = TrayIconBuilder::with_id(TRAY_ID)
        .tooltip(TOOLTIP)
        .menu(&menu)
        .show_menu_on_left_click(cfg!(not(target_os = "macos")))
        .on_menu_event(move |app, event| match event.id().as_ref() {
            "chat" => window::show(app, Some(View::Chat)),
            "models" => window::show(app, Some(View::Models)),
            "metrics" => window::show(app, Some(View::Metrics)),
            "server" => toggle_server(app),
            "logs" => {
                if let Err(error) = crate::logs::open(app) {
                    tracing::warn!("{error}");
                }
            }
            "quit" => app.exit(0),
            _ => {}
        })
        .on_tray_icon_event(|tray, event| {
            tauri_plugin_positioner::on_tray_event(tray.app_handle(), &event);
            // macOS: a left click drops the window down under the icon.
            if cfg!(target_os = "macos") {
                if let TrayIconEvent::Click {
                    button: MouseButton::Left,
                    button_state: MouseButtonState::Up,
                    ..
                } = event
                {
                    window::place_under_tray(tray.app_handle());
                    window::show(tray.app_handle(), None);
                }
            }
        });
    if let Some(icon) = icon(app) {
        tray = tray.icon(icon).icon_as_template(cfg!(target_os = "macos"));
    }
    tray.build(app)?;
    app.manage(ServerItem(server));
    Ok(())
}

/// macOS draws the menu-bar icon as a template: from its alpha alone, in the
/// menu bar's colour, so it is `icons/tray.png` (black, the mark cut out);
/// the opaque app icon would draw as a filled square. Elsewhere the app icon.
#[cfg(target_os = "macos")]
fn icon(_app: &AppHandle) -> Option<Image<'_>> {
    Some(tauri::include_image!("icons/tray.png"))
}

#[cfg(not(target_os = "macos"))]
fn icon(app: &AppHandle) -> Option<Image<'_>> {
    app.default_window_icon().cloned()
}

fn label(address: Option<&str>) -> String {
    match address {
        Some(address) => format!("Local server: on — {address}"),
        None => "Local server: off".to_owned(),
    }
}

const TRAY_ID: &str = "flashbar";

/// A decoding round (chat or HTTP): the live speed in the tray, unless the
/// setting is off. It is the icon's title where the platform has one: the
/// menu-bar title on macOS, the indicator's label on Linux (appindicator:
/// tray-icon's tooltip does nothing there); Windows has no title, so there
/// it is the tooltip.
pub fn show_round(app: &AppHandle, stats: &RoundStats) {
    if !app
        .state::<crate::settings::SettingsHandle>()
        .get()
        .tray_speed
    {
        return;
    }
    let Some(state) = app.try_state::<GlanceState>() else {
        return;
    };
    let round = glance::Round {
        committed: stats.committed,
        ms: stats.round_ms,
        speedup: stats.speedup,
        dflash: stats.mode == Mode::Dflash,
    };
    let now = state.1.elapsed().as_millis() as u64;
    let text = state
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .round(round, now);
    if let Some(text) = text {
        show_speed(app, Some(&text));
    }
}

/// A generation ended: the tray goes back to its plain icon.
pub fn show_idle(app: &AppHandle) {
    if let Some(state) = app.try_state::<GlanceState>() {
        state.0.lock().unwrap_or_else(|p| p.into_inner()).idle();
    }
    show_speed(app, None);
}

fn show_speed(app: &AppHandle, text: Option<&str>) {
    let Some(tray) = app.tray_by_id(TRAY_ID) else {
        return;
    };
    if cfg!(windows) {
        let tooltip = text.map_or(TOOLTIP.to_owned(), |t| format!("{TOOLTIP} — {t}"));
        let _ = tray.set_tooltip(Some(tooltip));
    } else {
        let _ = tray.set_title(text);
    }
}

/// Shows the server's state in the menu (no-op without a tray).
pub fn show_server(app: &AppHandle, running: bool, address: Option<&str>) {
    if let Some(item) = app.try_state::<ServerItem>() {
        let _ = item.0.set_text(label(address));
        let _ = item.0.set_checked(running);
    }
}

#[cfg(test)]
mod tests {
    /// A template image: one colour, black, and the shape in the alpha
    /// channel (both fully clear and fully opaque pixels).
    #[test]
    fn the_macos_tray_icon_is_a_template() {
        let icon = tauri::image::Image::from_bytes(include_bytes!("../../icons/tray.png"))
            .expect("icons/tray.png decodes");
        let pixels: Vec<&[u8]> = icon.rgba().chunks(4).collect();
        assert_eq!(pixels.len(), (icon.width() * icon.height()) as usize);
        assert!(pixels.iter().all(|p| p[..3] == [0, 0, 0]), "not all black");
        assert!(pixels.iter().any(|p| p[3] == 0), "no clear pixel");
        assert!(pixels.iter().any(|p| p[3] == 255), "no opaque pixel");
    }
}
