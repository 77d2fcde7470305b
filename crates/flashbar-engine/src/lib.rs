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
//!
//! # One name per concept
//!
//! Every crate uses these words, and these types, for these things:
//! - **plain decoding**: one target step per token ([`Mode::Plain`], `"ar"`
//!   on the wire); `speculation: off` asks for it and nothing else.
//! - **DFlash round**: draft a block, verify it in one target forward,
//!   commit the agreeing prefix plus the target's own token, roll back the
//!   rest ([`Mode::Dflash`]; `docs/dflash.md`).
//! - **speculation**: what a request asks for ([`Speculation`]: `auto`,
//!   `dflash`, `off`); the **gate** ([`policy::gate`]) decides `auto`.
//! - **accept length**: tokens a round commits (accepted drafts + 1);
//!   [`Totals::mean_accept_len`] averages it over all rounds, a plain step
//!   counting as a round of 1.
//! - **speedup**: a DFlash round's committed tokens x the warm plain step
//!   time / its time ([`RoundStats::speedup`], the gate's figure);
//!   **tokens/s**: [`RoundStats::tokens_per_second`] per round,
//!   [`Totals::tokens_per_second`] over a generation's decode time.
//! - **sink**: what receives a generation as it runs ([`Sink`]); an
//!   **observer** is a second sink a worker job is teed to ([`Observer`],
//!   [`Tee`]): the app's chat and metrics panel.
//! - **cancel token**: [`CancelToken`], the one type for generations and
//!   downloads (the hub crate re-exports it).
//! - **worker**, **job**, **event**: the engine thread, one queued
//!   generation on it, and what the job reports ([`worker::Event`]).
//! - **reasoning**: what a thinking model writes inside `<think>` ...
//!   `</think>`, split from the **answer** (content) as it streams
//!   ([`reasoning::ReasoningSplitter`], [`Commit::reasoning`],
//!   [`Generation::reasoning`], [`Totals::reasoning_tokens`]; the API's
//!   `reasoning_content`; `docs/thinking-and-tools.md`).
//! - **doctor finding**: one check's outcome on a model folder or a pair
//!   ([`doctor::Finding`]; the hub's `doctor::Finding` adds a status).

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
pub mod reasoning;
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
