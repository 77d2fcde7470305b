//! The "Local server" switch: the OpenAI-compatible endpoint of
//! flashbar-server, started over the app's own engine worker (the chat and
//! HTTP clients queue fairly on the one loaded model) and stopped without
//! unloading it. Its requests' rounds go to the metrics panel like the
//! chat's (the controller hands it the observer). Its state goes to the UI
//! as `server:status` (and, through the controller, to the tray's menu
//! item); its request lines to the Server panel ([`log`]).

pub mod log;

use crate::engine::EngineHandle;
use crate::settings::SettingsHandle;
use flashbar_server::{ObserveRequests, Server, ServerOptions};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tauri::{AppHandle, Emitter, Manager, State};
use tokio::sync::Mutex;

#[derive(Clone, Debug, Default, Serialize, PartialEq, ts_rs::TS)]
pub struct ServerStatus {
    pub running: bool,
    /// `http://127.0.0.1:PORT` while running.
    pub address: Option<String>,
    /// Why it is not running although enabled.
    pub error: Option<String>,
}

struct Running {
    server: Server,
    port: u16,
    api_key: Option<String>,
    /// The worker it serves (a reload replaces it).
    worker: usize,
}

#[derive(Default)]
pub struct ServerHandle {
    running: Mutex<Option<Running>>,
    status: std::sync::Mutex<ServerStatus>,
}

impl ServerHandle {
    pub fn status(&self) -> ServerStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[tauri::command]
pub fn server_status(server: State<'_, ServerHandle>) -> ServerStatus {
    server.status()
}

/// Brings the server in line with the settings: started (on the loaded
/// worker), restarted when its port or key changed, or stopped. An enabled
/// server waits for the model to load and starts then.
/// `rounds` sees each request's generation. Returns the status it reached,
/// and the error when it could not start.
pub async fn apply(app: &AppHandle, rounds: ObserveRequests) -> (ServerStatus, Result<(), String>) {
    let settings = app.state::<SettingsHandle>().get();
    let worker = app.state::<EngineHandle>().worker();
    let handle = app.state::<ServerHandle>();
    let mut running = handle.running.lock().await;
    let wanted = settings.server_enabled.then_some(()).and(worker.clone());
    let key = settings.api_key();
    let unchanged = match (&*running, &wanted) {
        (Some(r), Some(w)) => {
            r.port == settings.port
                && r.api_key == key
                && r.worker == std::sync::Arc::as_ptr(w) as usize
        }
        (None, None) => true,
        _ => false,
    };
    let mut error = None;
    if !unchanged {
        if let Some(old) = running.take() {
            old.server.stop().await;
        }
        if let Some(worker) = wanted {
            let model_id = app.state::<EngineHandle>().status().model_id;
            let options = ServerOptions {
                addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), settings.port),
                api_key: key.clone(),
                observe: Some(rounds),
                request_log: Some(log::sink(app)),
                ..ServerOptions::default()
            };
            let pointer = std::sync::Arc::as_ptr(&worker) as usize;
            match Server::start(worker, model_id, options).await {
                Ok(server) => {
                    *running = Some(Running {
                        server,
                        port: settings.port,
                        api_key: key,
                        worker: pointer,
                    })
                }
                Err(e) => error = Some(e.to_string()),
            }
        }
    }
    let status = ServerStatus {
        running: running.is_some(),
        address: running
            .as_ref()
            .map(|r| format!("http://{}", r.server.local_addr())),
        error: error.clone().or_else(|| {
            (settings.server_enabled && worker.is_none())
                .then(|| "waiting for the model to load".to_owned())
        }),
    };
    drop(running);
    *handle.status.lock().unwrap_or_else(|p| p.into_inner()) = status.clone();
    let _ = app.emit("server:status", &status);
    let result = error.map_or(Ok(()), Err);
    (status, result)
}

/// Stops the server (before its model is replaced).
pub async fn stop(app: &AppHandle) {
    let handle = app.state::<ServerHandle>();
    let old = handle.running.lock().await.take();
    if let Some(old) = old {
        old.server.stop().await;
    }
}
