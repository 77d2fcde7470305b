//! Downloading a catalogue pair (its target, then its default drafter)
//! with the hub crate: one progress stream over both models (bytes, speed,
//! ETA), cancel from the UI, and resume by starting it again (the hub crate
//! continues each file from its `.incomplete` part and checks sha256).

use flashbar_hub::{CancelToken, CatalogueEntry, HubConfig, HubError, PullEvent};
use serde::Serialize;

/// A download's phase.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
#[ts(rename = "DownloadPhase")]
pub enum Phase {
    #[default]
    Starting,
    Running,
    Done,
    Cancelled,
    Failed,
}

/// Where a pair's download stands: the payload of `models:download`.
#[derive(Clone, Debug, Default, Serialize, PartialEq, ts_rs::TS)]
pub struct DownloadState {
    pub pair: String,
    pub state: Phase,
    /// The file being fetched.
    pub file: String,
    /// Over both models, files already on disk included.
    #[ts(type = "number")]
    pub done_bytes: u64,
    #[ts(type = "number")]
    pub total_bytes: u64,
    pub bytes_per_second: f64,
    /// None until a speed is known.
    pub eta_seconds: Option<f64>,
    pub error: Option<String>,
}

impl DownloadState {
    pub fn new(pair: &str, state: Phase) -> Self {
        DownloadState {
            pair: pair.to_owned(),
            state,
            ..DownloadState::default()
        }
    }
}

/// Fetches what of `pair` lives on the hub into `config`'s store, calling
/// `report` as bytes arrive; an embedded pair has nothing to fetch.
pub async fn pull_pair(
    config: &HubConfig,
    pair: &CatalogueEntry,
    report: &(dyn Fn(DownloadState) + Send + Sync),
    cancel: &CancelToken,
) -> Result<(), HubError> {
    let requests: Vec<_> = std::iter::once(&pair.target)
        .chain(pair.drafters.first())
        .filter_map(|spec| spec.pull_request())
        .collect();
    // Exact sizes first, so one bar covers both models.
    let mut plans = Vec::with_capacity(requests.len());
    for request in &requests {
        let plan = tokio::select! {
            _ = cancel.cancelled() => return Err(HubError::Cancelled),
            plan = flashbar_hub::plan(config, request) => plan?,
        };
        plans.push(plan);
    }
    let total: u64 = plans.iter().map(|p| p.total_bytes).sum();
    let present: u64 = plans.iter().map(|p| p.present_bytes).sum();
    report(progress(&pair.id, "", present, total, 0.0));
    let mut offset = 0;
    for (request, plan) in requests.iter().zip(&plans) {
        let on_event = |event: &PullEvent| {
            if let PullEvent::Progress(p) = event {
                report(progress(
                    &pair.id,
                    &p.file,
                    offset + p.done_bytes,
                    total,
                    p.bytes_per_second,
                ));
            }
        };
        flashbar_hub::pull(config, request, &on_event, cancel).await?;
        offset += plan.total_bytes;
    }
    Ok(())
}

/// A running state, with the ETA over everything left (not just one model).
fn progress(pair: &str, file: &str, done: u64, total: u64, speed: f64) -> DownloadState {
    DownloadState {
        file: file.to_owned(),
        done_bytes: done,
        total_bytes: total,
        bytes_per_second: speed,
        eta_seconds: (speed > 0.0).then(|| total.saturating_sub(done) as f64 / speed),
        ..DownloadState::new(pair, Phase::Running)
    }
}

/// The last state of a download that ended with `result`.
pub fn finished(last: DownloadState, result: &Result<(), HubError>) -> DownloadState {
    let (state, error) = match result {
        Ok(()) => (Phase::Done, None),
        Err(HubError::Cancelled) => (Phase::Cancelled, None),
        Err(e) => (Phase::Failed, Some(e.to_string())),
    };
    let done_bytes = if state == Phase::Done {
        last.total_bytes
    } else {
        last.done_bytes
    };
    DownloadState {
        state,
        error,
        done_bytes,
        bytes_per_second: 0.0,
        eta_seconds: None,
        ..last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eta_covers_everything_left() {
        let p = progress("p", "model.safetensors", 250, 1250, 100.0);
        assert_eq!(p.state, Phase::Running);
        assert_eq!(p.eta_seconds, Some(10.0));
        assert_eq!(progress("p", "", 0, 10, 0.0).eta_seconds, None);
    }

    #[test]
    fn a_finished_download_says_how() {
        let last = progress("p", "f", 40, 100, 5.0);
        let done = finished(last.clone(), &Ok(()));
        assert_eq!(
            (done.state, done.done_bytes, done.eta_seconds),
            (Phase::Done, 100, None)
        );
        let cancelled = finished(last.clone(), &Err(HubError::Cancelled));
        assert_eq!(
            (cancelled.state, cancelled.done_bytes),
            (Phase::Cancelled, 40)
        );
        let failed = finished(last, &Err(HubError::Invalid("bad repo".into())));
        assert_eq!(failed.state, Phase::Failed);
        assert!(failed.error.unwrap().contains("bad repo"));
    }

    #[tokio::test]
    async fn an_embedded_pair_has_nothing_to_fetch() {
        let pair = flashbar_hub::Catalogue::builtin()
            .pair("default")
            .cloned()
            .unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        let report = |s: DownloadState| seen.lock().unwrap().push(s);
        let config = HubConfig::from_env().with_endpoint("http://127.0.0.1:9");
        pull_pair(&config, &pair, &report, &CancelToken::new())
            .await
            .unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].done_bytes, seen[0].total_bytes), (0, 0));
    }
}
