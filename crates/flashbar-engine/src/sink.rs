//! What a generation reports while it runs: the engine pushes into a [`Sink`]
//! that the app, the server and the CLI each implement.

use crate::policy::gate::GateState;
use crate::policy::thermal::ThermalState;
use serde::Serialize;

/// How a round produced its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Plain autoregressive decoding: one target step, one token.
    Ar,
    /// A drafted block verified by the target.
    Dflash,
}

/// One decoding round.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoundStats {
    pub mode: Mode,
    /// Tokens proposed (1 for AR).
    pub block_size: usize,
    /// Drafted tokens the target accepted (0 for AR).
    pub accepted: usize,
    /// Tokens committed this round.
    pub committed: usize,
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub rollback_ms: f64,
    /// DFlash rounds: committed tokens x warm plain step time / round time
    /// (None until plain decoding has been timed).
    pub speedup: Option<f64>,
    /// The speedup gate's state after this round (None: speculation not gated).
    pub gate: Option<GateState>,
    pub thermal: ThermalState,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller cancelled.
    Cancelled,
}

/// Receives a generation's output as it happens.
pub trait Sink {
    /// A text delta, always whole UTF-8 characters, stop sequences excluded.
    fn text(&mut self, _delta: &str) {}
    /// A committed token; `from_draft` when a draft proposed it.
    fn token(&mut self, _id: u32, _from_draft: bool) {}
    /// One per decoding round.
    fn round(&mut self, _stats: &RoundStats) {}
}

/// A sink that keeps nothing, for callers that only want the final result.
pub struct NullSink;

impl Sink for NullSink {}

/// The outcome of one generation.
#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: Totals,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    pub mode: Option<Mode>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub rounds: usize,
    pub accepted_tokens: usize,
    pub mean_accept_len: f64,
    pub prompt_seconds: f64,
    pub decode_seconds: f64,
    pub tokens_per_second: f64,
}
