//! A stand-in model for tests of the worker and of what stands on it (the
//! HTTP server): it echoes one word per token, `w0 w1 ...`, slowly when
//! asked, and checks requests the way the engine does (a context of 64
//! tokens, one per prompt word; no drafter). Built for this crate's tests
//! and, with the `echo` feature, for other crates' tests.

use super::{Backend, Worker};
use crate::error::EngineError;
use crate::request::{GenerateRequest, Prompt, Speculation};
use crate::sink::{Begin, Commit, FinishReason, Generation, Sink, Totals};
use std::time::Duration;

/// The stand-in's context, in tokens.
pub const ECHO_CONTEXT: usize = 64;

pub struct EchoBackend {
    /// Time per token.
    pub delay: Duration,
}

impl Backend for EchoBackend {
    fn context_length(&self) -> usize {
        ECHO_CONTEXT
    }

    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Generation, EngineError> {
        let (field, prompt_tokens) = match &request.prompt {
            Prompt::Text(text) => ("prompt", text.split_whitespace().count()),
            Prompt::Messages(messages) => ("messages", messages.len()),
        };
        if request.speculation == Speculation::Dflash {
            return Err(EngineError::InvalidParam {
                param: "speculation",
                message: "speculation \"dflash\" needs a drafter, and none is loaded".into(),
            });
        }
        if prompt_tokens >= ECHO_CONTEXT {
            return Err(EngineError::InvalidParam {
                param: field,
                message: format!(
                    "the prompt has {prompt_tokens} tokens; the model's context is {ECHO_CONTEXT}"
                ),
            });
        }
        let mut text = String::new();
        let mut ids = Vec::new();
        let mut finish = FinishReason::Length;
        if !sink.begin(&Begin { prompt_tokens }) {
            finish = FinishReason::Cancelled;
        }
        for i in 0..request.max_tokens {
            if finish != FinishReason::Length {
                break;
            }
            std::thread::sleep(self.delay);
            let word = format!("w{i} ");
            text.push_str(&word);
            ids.push(i as u32);
            let go_on = sink.commit(&Commit {
                token: Some(i as u32),
                from_draft: i % 2 == 1,
                text: &word,
            });
            if !go_on {
                finish = FinishReason::Cancelled;
            }
        }
        let generation = Generation {
            stats: Totals {
                prompt_tokens,
                completion_tokens: ids.len(),
                ..Totals::default()
            },
            text,
            token_ids: ids,
            finish_reason: finish,
        };
        sink.finish(&generation);
        Ok(generation)
    }
}

/// A worker over the stand-in: `capacity` requests may wait, each token
/// takes `delay_ms`.
pub fn echo_worker(capacity: usize, delay_ms: u64) -> Worker {
    let spawned = Worker::spawn(capacity, move || {
        Ok::<_, EngineError>(EchoBackend {
            delay: Duration::from_millis(delay_ms),
        })
    });
    match spawned {
        Ok(worker) => worker,
        Err(error) => unreachable!("the stand-in always loads: {error}"),
    }
}
