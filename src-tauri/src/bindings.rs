//! The UI's TypeScript types, generated from the Rust types the app sends
//! and takes (`ui/src/bindings.ts`, with ts-rs): the commands' payloads and
//! the events'. A test fails when the file and the Rust types drift apart;
//! `FLASHBAR_WRITE_BINDINGS=1 cargo test -p flashbar-app bindings` writes
//! it again. `ui/src/api.ts` imports from it.

use ts_rs::TS;

/// The file the UI imports.
const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../ui/src/bindings.ts");

/// Every type the UI sees, each declared once, in the order written.
fn declarations() -> Vec<String> {
    use crate::chat::{ChatRequest, DoneEvent, ErrorEvent, ReloadedEvent, RoundEvent, TokenEvent};
    use crate::engine::{EngineState, EngineStatus};
    use crate::models::catalogue::{ModelInfo, PairInfo};
    use crate::models::doctor::{Finding, Verdict};
    use crate::models::download::{DownloadState, Phase};
    use crate::models::local::{LocalModel, LocalModels};
    use crate::server::ServerStatus;
    use crate::settings::Settings;
    use flashbar_engine::policy::gate::GateState;
    use flashbar_engine::policy::thermal::ThermalState;
    use flashbar_engine::{FinishReason, Message, Mode, RoundStats, Speculation, Totals};
    use flashbar_server::request_log::RequestLine;
    vec![
        // The engine's.
        Speculation::decl(),
        Message::decl(),
        Mode::decl(),
        GateState::decl(),
        ThermalState::decl(),
        RoundStats::decl(),
        FinishReason::decl(),
        Totals::decl(),
        // The app's engine and chat.
        EngineState::decl(),
        EngineStatus::decl(),
        ChatRequest::decl(),
        TokenEvent::decl(),
        RoundEvent::decl(),
        DoneEvent::decl(),
        ErrorEvent::decl(),
        ReloadedEvent::decl(),
        // Settings and the local server.
        Settings::decl(),
        ServerStatus::decl(),
        RequestLine::decl(),
        // Models.
        Finding::decl(),
        Verdict::decl(),
        ModelInfo::decl(),
        PairInfo::decl(),
        LocalModel::decl(),
        LocalModels::decl(),
        Phase::decl(),
        DownloadState::decl(),
    ]
}

/// The whole file.
pub fn render() -> String {
    let mut out = String::from(
        "// Generated from the Rust types by src-tauri/src/bindings.rs (ts-rs): do not edit.\n\
         // FLASHBAR_WRITE_BINDINGS=1 cargo test -p flashbar-app bindings writes it again.\n",
    );
    for declaration in declarations() {
        out.push('\n');
        out.push_str("export ");
        out.push_str(&declaration);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ui_types_are_the_rust_types() {
        let wanted = render();
        if std::env::var_os("FLASHBAR_WRITE_BINDINGS").is_some() {
            std::fs::write(PATH, &wanted).unwrap();
        }
        let written = std::fs::read_to_string(PATH).unwrap_or_default();
        assert!(
            written == wanted,
            "ui/src/bindings.ts is not what the Rust types give: run \
             FLASHBAR_WRITE_BINDINGS=1 cargo test -p flashbar-app bindings"
        );
    }
}
