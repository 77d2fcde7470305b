//! The user's settings, kept in `settings.json` in the app's data folder
//! (written crash-safely by [`file`]): the local server (enabled, port, API
//! key), the default target + drafter, the speculation mode, idle unload,
//! launch at login and the tray's live speed.
//! What saving them changes (the server, the pair, login items) is the
//! controller's (`src-tauri/src/controller`).

use flashbar_engine::Speculation;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tauri::{AppHandle, State};

pub mod file;

const FILE_NAME: &str = "settings.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[serde(default)]
pub struct Settings {
    pub server_enabled: bool,
    pub port: u16,
    /// Empty: no key required.
    pub api_key: String,
    /// Target folder; empty: the default pair.
    pub target: String,
    /// Drafter folder; empty: none (or the default pair's).
    pub drafter: String,
    pub speculation: Speculation,
    pub launch_at_login: bool,
    /// Live tokens/s and DFlash speedup in the tray while generating.
    pub tray_speed: bool,
    /// Minutes without a request after which the model and drafter are
    /// unloaded (the next request loads them again); 0: never.
    pub idle_unload_minutes: u32,
}

/// The longest idle unload a setting may ask for (one day).
pub const MAX_IDLE_UNLOAD_MINUTES: u32 = 24 * 60;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            server_enabled: false,
            port: flashbar_server::DEFAULT_PORT,
            api_key: String::new(),
            target: String::new(),
            drafter: String::new(),
            speculation: Speculation::Auto,
            launch_at_login: false,
            tray_speed: true,
            idle_unload_minutes: 15,
        }
    }
}

impl Settings {
    /// One-line reason when a setting cannot be used.
    pub fn check(&self) -> Result<(), String> {
        if self.port < 1024 {
            return Err(format!(
                "port must be between 1024 and 65535, not {}",
                self.port
            ));
        }
        if self.idle_unload_minutes > MAX_IDLE_UNLOAD_MINUTES {
            return Err(format!(
                "idle unload must be at most {MAX_IDLE_UNLOAD_MINUTES} minutes (0: never), not {}",
                self.idle_unload_minutes
            ));
        }
        if self.api_key.chars().any(char::is_whitespace) {
            return Err("the API key must not contain spaces".into());
        }
        if self.target.trim().is_empty() && !self.drafter.trim().is_empty() {
            return Err("choose a target model for this drafter".into());
        }
        Ok(())
    }

    /// The API key, if one is required.
    pub fn api_key(&self) -> Option<String> {
        Some(self.api_key.clone()).filter(|key| !key.is_empty())
    }
}

/// The settings in force, shared app state.
#[derive(Default)]
pub struct SettingsHandle(Mutex<Settings>);

impl SettingsHandle {
    pub fn get(&self) -> Settings {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, settings: Settings) {
        self.replace(settings);
    }

    /// Puts `settings` in force; returns the ones they replace.
    pub(crate) fn replace(&self, settings: Settings) -> Settings {
        std::mem::replace(
            &mut self.0.lock().unwrap_or_else(|p| p.into_inner()),
            settings,
        )
    }
}

/// Reads the saved settings; unreadable or invalid ones fall back to the
/// defaults (with a warning) rather than stopping the app, and the file is
/// kept aside (`settings.json.bad-<time>`) so the next save loses nothing.
pub fn load(app: &AppHandle) -> Settings {
    match path(app) {
        Ok(path) => load_from(&path),
        Err(error) => {
            tracing::warn!("settings ignored ({error}); using the defaults");
            Settings::default()
        }
    }
}

fn load_from(path: &Path) -> Settings {
    let saved = file::read(path).and_then(|saved| {
        let settings = saved.unwrap_or_default();
        settings.check().map(|()| settings)
    });
    saved.unwrap_or_else(|error| {
        let kept = match crate::atomic::keep_aside(path) {
            Ok(aside) => format!("kept as {}", aside.display()),
            Err(e) => format!("not moved aside: {e}"),
        };
        tracing::warn!("settings ignored ({error}; {kept}); using the defaults");
        Settings::default()
    })
}

fn path(app: &AppHandle) -> Result<PathBuf, String> {
    crate::atomic::app_data_file(app, FILE_NAME)
}

pub(crate) fn save(app: &AppHandle, settings: &Settings) -> Result<(), String> {
    file::write(&path(app)?, settings).map_err(|e| format!("cannot save the settings: {e}"))
}

#[tauri::command]
pub fn settings_get(settings: State<'_, SettingsHandle>) -> Settings {
    settings.get()
}

/// Launch at login (opt-in): a login item through the autostart plugin.
pub(crate) fn apply_login_item(app: &AppHandle, enabled: bool) -> Result<(), String> {
    use tauri_plugin_autostart::ManagerExt;
    let launcher = app.autolaunch();
    let result = if enabled {
        launcher.enable()
    } else {
        launcher.disable()
    };
    result.map_err(|e| format!("cannot change launch at login: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_settings_round_trip_and_missing_keys_take_defaults() {
        let settings: Settings =
            serde_json::from_str(r#"{"port": 9000, "speculation": "off"}"#).unwrap();
        assert_eq!(settings.port, 9000);
        assert_eq!(settings.speculation, Speculation::Off);
        assert!(!settings.server_enabled);
        assert_eq!(
            settings.idle_unload_minutes, 15,
            "unload after 15 idle minutes by default"
        );
        let json = serde_json::to_value(&settings).unwrap();
        assert_eq!(serde_json::from_value::<Settings>(json).unwrap(), settings);
    }

    #[test]
    fn bad_settings_are_refused_with_one_line() {
        let cases = [
            (
                Settings {
                    port: 80,
                    ..Settings::default()
                },
                "port must be between 1024 and 65535, not 80",
            ),
            (
                Settings {
                    api_key: "a b".into(),
                    ..Settings::default()
                },
                "the API key must not contain spaces",
            ),
            (
                Settings {
                    drafter: "/d".into(),
                    ..Settings::default()
                },
                "choose a target model for this drafter",
            ),
            (
                Settings {
                    idle_unload_minutes: 100_000,
                    ..Settings::default()
                },
                "idle unload must be at most 1440 minutes (0: never), not 100000",
            ),
        ];
        for (settings, reason) in cases {
            assert_eq!(settings.check().unwrap_err(), reason);
        }
        assert_eq!(Settings::default().check(), Ok(()));
        assert_eq!(Settings::default().api_key(), None);
    }

    /// Unparsable or invalid settings start the defaults, and the file is
    /// kept aside rather than overwritten by the next save.
    #[test]
    fn unreadable_settings_are_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert_eq!(load_from(&path), Settings::default(), "no file yet");
        let saved = Settings {
            port: 9100,
            ..Settings::default()
        };
        file::write(&path, &saved).unwrap();
        assert_eq!(load_from(&path), saved);
        for bad in [
            r#"{"settings": {"port": 91"#,
            r#"{"settings": {"port": 80}}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(load_from(&path), Settings::default(), "{bad}");
            assert!(!path.exists(), "{bad}");
        }
        let mut kept: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                r#"{"settings": {"port": 80}}"#,
                r#"{"settings": {"port": 91"#
            ]
        );
    }
}
