//! Flashbar's desktop shell (Tauri 2): a tray / menu-bar icon with a menu
//! and one window holding the web UI (`ui/`). Data flows one way: the UI
//! calls commands here, these drive the engine through its public API (one
//! [`flashbar_engine::Worker`] shared by the chat and the local server),
//! and results come back to the UI as events.
//!
//! Folders: [`engine`] (background load, the pair to load), [`chat`],
//! [`models`] (catalogue, downloads, local store, the doctor's verdict),
//! [`server`] (the local endpoint switch), [`settings`], [`controller`]
//! (what changing the settings drives: reload, server, tray), [`history`] (the
//! saved conversations), [`logs`] (the log file), [`shell`] (tray, window,
//! macOS specifics);
//! [`atomic`] writes the settings and history files crash-safely.

mod atomic;
#[cfg(test)]
mod bindings;
mod chat;
mod controller;
mod engine;
mod history;
mod logs;
mod models;
mod server;
mod settings;
mod shell;

use serde::Serialize;
use std::time::Instant;
use tauri::{Manager, RunEvent, WindowEvent};

/// What the UI shows about the compute backend.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct BackendInfo {
    pub mlx_version: &'static str,
    pub mlx_library: &'static str,
    pub device: String,
}

/// The backend the engine would use, or the reason it cannot.
#[tauri::command]
fn backend_info() -> Result<BackendInfo, String> {
    let (mlx_version, mlx_library) = flashbar_mlx::library();
    let device = flashbar_mlx::device::choose().map_err(|e| e.to_string())?;
    Ok(BackendInfo {
        mlx_version,
        mlx_library,
        device: device.to_string(),
    })
}

/// When the process started, for the cold-start report.
struct Started(Instant);

/// The UI calls this once its first view is on screen: the app is ready
/// (tray and window), model loading aside. Printed for the cold-start
/// benchmark.
#[tauri::command]
fn ui_ready(started: tauri::State<'_, Started>, tray: tauri::State<'_, shell::tray::HasTray>) {
    println!(
        "flashbar-app: ready in {} ms (tray: {})",
        started.0.elapsed().as_millis(),
        if tray.0 { "yes" } else { "no" }
    );
}

pub fn run() {
    let started = Instant::now();
    let app = tauri::Builder::default()
        // First, so a second launch only brings the running app forward.
        .plugin(tauri_plugin_single_instance::init(|app, _args, _cwd| {
            shell::window::show(app, None)
        }))
        .plugin(tauri_plugin_autostart::init(
            tauri_plugin_autostart::MacosLauncher::LaunchAgent,
            None,
        ))
        .plugin(tauri_plugin_positioner::init())
        .plugin(tauri_plugin_opener::init())
        .manage(Started(started))
        .manage(engine::EngineHandle::default())
        .manage(chat::Jobs::default())
        .manage(models::Downloads::default())
        .manage(server::ServerHandle::default())
        .manage(server::log::ServerLog::default())
        .manage(shell::tray::GlanceState::default())
        .manage(settings::SettingsHandle::default())
        .manage(chat::Watch {
            round: shell::tray::show_round,
            idle: shell::tray::show_idle,
        })
        .invoke_handler(tauri::generate_handler![
            backend_info,
            ui_ready,
            logs::logs_folder,
            logs::logs_open,
            engine::engine_status,
            models::models_check,
            models::models_pair_check,
            models::models_catalogue,
            models::models_local,
            models::models_delete,
            models::models_downloads,
            models::models_download,
            models::models_cancel,
            chat::chat_send,
            chat::chat_stop,
            server::server_status,
            server::log::server_log,
            settings::settings_get,
            controller::settings_set,
            history::history_load,
            history::history_save,
        ])
        .setup(|app| {
            let handle = app.handle().clone();
            app.manage(logs::init(&handle));
            shell::menu_bar_only(app);
            // Where an installed app carries the default pair (docs/bundle.md).
            if let Ok(dir) = app.path().resource_dir() {
                engine::pair::set_resource_dir(dir);
            }
            let settings = settings::load(&handle);
            let pair = engine::pair::resolve(&settings.target, &settings.drafter).unwrap_or_else(
                |error| {
                    tracing::warn!("{error}; loading the default pair");
                    engine::pair::default_pair()
                },
            );
            app.state::<settings::SettingsHandle>().set(settings);
            let has_tray = shell::tray::install(&handle, controller::toggle_server);
            app.manage(shell::tray::HasTray(has_tray));
            engine::load_in_background(&handle, pair, controller::after_load);
            Ok(())
        })
        .on_window_event(|window, event| {
            // With a tray, closing the window only hides it.
            if let WindowEvent::CloseRequested { api, .. } = event {
                let app = window.app_handle();
                if app.try_state::<shell::tray::HasTray>().is_some_and(|t| t.0) {
                    api.prevent_close();
                    let _ = window.hide();
                }
            }
        })
        .build(tauri::generate_context!());
    match app {
        Ok(app) => app.run(|app, event| {
            if let RunEvent::Exit = event {
                chat::stop_all(app);
            }
        }),
        Err(error) => {
            let error = error.to_string();
            // Returns only when it did not start over.
            if let Some(why) = shell::relaunch::after(&error) {
                eprintln!("flashbar-app: {why}");
            }
            eprintln!("flashbar-app: cannot start: {error}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_info_reports_the_linked_library() {
        let info = backend_info().expect("the default device resolves");
        assert_eq!(info.mlx_version, "0.32.2");
        assert!(["cpu", "cuda", "metal"].contains(&info.mlx_library));
        assert!(["cpu", "cuda", "metal"].contains(&info.device.as_str()));
    }
}
