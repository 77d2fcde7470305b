//! The app's one controller: the transitions between the settings and what
//! they drive: the engine's reload, the local server's start, restart and
//! stop, the tray's state. It is the only module that calls more than one
//! capability; chat, server and tray are leaves that never import each
//! other (docs/architecture.md, "The app shell").

use crate::settings::{self, Settings, SettingsHandle};
use crate::{chat, engine, server, shell};
use flashbar_engine::Observer;
use flashbar_server::ObserveRequests;
use tauri::{AppHandle, Emitter, Manager};

/// Checks, saves and applies new settings; returns them.
#[tauri::command]
pub async fn settings_set(app: AppHandle, settings: Settings) -> Result<Settings, String> {
    settings.check()?;
    let pair = engine::pair::resolve(&settings.target, &settings.drafter)?;
    settings::save(&app, &settings)?;
    let old = app.state::<SettingsHandle>().replace(settings.clone());
    if old.launch_at_login != settings.launch_at_login {
        settings::apply_login_item(&app, settings.launch_at_login)?;
    }
    if old.idle_unload_minutes != settings.idle_unload_minutes {
        engine::apply_idle_unload(&app);
    }
    if old.tray_speed && !settings.tray_speed {
        shell::tray::show_idle(&app);
    }
    if (old.target.as_str(), old.drafter.as_str())
        != (settings.target.as_str(), settings.drafter.as_str())
    {
        // The server stops with the old pair and starts on the new one.
        chat::stop_all(&app);
        server::stop(&app).await;
        shell::tray::show_server(&app, false, None);
        engine::load_in_background(&app, pair, after_load);
    } else {
        apply_server(&app).await?;
    }
    Ok(settings)
}

/// A pair finished loading (or failed to): the server follows the settings.
pub fn after_load(app: &AppHandle) {
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        if let Err(error) = apply_server(&app).await {
            tracing::error!("local server: {error}");
        }
    });
}

/// The tray's "Local server" switch: flips `server_enabled`, saves and
/// applies it, and tells the UI.
pub fn toggle_server(app: &AppHandle) {
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        let mut settings = app.state::<SettingsHandle>().get();
        settings.server_enabled = !settings.server_enabled;
        match settings_set(app.clone(), settings).await {
            Ok(settings) => {
                let _ = app.emit("settings:changed", settings);
            }
            Err(error) => tracing::error!("local server: {error}"),
        }
    });
}

/// Brings the server in line with the settings, its HTTP requests' rounds
/// going to the metrics panel and the tray like the chat's; the tray's
/// menu item shows the outcome.
async fn apply_server(app: &AppHandle) -> Result<(), String> {
    let rounds = ObserveRequests(std::sync::Arc::new({
        let app = app.clone();
        move || Box::new(chat::HttpRounds(app.clone())) as Observer
    }));
    let (status, result) = server::apply(app, rounds).await;
    shell::tray::show_server(app, status.running, status.address.as_deref());
    result.map(|_| ())
}
