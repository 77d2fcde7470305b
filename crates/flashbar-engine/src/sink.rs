//! What a generation reports while it runs: the engine pushes into a [`Sink`]
//! that the app, the server and the CLI each implement.

use crate::policy::gate::GateState;
use crate::policy::thermal::ThermalState;
use serde::Serialize;
use ts_rs::TS;

/// How a round produced its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Plain decoding: one target step, one token ("ar" on the wire).
    #[serde(rename = "ar")]
    Plain,
    /// A drafted block verified by the target.
    Dflash,
}

impl Mode {
    /// Its name on the wire and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "ar",
            Mode::Dflash => "dflash",
        }
    }
}

/// One decoding round.
#[derive(Clone, Debug, PartialEq, Serialize, TS)]
pub struct RoundStats {
    pub mode: Mode,
    /// Tokens proposed (1 for AR).
    pub block_size: usize,
    /// Drafted tokens the target accepted (0 for AR).
    pub accepted: usize,
    /// Tokens committed this round.
    pub committed: usize,
    /// The host's time to build and queue the draft; the device drafts
    /// while the verify is built, so its time falls into `verify_ms`
    /// (the drafter alone with `FLASHBAR_DRAFT_SYNC=1`).
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub rollback_ms: f64,
    /// The whole round, start to end (its parts and the host work between).
    pub round_ms: f64,
    /// Tokens committed per second of `round_ms`: the one definition of a
    /// round's speed (the metrics panel and the tray show it).
    pub tokens_per_second: f64,
    /// DFlash rounds: committed tokens x warm plain step time / round time
    /// (None until plain decoding has been timed; always None for plain
    /// rounds, which are plain decoding itself).
    pub speedup: Option<f64>,
    /// The speedup gate's state after this round (None: speculation not gated).
    pub gate: Option<GateState>,
    pub thermal: ThermalState,
}

/// Tokens per second of `ms` (0 for a round that took no measurable time).
pub(crate) fn per_second(tokens: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        tokens as f64 * 1e3 / ms
    } else {
        0.0
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller cancelled.
    Cancelled,
}

/// What a generation is about to do, sent once before its first token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begin {
    /// The prompt's length after the chat template and the tokenizer.
    pub prompt_tokens: usize,
}

/// One committed token and the text it released, as the engine knows them
/// at one moment: a thinking model's reasoning and its answer apart
/// (`docs/thinking-and-tools.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit<'a> {
    /// The token; None for text held back (an unfinished UTF-8 character,
    /// a possible stop sequence) that is released when the generation ends.
    pub token: Option<u32>,
    /// A draft proposed this token and the target accepted it.
    pub from_draft: bool,
    /// Reasoning released: text inside the model's `<think>` block, tags
    /// and the newlines around them removed; empty for text prompts.
    pub reasoning: &'a str,
    /// Answer released: whole UTF-8 characters, stop sequences excluded;
    /// may be empty (the token's text is held back and comes with a later
    /// commit, or is reasoning).
    pub text: &'a str,
}

/// Receives a generation's output as it happens, in order: `begin`, one
/// `commit` per token (each followed, at the end of its round, by the
/// round's `round`), then `finish` on success. Each call but `finish`
/// returns whether to go on: `false` (a closed pipe, a client gone, a
/// cancel) stops the generation at the next token, with
/// [`FinishReason::Cancelled`]. The shape of ripgrep's `Sink`.
pub trait Sink {
    /// The request passed the engine's checks; generation begins.
    fn begin(&mut self, _begin: &Begin) -> bool {
        true
    }
    /// A committed token (or the final held-back text).
    fn commit(&mut self, _commit: &Commit) -> bool {
        true
    }
    /// One per decoding round, after its commits.
    fn round(&mut self, _stats: &RoundStats) -> bool {
        true
    }
    /// The generation ended without an error.
    fn finish(&mut self, _generation: &Generation) {}
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn begin(&mut self, begin: &Begin) -> bool {
        (**self).begin(begin)
    }
    fn commit(&mut self, commit: &Commit) -> bool {
        (**self).commit(commit)
    }
    fn round(&mut self, stats: &RoundStats) -> bool {
        (**self).round(stats)
    }
    fn finish(&mut self, generation: &Generation) {
        (**self).finish(generation)
    }
}

impl<S: Sink + ?Sized> Sink for Box<S> {
    fn begin(&mut self, begin: &Begin) -> bool {
        (**self).begin(begin)
    }
    fn commit(&mut self, commit: &Commit) -> bool {
        (**self).commit(commit)
    }
    fn round(&mut self, stats: &RoundStats) -> bool {
        (**self).round(stats)
    }
    fn finish(&mut self, generation: &Generation) {
        (**self).finish(generation)
    }
}

/// A sink that keeps nothing, for callers that only want the final result.
pub struct NullSink;

impl Sink for NullSink {}

/// Fan-out: both sinks see every event; the generation goes on while both
/// want it to.
pub struct Tee<A, B>(pub A, pub B);

impl<A: Sink, B: Sink> Sink for Tee<A, B> {
    fn begin(&mut self, begin: &Begin) -> bool {
        self.0.begin(begin) & self.1.begin(begin)
    }
    fn commit(&mut self, commit: &Commit) -> bool {
        self.0.commit(commit) & self.1.commit(commit)
    }
    fn round(&mut self, stats: &RoundStats) -> bool {
        self.0.round(stats) & self.1.round(stats)
    }
    fn finish(&mut self, generation: &Generation) {
        self.0.finish(generation);
        self.1.finish(generation);
    }
}

/// The outcome of one generation.
#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    /// The answer (without the reasoning).
    pub text: String,
    /// The reasoning: what the model wrote inside its `<think>` block.
    pub reasoning: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: Totals,
}

#[derive(Clone, Debug, Default, Serialize, TS)]
pub struct Totals {
    pub mode: Option<Mode>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Completion tokens inside the think block (its tags included).
    pub reasoning_tokens: usize,
    pub rounds: usize,
    /// Drafted tokens the target accepted, over all DFlash rounds.
    pub accepted_tokens: usize,
    /// Drafted tokens the target rejected, over all DFlash rounds.
    pub rejected_tokens: usize,
    pub mean_accept_len: f64,
    pub prompt_seconds: f64,
    pub decode_seconds: f64,
    pub tokens_per_second: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts commits and says stop at the `stop_at`-th.
    struct Counter {
        seen: usize,
        stop_at: Option<usize>,
    }

    impl Sink for Counter {
        fn commit(&mut self, _commit: &Commit) -> bool {
            self.seen += 1;
            self.stop_at != Some(self.seen)
        }
    }

    #[test]
    fn a_tee_shows_both_sinks_every_event_and_stops_when_either_says_so() {
        let commit = Commit {
            token: Some(7),
            from_draft: true,
            reasoning: "",
            text: "x",
        };
        let mut tee = Tee(
            Counter {
                seen: 0,
                stop_at: Some(2),
            },
            Counter {
                seen: 0,
                stop_at: None,
            },
        );
        assert!(tee.commit(&commit));
        assert!(!tee.commit(&commit));
        // The second sink saw the commit the first one stopped at.
        assert_eq!((tee.0.seen, tee.1.seen), (2, 2));
        assert!(tee.begin(&Begin { prompt_tokens: 3 }));
    }
}
