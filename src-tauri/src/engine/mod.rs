//! The app's one engine: a [`Worker`] thread that owns the loaded model,
//! shared by the chat and the local server so both queue fairly on it.
//! Loading runs in the background and reports its progress to the UI as
//! `engine:status` events. After the settings' idle stretch the worker
//! unloads the pair, and the next chat or HTTP request loads it again
//! (the chat shows how long that took).

pub mod pair;

use flashbar_engine::Engine;
use flashbar_engine::Worker;
use pair::Pair;
use serde::Serialize;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tauri::{AppHandle, Emitter, Manager};

/// Generations that may wait for the engine (chat + HTTP together).
const QUEUE_CAPACITY: usize = flashbar_engine::DEFAULT_QUEUE_CAPACITY;

/// Seconds of idle before an unload, overriding the setting's minutes
/// (the end-to-end test uses a few seconds).
pub const IDLE_UNLOAD_SECONDS_ENV: &str = "FLASHBAR_IDLE_UNLOAD_SECONDS";

/// The idle unload the settings ask for (None: never).
fn idle_unload(app: &AppHandle) -> Option<Duration> {
    let minutes = app
        .state::<crate::settings::SettingsHandle>()
        .get()
        .idle_unload_minutes;
    idle_unload_from(
        std::env::var(IDLE_UNLOAD_SECONDS_ENV).ok().as_deref(),
        minutes,
    )
}

fn idle_unload_from(seconds_override: Option<&str>, minutes: u32) -> Option<Duration> {
    let seconds = match seconds_override.and_then(|s| s.trim().parse::<u64>().ok()) {
        Some(seconds) => seconds,
        None => u64::from(minutes) * 60,
    };
    (seconds > 0).then(|| Duration::from_secs(seconds))
}

/// Gives the running worker the settings' idle unload.
pub fn apply_idle_unload(app: &AppHandle) {
    if let Some(worker) = app.state::<EngineHandle>().worker() {
        worker.set_idle_unload(idle_unload(app));
    }
}

/// Where loading stands.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    /// Nothing loaded yet.
    #[default]
    Idle,
    Loading,
    Ready,
    Failed,
}

impl std::fmt::Display for EngineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineState::Idle => "idle",
            EngineState::Loading => "loading",
            EngineState::Ready => "ready",
            EngineState::Failed => "failed",
        })
    }
}

/// Where loading stands, as the UI shows it.
#[derive(Clone, Debug, Default, Serialize, PartialEq, ts_rs::TS)]
pub struct EngineStatus {
    pub state: EngineState,
    pub target: String,
    pub drafter: Option<String>,
    pub model_id: String,
    /// Time spent loading so far (or in total, once ready).
    #[ts(type = "number")]
    pub elapsed_ms: u64,
    pub error: Option<String>,
}

#[derive(Default)]
struct Inner {
    status: EngineStatus,
    worker: Option<Arc<Worker>>,
    /// Bumped on every load, so a superseded load's result is dropped.
    load_id: u64,
}

/// Shared app state: the engine's status and, once loaded, its worker.
#[derive(Default)]
pub struct EngineHandle(Mutex<Inner>);

impl EngineHandle {
    pub fn status(&self) -> EngineStatus {
        self.lock().status.clone()
    }

    /// The worker, once the model is loaded.
    pub fn worker(&self) -> Option<Arc<Worker>> {
        self.lock().worker.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere must not take the whole app down with it.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The engine's status now.
#[tauri::command]
pub fn engine_status(engine: tauri::State<'_, EngineHandle>) -> EngineStatus {
    engine.status()
}

/// Loads `pair` on a new worker thread (replacing the current model once
/// it is ready), emitting `engine:status` while it loads; `then` runs
/// after a successful load (the server restarts on the new worker).
pub fn load_in_background(app: &AppHandle, pair: Pair, then: fn(&AppHandle)) {
    let handle = app.state::<EngineHandle>();
    let load_id = {
        let mut inner = handle.lock();
        inner.load_id += 1;
        inner.status = EngineStatus {
            state: EngineState::Loading,
            target: pair.target.display().to_string(),
            drafter: pair.drafter.as_ref().map(|d| d.display().to_string()),
            model_id: pair::model_id(&pair.target),
            elapsed_ms: 0,
            error: None,
        };
        inner.load_id
    };
    emit(app);
    let app = app.clone();
    let spawned = std::thread::Builder::new()
        .name("flashbar-load".into())
        .spawn(move || load(app, pair, load_id, then));
    if let Err(error) = spawned {
        tracing::error!("cannot start loading: {error}");
    }
}

fn load(app: AppHandle, pair: Pair, load_id: u64, then: fn(&AppHandle)) {
    let started = Instant::now();
    let ticker = spawn_ticker(app.clone(), load_id, started);
    let result = Worker::spawn_unloading(QUEUE_CAPACITY, idle_unload(&app), move || {
        // A panic while loading becomes an error, never a dead app.
        catch_unwind(AssertUnwindSafe(|| -> Result<Engine, String> {
            Engine::load(&pair.target, pair.drafter.as_deref()).map_err(|e| e.to_string())
        }))
        .unwrap_or_else(|_| Err("the engine panicked while loading the model".into()))
    });
    let handle = app.state::<EngineHandle>();
    let old = {
        let mut inner = handle.lock();
        if inner.load_id != load_id {
            return; // a newer load replaced this one
        }
        inner.status.elapsed_ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(worker) => {
                inner.status.state = EngineState::Ready;
                inner.worker.replace(Arc::new(worker))
            }
            Err(error) => {
                inner.status.state = EngineState::Failed;
                inner.status.error = Some(first_line(&error));
                inner.worker.take()
            }
        }
    };
    let _ = ticker.join();
    drop(old); // frees the previous model (waits for its current job)
    emit(&app);
    if handle.status().state == EngineState::Ready {
        then(&app);
    }
}

/// Re-emits the status every 100 ms while loading, so the UI's progress
/// shows time passing even though the load itself is one call.
fn spawn_ticker(app: AppHandle, load_id: u64, started: Instant) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let handle = app.state::<EngineHandle>();
        {
            let mut inner = handle.lock();
            if inner.load_id != load_id || inner.status.state != EngineState::Loading {
                return;
            }
            inner.status.elapsed_ms = started.elapsed().as_millis() as u64;
        }
        emit(&app);
    })
}

fn emit(app: &AppHandle) {
    let status = app.state::<EngineHandle>().status();
    let _ = app.emit("engine:status", status);
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_unload_comes_from_the_minutes_unless_seconds_override_it() {
        assert_eq!(idle_unload_from(None, 15), Some(Duration::from_secs(900)));
        assert_eq!(idle_unload_from(None, 0), None, "0 minutes: never");
        assert_eq!(
            idle_unload_from(Some("3"), 15),
            Some(Duration::from_secs(3))
        );
        assert_eq!(idle_unload_from(Some("0"), 15), None);
        assert_eq!(
            idle_unload_from(Some("soon"), 15),
            Some(Duration::from_secs(900))
        );
    }
}
