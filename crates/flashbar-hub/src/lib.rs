//! Flashbar's model manager: the catalogue of target/drafter pairs, fault
//! tolerant downloads from the Hugging Face hub (or a mirror), the local store
//! (the standard HF cache layout, so models fetched by other tools are found),
//! and the doctor that says whether a pair can run here.
//!
//! The download API is async (tokio). A caller without a runtime uses
//! [`blocking`], which runs the same code on a private runtime. Progress is a
//! stream of plain serde-serializable [`PullEvent`]s handed to a callback;
//! cancellation is a [`CancelToken`] the caller keeps.
//!
//! ```no_run
//! use flashbar_hub::{blocking, Catalogue, CancelToken, HubConfig, PullEvent};
//!
//! let config = HubConfig::from_env(); // HF_ENDPOINT, HF_TOKEN, HF_HOME...
//! let pair = Catalogue::builtin().pair("qwen3.5-9b-4bit").unwrap().clone();
//! let request = pair.target.pull_request().unwrap();
//! let plan = blocking::plan(&config, &request).unwrap(); // exact sizes, nothing fetched
//! println!("{} bytes, {} already here", plan.total_bytes, plan.present_bytes);
//! let cancel = CancelToken::new(); // clone it; .cancel() from any thread
//! let on_event = |event: &PullEvent| println!("{}", serde_json::to_string(event).unwrap());
//! let pulled = blocking::pull(&config, &request, &on_event, &cancel).unwrap();
//! let report = flashbar_hub::doctor::diagnose(&pulled.snapshot, None);
//! println!("usable: {}", report.ok());
//! for repo in config.store.list().unwrap() {
//!     println!("{} {} bytes", repo.repo, repo.size_bytes);
//! }
//! ```

pub mod blocking;
pub mod catalogue;
pub mod config;
pub mod disk;
pub mod doctor;
mod download;
pub mod error;
pub mod files;
mod lock;
pub mod memory;
pub mod progress;
mod pull;
mod remote;
pub mod resolve;
mod retry;
pub mod store;

pub use catalogue::{Catalogue, CatalogueEntry, RepoSpec};
pub use config::HubConfig;
pub use error::HubError;
pub use files::RemoteFile;
pub use progress::{PullEvent, PullProgress};
pub use pull::{plan, pull, PullPlan, PullRequest, PulledRepo};
pub use resolve::{Pair, Resolver};
pub use store::{LocalRepo, LocalSnapshot, Store};

/// Cancels a pull from any thread; a cancelled pull keeps its partial files,
/// so the next pull of the same repo resumes them.
pub use flashbar_engine::CancelToken;
