//! Text generation over Flashbar's models.
//!
//! [`Engine::load`] a checkpoint, then [`Engine::generate`] a
//! [`GenerateRequest`] into a [`Sink`]: one [`Commit`] per token (its id,
//! origin and the text it released) and one [`RoundStats`] per decoding
//! round, each answered with whether to go on; the returned [`Generation`]
//! carries the finish reason and totals.
//!
//! Modules: tokenizer and chat template; sampling (position-keyed, so
//! speculative paths can reproduce it); stop rules and UTF-8-safe streaming;
//! the decoding loop (plain steps and DFlash draft-verify rounds, mixed as
//! the [`policy`] gate decides), with the [`proposer`] that supplies drafts;
//! [`verify_cost`], the measure that caps any DFlash speedup; and the
//! [`worker`]: the one thread that owns a loaded engine and runs queued
//! generations in arrival order, which the app, the HTTP server and the
//! CLI's `serve` all submit to.

pub mod chat_template;
mod choose;
mod decoding;
pub mod detokenize;
pub mod doctor;
mod emit;
pub mod engine;
pub mod error;
pub mod policy;
pub mod proposer;
pub mod request;
pub mod sampling;
pub mod sink;
pub mod stop;
pub mod tokenizer;
pub mod verify_cost;
pub mod worker;

pub use chat_template::Message;
pub use engine::Engine;
pub use error::{EngineError, Result};
pub use request::{CancelToken, GenerateRequest, Prompt, Speculation};
pub use sampling::SamplingParams;
pub use sink::{
    Begin, Commit, FinishReason, Generation, Mode, NullSink, RoundStats, Sink, Tee, Totals,
};
pub use worker::{Activity, Backend, Event, Observer, Worker, DEFAULT_QUEUE_CAPACITY};
