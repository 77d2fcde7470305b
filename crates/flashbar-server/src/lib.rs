//! Flashbar's local OpenAI-compatible HTTP endpoint.
//!
//! The engine's [`Worker`] (one thread owning the loaded model, a bounded
//! queue served in arrival order) runs the generations; a [`Server`] (axum) answers
//! `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`
//! (whole or streamed as server-sent events) and `GET /health`, with
//! OpenAI error objects, an optional API key and optional CORS.
//!
//! Modules: [`api`] (wire types), [`convert`] (request checks), [`routes`], [`sse`], [`auth`], [`cors`],
//! [`error`], [`server`] (start / stop), [`listen`] (connections),
//! [`limits`] and [`body`] (what a client may cost), [`memory`] (MLX's
//! counters for `/health`), [`request_log`] (one log line per request).

pub mod api;
pub mod auth;
pub mod body;
pub mod convert;
pub mod cors;
pub mod error;
pub mod limits;
pub mod listen;
pub mod memory;
pub mod request_log;
pub mod routes;
pub mod server;
pub mod sse;
pub mod tool_calls;

#[cfg(test)]
mod hardening_tests;
#[cfg(test)]
mod request_log_tests;
#[cfg(test)]
mod thinking_tools_tests;

pub use error::ApiError;
pub use limits::Limits;
pub use routes::ObserveRequests;
pub use server::{Server, ServerError, ServerOptions};

/// The default port: unused by other local-LLM apps (LM Studio 1234,
/// Ollama 11434, Jan 1337, oMLX 8000).
pub const DEFAULT_PORT: u16 = 8731;

/// The default host: this machine only.
pub const DEFAULT_HOST: &str = "127.0.0.1";
