//! The app's log: every crate's tracing events (engine, hub, server, app)
//! in a file rolled daily in the platform's log folder (Tauri's
//! `app_log_dir`: `~/Library/Logs/<id>` on macOS, `~/.local/share/<id>/logs`
//! on Linux), seven days kept, and a copy on stderr. The level is `info`
//! unless `RUST_LOG` says otherwise. Nothing logs prompt or completion text,
//! and the server's request lines hold no keys (docs/logging.md).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use tauri::{AppHandle, Manager, State};
use tauri_plugin_opener::OpenerExt;
use tracing_appender::non_blocking::WorkerGuard;
use tracing_appender::rolling::{Builder, Rotation};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{fmt, EnvFilter, Registry};

/// The log files' names: `flashbar.YYYY-MM-DD.log`.
const PREFIX: &str = "flashbar";
const SUFFIX: &str = "log";
/// Days of logs kept.
const KEEP_FILES: usize = 7;
const DEFAULT_FILTER: &str = "info";

/// Where the log files are, for the tray's "Open logs folder" and Settings.
pub struct LogFolder {
    pub path: PathBuf,
    /// Flushes the file writer when the app ends.
    _guard: Option<WorkerGuard>,
}

/// A subscriber writing to a rolling file in `dir` (and to stderr when
/// `stderr`), and the guard that flushes it.
pub fn subscriber(
    dir: &Path,
    rotation: Rotation,
    stderr: bool,
) -> Result<(impl tracing::Subscriber + Send + Sync, WorkerGuard), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let files = Builder::new()
        .rotation(rotation)
        .filename_prefix(PREFIX)
        .filename_suffix(SUFFIX)
        .max_log_files(KEEP_FILES)
        .build(dir)
        .map_err(|e| format!("cannot write logs in {}: {e}", dir.display()))?;
    let (writer, guard) = tracing_appender::non_blocking(files);
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let subscriber = Registry::default()
        .with(filter)
        .with(fmt::layer().with_ansi(false).with_writer(writer))
        .with(stderr.then(|| {
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
        }));
    Ok((subscriber, guard))
}

/// Starts logging for the app: in its log folder, else (no folder could be
/// made) on stderr only, said once there.
pub fn init(app: &AppHandle) -> LogFolder {
    let path = app
        .path()
        .app_log_dir()
        .unwrap_or_else(|_| std::env::temp_dir().join("flashbar-logs"));
    match subscriber(&path, Rotation::DAILY, true) {
        Ok((subscriber, guard)) => {
            let _ = tracing::subscriber::set_global_default(subscriber);
            tracing::info!(folder = %path.display(), version = env!("CARGO_PKG_VERSION"), "Flashbar started");
            LogFolder {
                path,
                _guard: Some(guard),
            }
        }
        Err(error) => {
            let _ = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .try_init();
            tracing::warn!("no log file: {error}");
            LogFolder { path, _guard: None }
        }
    }
}

/// The log folder's path, for the Settings view.
#[tauri::command]
pub fn logs_folder(folder: State<'_, LogFolder>) -> String {
    folder.path.display().to_string()
}

/// Opens the log folder in the platform's file manager.
#[tauri::command]
pub fn logs_open(app: AppHandle) -> Result<(), String> {
    open(&app)
}

pub fn open(app: &AppHandle) -> Result<(), String> {
    let folder = app.state::<LogFolder>();
    app.opener()
        .open_path(folder.path.display().to_string(), None::<&str>)
        .map_err(|e| format!("cannot open {}: {e}", folder.path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logged(dir: &Path) -> String {
        let mut text = String::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with("flashbar.") && name.ends_with(".log"),
                "{name}"
            );
            text += &std::fs::read_to_string(path).unwrap();
        }
        text
    }

    #[test]
    fn events_land_in_a_file_that_grows() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("logs");
        // One file (a daily one could roll over between the two runs).
        let (logger, guard) = subscriber(&folder, Rotation::NEVER, false).unwrap();
        tracing::subscriber::with_default(logger, || {
            tracing::info!(target: "flashbar_hub", repo = "a/b", "pull resolved");
            tracing::debug!("below the default level");
        });
        drop(guard); // flushes
        let first = logged(&folder);
        assert!(
            first.contains("pull resolved") && first.contains("repo=\"a/b\""),
            "{first}"
        );
        assert!(!first.contains("below the default level"), "{first}");

        let (logger, guard) = subscriber(&folder, Rotation::NEVER, false).unwrap();
        tracing::subscriber::with_default(logger, || tracing::warn!("second run"));
        drop(guard);
        let second = logged(&folder);
        assert!(
            second.len() > first.len() && second.starts_with(&first),
            "{second}"
        );
        assert!(second.contains("second run"));
    }
}
