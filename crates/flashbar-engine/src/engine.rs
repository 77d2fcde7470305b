//! The engine: a loaded model and tokenizer, and the decoding loop.

use crate::chat_template;
use crate::emit::Emitter;
use crate::error::{EngineError, Result};
use crate::proposer::{DflashProposer, Proposer};
use crate::request::{CancelToken, GenerateRequest, Prompt, Speculation};
use crate::sampling::SamplingParams;
use crate::sink::{FinishReason, Generation, Mode, RoundStats, Sink, Totals};
use crate::speculative::Speculative;
use crate::tokenizer::TextTokenizer;
use flashbar_models::{Drafter, LayerCache, Model};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use std::path::Path;
use std::time::Instant;

pub struct Engine {
    model: Model,
    drafter: Option<Drafter>,
    tokenizer: TextTokenizer,
}

impl Engine {
    /// Loads a target checkpoint folder and optionally its DFlash drafter
    /// (both validated before allocating; a drafter that does not fit the
    /// target is refused with the reason).
    pub fn load(target_dir: &Path, drafter_dir: Option<&Path>) -> Result<Self> {
        let model = Model::load(target_dir)?;
        let drafter = match drafter_dir {
            Some(dir) => Some(Drafter::load(dir, &model).map_err(EngineError::Drafter)?),
            None => None,
        };
        let tokenizer = TextTokenizer::load(target_dir)?;
        let vocab = model.config().text.vocab_size;
        if tokenizer.vocab_size() > vocab {
            return Err(EngineError::Tokenizer(format!(
                "the tokenizer has {} tokens but the model only {vocab}",
                tokenizer.vocab_size()
            )));
        }
        Ok(Engine {
            model,
            drafter,
            tokenizer,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn drafter(&self) -> Option<&Drafter> {
        self.drafter.as_ref()
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// Longest sequence (prompt + completion) the model takes.
    pub fn context_length(&self) -> usize {
        self.model.config().text.max_position_embeddings
    }

    /// Token ids of a prompt, through the chat template for messages.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let text = match prompt {
            Prompt::Text(text) => text.clone(),
            Prompt::Messages(messages) => {
                let template = self.tokenizer.chat_template().ok_or_else(|| {
                    EngineError::InvalidRequest("this model has no chat template".into())
                })?;
                chat_template::render(template, messages, true)?
            }
        };
        self.tokenizer.encode(&text)
    }

    pub fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
        cancel: &CancelToken,
    ) -> Result<Generation> {
        let drafter = match (request.speculation, &self.drafter) {
            (Speculation::Off, _) | (Speculation::Auto, None) => None,
            (_, Some(drafter)) => Some(drafter),
            (Speculation::Dflash, None) => {
                return Err(EngineError::InvalidRequest(
                    "speculation \"dflash\" needs a drafter, and none is loaded".into(),
                ))
            }
        };
        match drafter {
            Some(drafter) => {
                self.generate_speculative(request, &mut DflashProposer::new(drafter), sink, cancel)
            }
            None => {
                let (prompt, max_tokens) = self.prepare(request)?;
                self.decode_plain(&prompt, max_tokens, request, sink, cancel)
            }
        }
    }

    /// The draft-verify loop with any [`Proposer`] (the DFlash drafter, or a
    /// test's proposer with known drafts).
    pub fn generate_speculative(
        &self,
        request: &GenerateRequest,
        proposer: &mut dyn Proposer,
        sink: &mut dyn Sink,
        cancel: &CancelToken,
    ) -> Result<Generation> {
        let (prompt, max_tokens) = self.prepare(request)?;
        let block_size = request
            .block_size
            .unwrap_or_else(|| proposer.max_block_size());
        if block_size < 1 {
            return Err(EngineError::InvalidRequest(
                "block_size must be at least 1".into(),
            ));
        }
        Speculative {
            model: &self.model,
            tokenizer: &self.tokenizer,
            proposer,
            block_size,
        }
        .generate(&prompt, max_tokens, request, sink, cancel)
    }

    /// Validates a request: its prompt ids and the tokens it may generate.
    fn prepare(&self, request: &GenerateRequest) -> Result<(Vec<u32>, usize)> {
        request
            .sampling
            .validate()
            .map_err(EngineError::InvalidRequest)?;
        let prompt = self.prompt_ids(&request.prompt)?;
        let context = self.context_length();
        if prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if prompt.len() >= context {
            return Err(EngineError::InvalidRequest(format!(
                "the prompt has {} tokens; the model's context is {context}",
                prompt.len()
            )));
        }
        if request.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        let max_tokens = request.max_tokens.min(context - prompt.len());
        Ok((prompt, max_tokens))
    }

    /// Plain autoregressive decoding: one target step per token. Greedy
    /// tokens stay on the device, so the next step is queued before the
    /// current token is read back (host and device work overlap).
    fn decode_plain(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
        cancel: &CancelToken,
    ) -> Result<Generation> {
        let sampling = &request.sampling;
        let mut cache = self.model.new_cache();
        let mut emitter = Emitter::new(&self.tokenizer, request.stop.clone());
        let started = Instant::now();
        let logits = self.last_logits(prompt, &mut cache)?;
        let mut pending = choose(&logits, sampling, prompt.len() as u64)?;

        let mut first_token_at = None;
        let mut last_token_at = started;
        let mut finish = FinishReason::Length;
        for step in 0..max_tokens {
            if cancel.is_cancelled() {
                finish = FinishReason::Cancelled;
                break;
            }
            let position = (prompt.len() + step + 1) as u64;
            let more = step + 1 < max_tokens;
            let queued = match (&pending, more) {
                (Pending::Device(token), true) => {
                    let logits = self.last_logits_of(&token.reshape(&[1, 1])?, &mut cache)?;
                    Some(choose(&logits, sampling, position)?)
                }
                _ => None,
            };
            let token = pending.resolve()?;
            let now = Instant::now();
            let round_ms = (now - last_token_at).as_secs_f64() * 1e3;
            last_token_at = now;
            first_token_at.get_or_insert(now);
            if let Some(reason) = emitter.commit(token, false, sink)? {
                finish = reason;
                break;
            }
            sink.round(&RoundStats {
                mode: Mode::Ar,
                block_size: 1,
                accepted: 0,
                committed: 1,
                draft_ms: 0.0,
                verify_ms: round_ms,
                rollback_ms: 0.0,
            });
            pending = match queued {
                Some(next) => next,
                None if more => {
                    let logits = self.last_logits(&[token], &mut cache)?;
                    choose(&logits, sampling, position)?
                }
                None => break,
            };
        }
        if finish != FinishReason::Stop {
            emitter.flush(sink)?;
        }
        let completion = emitter.ids.len();
        let first = first_token_at.unwrap_or(last_token_at);
        // As mlx-lm counts: prompt time runs to the first token, decode speed
        // over the tokens after it.
        let prompt_seconds = (first - started).as_secs_f64();
        let decode_seconds = (last_token_at - first).as_secs_f64();
        Ok(Generation {
            text: emitter.text,
            token_ids: emitter.ids,
            finish_reason: finish,
            stats: Totals {
                mode: Some(Mode::Ar),
                prompt_tokens: prompt.len(),
                completion_tokens: completion,
                rounds: completion,
                accepted_tokens: 0,
                mean_accept_len: if completion > 0 { 1.0 } else { 0.0 },
                prompt_seconds,
                decode_seconds,
                tokens_per_second: if completion > 1 && decode_seconds > 0.0 {
                    (completion - 1) as f64 / decode_seconds
                } else {
                    0.0
                },
            },
        })
    }

    /// Runs `ids` through the model; the logits `[vocab]` of the last one.
    fn last_logits(&self, ids: &[u32], cache: &mut [LayerCache]) -> Result<Array> {
        self.last_logits_of(&Array::from_slice(ids, &[1, ids.len() as i32]), cache)
    }

    fn last_logits_of(&self, input: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        Ok(self.model.forward(input, cache)?.index((0, -1)))
    }
}

/// The next token: still on the device (greedy), or already on the host.
enum Pending {
    Device(Array),
    Host(u32),
}

impl Pending {
    fn resolve(&self) -> Result<u32> {
        match self {
            Pending::Device(token) => token.try_item_exact::<u32>().map_err(mlx_error),
            Pending::Host(id) => Ok(*id),
        }
    }
}

/// Greedy picks on the device (evaluated asynchronously); sampling copies the
/// logits to the host and draws with the position's key.
fn choose(logits: &Array, sampling: &SamplingParams, position: u64) -> Result<Pending> {
    if sampling.is_greedy() {
        let token = argmax_axis(logits, -1, false)?.as_dtype(mlx_rs::Dtype::Uint32)?;
        mlx_rs::transforms::async_eval([&token])?;
        return Ok(Pending::Device(token));
    }
    let host = logits.as_dtype(mlx_rs::Dtype::Float32)?;
    host.eval()?;
    let values = host.try_as_slice::<f32>().map_err(mlx_error)?;
    Ok(Pending::Host(sampling.sample(values, position)))
}

pub(crate) fn mlx_error(error: impl std::fmt::Display) -> EngineError {
    EngineError::Mlx(mlx_rs::error::Exception::custom(error.to_string()))
}
