//! Progress of a pull as plain serializable events, with a speed and ETA
//! estimate over a sliding window.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One thing that happened during a pull, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PullEvent {
    /// The file list is known; `to_download_bytes` excludes what is already on disk.
    Resolved {
        repo: String,
        revision: String,
        commit: String,
        files: usize,
        total_bytes: u64,
        to_download_bytes: u64,
    },
    /// A file starts (or resumes at `resumed_from`).
    FileStarted {
        file: String,
        size: u64,
        resumed_from: u64,
    },
    Progress(PullProgress),
    /// A fault; the file (empty: the repo listing) is tried again after `wait_ms`.
    Retrying {
        file: String,
        attempt: u32,
        wait_ms: u64,
        reason: String,
    },
    /// A file is complete and checked (`sha256` when the hub gave one).
    FileDone {
        file: String,
        size: u64,
        sha256_checked: bool,
    },
    /// Everything is in place.
    Done {
        snapshot: PathBuf,
    },
}

/// Bytes so far for the whole pull and the current file, speed, ETA.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PullProgress {
    pub file: String,
    pub file_bytes: u64,
    pub file_size: u64,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub bytes_per_second: f64,
    /// None until a speed is known.
    pub eta_seconds: Option<f64>,
}

/// Where a pull's events go.
pub type EventSink<'a> = &'a (dyn Fn(&PullEvent) + Send + Sync);

impl PullEvent {
    /// Writes the event to the log (docs/logging.md): a file's start at
    /// debug, the rest (retries too: the caller shows them) at info; the
    /// byte counts only go to the progress bar.
    pub fn log(&self) {
        match self {
            PullEvent::Progress(_) => {}
            PullEvent::FileStarted { .. } => tracing::debug!(event = ?self, "pull"),
            _ => tracing::info!(event = ?self, "pull"),
        }
    }
}

/// Counts bytes and turns them into throttled progress events.
pub(crate) struct Tracker<'a> {
    sink: EventSink<'a>,
    total: u64,
    done: u64,
    window: VecDeque<(Instant, u64)>,
    last_emit: Option<Instant>,
}

const WINDOW: Duration = Duration::from_secs(5);
const EMIT_EVERY: Duration = Duration::from_millis(100);

impl<'a> Tracker<'a> {
    pub fn new(sink: EventSink<'a>, total: u64, already: u64) -> Self {
        Tracker {
            sink,
            total,
            done: already,
            window: VecDeque::new(),
            last_emit: None,
        }
    }

    pub fn emit(&self, event: PullEvent) {
        event.log();
        (self.sink)(&event);
    }

    /// Bytes that arrived for `file`, now at `file_bytes` of `file_size`.
    pub fn advance(&mut self, bytes: u64, file: &str, file_bytes: u64, file_size: u64) {
        self.done += bytes;
        let now = Instant::now();
        self.window.push_back((now, self.done));
        while self
            .window
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > WINDOW)
        {
            self.window.pop_front();
        }
        let due = self
            .last_emit
            .is_none_or(|t| now.duration_since(t) >= EMIT_EVERY);
        if due || file_bytes == file_size {
            self.last_emit = Some(now);
            self.emit_progress(file, file_bytes, file_size);
        }
    }

    /// Bytes that must be fetched again (a restart or a corrupt file).
    pub fn rewind(&mut self, bytes: u64) {
        self.done = self.done.saturating_sub(bytes);
        self.window.clear();
    }

    fn emit_progress(&self, file: &str, file_bytes: u64, file_size: u64) {
        let speed = self.speed();
        let remaining = self.total.saturating_sub(self.done) as f64;
        let eta_seconds = (speed > 0.0).then(|| remaining / speed);
        self.emit(PullEvent::Progress(PullProgress {
            file: file.to_owned(),
            file_bytes,
            file_size,
            done_bytes: self.done,
            total_bytes: self.total,
            bytes_per_second: speed,
            eta_seconds,
        }));
    }

    fn speed(&self) -> f64 {
        match (self.window.front(), self.window.back()) {
            (Some((t0, b0)), Some((t1, b1))) if t1 > t0 => {
                (b1 - b0) as f64 / t1.duration_since(*t0).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}
