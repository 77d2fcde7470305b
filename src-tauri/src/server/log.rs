//! The Server panel's lines: the last [`KEEP`] request lines of the local
//! server, kept here and pushed to the UI as `server:request` as each
//! request ends. The same lines go to the log file through `tracing`
//! (`flashbar_server::request_log`; docs/logging.md).

use flashbar_server::request_log::{LineSink, RequestLine};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tauri::{AppHandle, Emitter, Manager, State};

/// Lines the panel keeps.
pub const KEEP: usize = 200;

#[derive(Default)]
pub struct ServerLog(Mutex<VecDeque<RequestLine>>);

impl ServerLog {
    /// Keeps `line`, dropping the oldest past [`KEEP`].
    pub fn push(&self, line: RequestLine) {
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == KEEP {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    pub fn lines(&self) -> Vec<RequestLine> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// Where the server sends its lines: kept, then sent to the window.
pub fn sink(app: &AppHandle) -> LineSink {
    let app = app.clone();
    LineSink(Arc::new(move |line: &RequestLine| {
        app.state::<ServerLog>().push(line.clone());
        let _ = app.emit("server:request", line);
    }))
}

/// The lines so far, oldest first (the panel's first paint).
#[tauri::command]
pub fn server_log(log: State<'_, ServerLog>) -> Vec<RequestLine> {
    log.lines()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(n: u64) -> RequestLine {
        RequestLine {
            method: "GET".into(),
            path: "/v1/models".into(),
            model: None,
            status: 200,
            prompt_tokens: None,
            completion_tokens: None,
            speculation: None,
            mode: None,
            accepted_drafts: None,
            ms: n,
        }
    }

    #[test]
    fn keeps_the_last_200_in_order() {
        let log = ServerLog::default();
        for n in 0..(KEEP as u64 + 50) {
            log.push(line(n));
        }
        let kept: Vec<u64> = log.lines().iter().map(|l| l.ms).collect();
        assert_eq!(kept.len(), KEEP);
        assert_eq!(kept.first(), Some(&50));
        assert_eq!(kept.last(), Some(&(KEEP as u64 + 49)));
    }
}
