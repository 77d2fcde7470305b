//! The Models view's commands, backed by the `flashbar-hub` crate: the
//! catalogue of pairs ([`catalogue`]), the models on this machine with
//! their disk use and deletion ([`local`]), downloads of a pair with
//! progress, cancel and resume ([`download`], events `models:download`),
//! and the doctor's verdict on a pair before it is used ([`doctor`]).
//! Using a pair is saving it in the settings, which reloads the engine.
//!
//! The hub is `HF_ENDPOINT` (else huggingface.co) and the store the HF
//! cache (`HF_HUB_CACHE` / `HF_HOME`), as for `flashbar pull`.

pub(crate) mod catalogue;
pub(crate) mod doctor;
pub(crate) mod download;
pub(crate) mod local;

use crate::engine::{pair, EngineHandle};
use download::DownloadState;
use flashbar_hub::{CancelToken, HubConfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use tauri::{AppHandle, Emitter, Manager, State};

/// Downloads by pair id: the cancel switch of running ones and the last
/// state of each (so a reopened view shows where they stand).
#[derive(Default)]
pub struct Downloads {
    running: Mutex<HashMap<String, CancelToken>>,
    last: Mutex<HashMap<String, DownloadState>>,
}

impl Downloads {
    fn record(&self, state: &DownloadState) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.insert(state.pair.clone(), state.clone());
    }
}

/// Where the embedded pair's folders live (`models/default`).
fn embedded_root() -> PathBuf {
    let target = pair::default_pair().target;
    target.parent().map(PathBuf::from).unwrap_or(target)
}

/// Off the UI's thread: these read folders and checkpoints' headers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tauri::async_runtime::spawn_blocking(work)
        .await
        .map_err(|e| format!("the model manager stopped: {e}"))?
}

/// The doctor's verdict on two folders (empty target: the default pair).
#[tauri::command]
pub async fn models_check(target: String, drafter: String) -> Result<doctor::Verdict, String> {
    blocking(move || doctor::check(&target, &drafter)).await
}

/// The doctor's verdict on a catalogue pair that is on this machine.
#[tauri::command]
pub async fn models_pair_check(pair: String) -> Result<doctor::Verdict, String> {
    blocking(move || {
        let entry = catalogue::find(&catalogue::load()?, &pair)?;
        let store = HubConfig::from_env().store;
        let installed = |spec: &flashbar_hub::RepoSpec| {
            spec.installed_dir(&store, &embedded_root())
                .ok_or_else(|| format!("{} is not downloaded yet", spec.id))
        };
        let target = installed(&entry.target)?;
        let drafter = entry.drafters.first().map(installed).transpose()?;
        let drafter = drafter.map(|d| d.display().to_string()).unwrap_or_default();
        doctor::check(&target.display().to_string(), &drafter)
    })
    .await
}

/// Every catalogue pair, with what is downloaded.
#[tauri::command]
pub async fn models_catalogue() -> Result<Vec<catalogue::PairInfo>, String> {
    blocking(|| {
        let store = HubConfig::from_env().store;
        let budget = flashbar_hub::memory::budget().bytes;
        Ok(catalogue::describe(
            &catalogue::load()?,
            &store,
            &embedded_root(),
            budget,
        ))
    })
    .await
}

/// The store's models and disk use.
#[tauri::command]
pub async fn models_local() -> Result<local::LocalModels, String> {
    blocking(|| local::list(&HubConfig::from_env().store)).await
}

/// Deletes a downloaded repo (not the one in use); returns the bytes freed.
#[tauri::command]
pub async fn models_delete(repo: String, engine: State<'_, EngineHandle>) -> Result<u64, String> {
    let status = engine.status();
    blocking(move || {
        let mut in_use = vec![status.target.as_str()];
        in_use.extend(status.drafter.as_deref());
        local::delete(&HubConfig::from_env().store, &repo, &in_use)
    })
    .await
}

/// Where each download stands.
#[tauri::command]
pub fn models_downloads(downloads: State<'_, Downloads>) -> Vec<DownloadState> {
    let last = downloads.last.lock().unwrap_or_else(|p| p.into_inner());
    last.values().cloned().collect()
}

/// Starts (or resumes) downloading a pair; progress comes as
/// `models:download` events.
#[tauri::command]
pub fn models_download(
    pair: String,
    app: AppHandle,
    downloads: State<'_, Downloads>,
) -> Result<(), String> {
    let entry = catalogue::find(&catalogue::load()?, &pair)?;
    let cancel = CancelToken::new();
    {
        let mut running = downloads.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.contains_key(&pair) {
            return Err(format!("{pair} is already downloading"));
        }
        running.insert(pair.clone(), cancel.clone());
    }
    let starting = DownloadState::new(&pair, download::Phase::Starting);
    downloads.record(&starting);
    let _ = app.emit("models:download", &starting);
    tauri::async_runtime::spawn(async move {
        let config = HubConfig::from_env();
        let report = |state: DownloadState| {
            app.state::<Downloads>().record(&state);
            let _ = app.emit("models:download", state);
        };
        let result = download::pull_pair(&config, &entry, &report, &cancel).await;
        let downloads = app.state::<Downloads>();
        let last = downloads
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pair)
            .cloned()
            .unwrap_or_else(|| DownloadState::new(&pair, download::Phase::Starting));
        let end = download::finished(last, &result);
        downloads.record(&end);
        downloads
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pair);
        let _ = app.emit("models:download", end);
    });
    Ok(())
}

/// Cancels a running download (its partial files stay, to resume).
#[tauri::command]
pub fn models_cancel(pair: String, downloads: State<'_, Downloads>) -> bool {
    let running = downloads.running.lock().unwrap_or_else(|p| p.into_inner());
    running.get(&pair).map(CancelToken::cancel).is_some()
}
