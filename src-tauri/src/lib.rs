//! Flashbar's desktop shell (Tauri 2): a tray / menu-bar icon with a menu and
//! one window holding the web UI (`ui/`). The shell talks to the engine only
//! through its public API and forwards results to the UI as commands/events.

mod tray;

use serde::Serialize;

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

pub fn run() {
    let app = tauri::Builder::default()
        .invoke_handler(tauri::generate_handler![backend_info])
        .setup(|app| {
            tray::install(app.handle());
            Ok(())
        })
        .build(tauri::generate_context!());
    match app {
        Ok(app) => app.run(|_, _| {}),
        Err(error) => {
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
