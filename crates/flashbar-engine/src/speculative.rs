//! The draft-verify loop ("DFlash loop" in DESIGN.md). Lossless: every
//! committed token is the target's own choice at its position (argmax, or
//! the position-keyed sample), so the output equals plain decoding's.

use crate::emit::Emitter;
use crate::error::Result;
use crate::proposer::Proposer;
use crate::request::{CancelToken, GenerateRequest};
use crate::sampling::SamplingParams;
use crate::sink::{FinishReason, Generation, Mode, RoundStats, Sink, Totals};
use crate::tokenizer::TextTokenizer;
use flashbar_models::Model;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use std::time::Instant;

pub(crate) struct Speculative<'a> {
    pub model: &'a Model,
    pub tokenizer: &'a TextTokenizer,
    pub proposer: &'a mut dyn Proposer,
    /// Tokens per verify (last token + drafts), capped by the proposer.
    pub block_size: usize,
}

impl Speculative<'_> {
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
        cancel: &CancelToken,
    ) -> Result<Generation> {
        let model = self.model;
        let sampling = &request.sampling;
        let taps = self.proposer.tap_layers().to_vec();
        let block_size = self.block_size.clamp(1, self.proposer.max_block_size());
        let mut cache = model.new_cache();
        let mut emitter = Emitter::new(self.tokenizer, request.stop.clone());
        let started = Instant::now();

        // 1. Prefill with taps; the first token is the target's.
        let input = Array::from_slice(prompt, &[1, prompt.len() as i32]);
        let (logits, mut context) = model.forward_with_taps(&input, &mut cache, &taps)?;
        let mut last = choose_all(&logits.index((.., -1..)), sampling, prompt.len())?[0];
        let first_token_at = Instant::now();
        let mut finish = emitter.commit(last, false, sink)?;
        let mut generated = 1;
        let (mut rounds, mut accepted_total) = (0, 0);

        while finish.is_none() && generated < max_tokens {
            if cancel.is_cancelled() {
                finish = Some(FinishReason::Cancelled);
                break;
            }
            // 2. Draft, then verify [last, drafts] in one forward.
            let drafts_wanted = block_size.min(max_tokens - generated) - 1;
            let clock = Instant::now();
            let drafts = if drafts_wanted > 0 {
                let d = self
                    .proposer
                    .propose(model, last, &context, drafts_wanted, generated)?;
                d.eval()?;
                Some(d)
            } else {
                None
            };
            let draft_ms = ms_since(clock);
            let clock = Instant::now();
            let last_array = Array::from_slice(&[last], &[1, 1]);
            let input = match &drafts {
                Some(d) => concatenate(&[&last_array, d], 1)?,
                None => last_array,
            };
            let (logits, verify_taps, tape) = model.verify(&input, &mut cache, &taps)?;
            let chosen = choose_all(&logits, sampling, prompt.len() + generated)?;
            let drafted = match &drafts {
                Some(d) => host_u32(d)?,
                None => Vec::new(),
            };
            let verify_ms = ms_since(clock);

            // 3. The longest agreeing prefix, plus the target's own next token.
            let accepted = drafted
                .iter()
                .zip(&chosen)
                .take_while(|(d, c)| d == c)
                .count();
            // 4. Commit one at a time: EOS, a stop sequence or max_tokens
            // inside the block ends it before anything past shows.
            let mut committed = 0;
            for (i, &token) in chosen[..=accepted].iter().enumerate() {
                finish = emitter.commit(token, i < accepted, sink)?;
                committed += 1;
                generated += 1;
                if finish.is_some() || generated >= max_tokens {
                    break;
                }
            }
            last = chosen[accepted];

            // 5. Keep [last, accepted drafts] in the target cache and give the
            // drafter only their taps.
            let clock = Instant::now();
            model.rollback(&mut cache, &tape, accepted + 1)?;
            context = verify_taps.index((.., ..(accepted as i32 + 1)));
            let rollback_ms = ms_since(clock);
            rounds += 1;
            accepted_total += accepted;
            sink.round(&RoundStats {
                mode: Mode::Dflash,
                block_size: drafted.len() + 1,
                accepted,
                committed,
                draft_ms,
                verify_ms,
                rollback_ms,
            });
        }
        let finish = finish.unwrap_or(FinishReason::Length);
        if finish != FinishReason::Stop {
            emitter.flush(sink)?;
        }
        let done = Instant::now();
        let completion = emitter.ids.len();
        let decode_seconds = (done - first_token_at).as_secs_f64();
        let round_tokens = generated - 1;
        Ok(Generation {
            text: emitter.text,
            token_ids: emitter.ids,
            finish_reason: finish,
            stats: Totals {
                mode: Some(Mode::Dflash),
                prompt_tokens: prompt.len(),
                completion_tokens: completion,
                rounds,
                accepted_tokens: accepted_total,
                mean_accept_len: if rounds > 0 {
                    round_tokens as f64 / rounds as f64
                } else {
                    0.0
                },
                prompt_seconds: (first_token_at - started).as_secs_f64(),
                decode_seconds,
                tokens_per_second: if completion > 1 && decode_seconds > 0.0 {
                    (completion - 1) as f64 / decode_seconds
                } else {
                    0.0
                },
            },
        })
    }
}

/// The target's choice at every row of `logits` `[1, n, vocab]`; row i is
/// the token at absolute position `first_position + i` (the sampling key).
/// Greedy picks on the device, as plain decoding does, so ties break alike.
fn choose_all(
    logits: &Array,
    sampling: &SamplingParams,
    first_position: usize,
) -> Result<Vec<u32>> {
    if sampling.is_greedy() {
        return host_u32(&argmax_axis(logits, -1, false)?.as_dtype(Dtype::Uint32)?);
    }
    let rows = logits.shape()[1];
    let host = logits.index(0).as_dtype(Dtype::Float32)?;
    host.eval()?;
    let values = host
        .try_as_slice::<f32>()
        .map_err(crate::engine::mlx_error)?;
    let vocab = values.len() / rows as usize;
    Ok(values
        .chunks(vocab)
        .enumerate()
        .map(|(i, row)| sampling.sample(row, (first_position + i) as u64))
        .collect())
}

fn host_u32(array: &Array) -> Result<Vec<u32>> {
    let array = array.as_dtype(Dtype::Uint32)?.flatten(None, None)?;
    array.eval()?;
    Ok(array
        .try_as_slice::<u32>()
        .map_err(crate::engine::mlx_error)?
        .to_vec())
}

fn ms_since(clock: Instant) -> f64 {
    clock.elapsed().as_secs_f64() * 1e3
}
