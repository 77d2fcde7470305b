//! The pull API for callers without an async runtime: the same code on a
//! private single-threaded tokio runtime. Cancel from another thread with the
//! [`CancelToken`](crate::CancelToken).

use crate::config::HubConfig;
use crate::error::HubError;
use crate::progress::PullEvent;
use crate::pull::{PullPlan, PullRequest, PulledRepo};
use crate::CancelToken;
use std::future::Future;

/// [`crate::pull`], blocking the calling thread.
pub fn pull(
    config: &HubConfig,
    request: &PullRequest,
    on_event: &(dyn Fn(&PullEvent) + Send + Sync),
    cancel: &CancelToken,
) -> Result<PulledRepo, HubError> {
    block_on(crate::pull(config, request, on_event, cancel))
}

/// [`crate::plan`], blocking the calling thread.
pub fn plan(config: &HubConfig, request: &PullRequest) -> Result<PullPlan, HubError> {
    block_on(crate::plan(config, request))
}

fn block_on<T>(future: impl Future<Output = Result<T, HubError>>) -> Result<T, HubError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(HubError::Invalid(
            "flashbar_hub::blocking was called inside an async runtime; await the async API instead"
                .into(),
        ));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HubError::Invalid(format!("cannot start a runtime: {e}")))?;
    runtime.block_on(future)
}
