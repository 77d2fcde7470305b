//! What a DFlash verify costs next to one plain decode step. A round commits
//! at most `block` tokens for one verify, so `verify / decode` caps every
//! speedup speculation can give (docs/dflash.md, "Where the speed bound is").

use crate::choose::argmax_rows;
use crate::engine::Engine;
use crate::error::Result;
use flashbar_models::dflash_config::default_taps;
use flashbar_models::qwen3_5::cache_arrays;
use flashbar_models::{LayerCache, Outputs};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::Array;
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Serialize)]
pub struct VerifyCost {
    pub prompt_tokens: usize,
    pub block: usize,
    /// Medians, in milliseconds, each step evaluated to completion.
    pub decode_ms: f64,
    pub verify_ms: f64,
    /// A verify (with taps and tape) followed by a rollback to half the block.
    pub verify_rollback_ms: f64,
    /// verify_ms / decode_ms.
    pub ratio: f64,
    pub ratio_with_rollback: f64,
    /// Medians of the host's part: building each graph and queuing it on
    /// the device (`async_eval` returned). Where it is most of the total,
    /// the host bounds the step, not the device.
    pub decode_queued_ms: f64,
    pub verify_queued_ms: f64,
    /// Of the host's part, the medians of building the graph alone (our
    /// code and MLX's ops, before `async_eval`): the rest is MLX's queueing
    /// (each primitive's `eval_gpu` and its CUDA graph node).
    pub decode_built_ms: f64,
    pub verify_built_ms: f64,
    /// With a drafter: one draft of `block` tokens after `block` new
    /// context rows (a round after a whole block was accepted), and its
    /// host part.
    pub draft_ms: Option<f64>,
    pub draft_queued_ms: Option<f64>,
}

/// One timed sample: the host's time to build, to build and queue, and the
/// whole.
struct Sample {
    built_ms: f64,
    queued_ms: f64,
    total_ms: f64,
}

/// Builds the graph `build` returns, queues it, waits for it.
fn sample(build: impl FnOnce() -> Result<Vec<Array>>) -> Result<Sample> {
    let clock = Instant::now();
    let out = build()?;
    let built_ms = clock.elapsed().as_secs_f64() * 1e3;
    async_eval(&out)?;
    let queued_ms = clock.elapsed().as_secs_f64() * 1e3;
    eval(&out)?;
    Ok(Sample {
        built_ms,
        queued_ms,
        total_ms: clock.elapsed().as_secs_f64() * 1e3,
    })
}

/// Medians of each part over the samples.
fn medians(samples: Vec<Sample>) -> Sample {
    let median = |part: fn(&Sample) -> f64| {
        let mut values: Vec<f64> = samples.iter().map(part).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    Sample {
        built_ms: median(|s| s.built_ms),
        queued_ms: median(|s| s.queued_ms),
        total_ms: median(|s| s.total_ms),
    }
}

impl Engine {
    /// Times one decode step and one `block`-token verify (taps + tape)
    /// from the same `prompt_tokens`-token context, `repeats` times each
    /// after a warm-up.
    pub fn measure_verify_cost(
        &self,
        prompt_tokens: usize,
        block: usize,
        repeats: usize,
    ) -> Result<VerifyCost> {
        let model = self.model();
        let text = &model.config().text;
        let vocab = text.vocab_size as u32;
        let taps = match self.drafter() {
            Some(d) => d.config().target_layer_ids.clone(),
            None => default_taps(text.num_hidden_layers, 5)
                .into_iter()
                .filter(|&t| t < text.num_hidden_layers)
                .collect(),
        };
        let ids = |n: usize, from: usize| -> Vec<u32> {
            (from..from + n)
                .map(|i| (i as u32 * 7 + 3) % vocab)
                .collect()
        };
        let row = |v: Vec<u32>| Array::from_slice(&v, &[1, v.len() as i32]);
        let mut context = model.new_cache();
        let prefill = model.forward(
            &row(ids(prompt_tokens, 0)),
            &mut context,
            Outputs::ALL.tapping(&taps),
        )?;
        let mut ready: Vec<&Array> = cache_arrays(&context);
        ready.push(&prefill.logits);
        eval(ready)?;

        let decode = |cache: &mut Vec<LayerCache>| -> Result<Vec<Array>> {
            let logits = model
                .forward(&row(ids(1, prompt_tokens)), cache, Outputs::ALL)?
                .logits;
            let mut out: Vec<Array> = cache_arrays(cache).into_iter().cloned().collect();
            out.push(argmax_rows(&logits)?);
            Ok(out)
        };
        let verify = |cache: &mut Vec<LayerCache>, keep: Option<usize>| -> Result<Vec<Array>> {
            let verified = model.verify(&row(ids(block, prompt_tokens)), cache, &taps)?;
            let mut out = vec![argmax_rows(&verified.logits)?];
            out.extend(verified.taps.iter().cloned());
            out.extend(verified.tape.arrays().into_iter().cloned());
            if let Some(keep) = keep {
                // The rollback reads the tape, so the verify runs first.
                eval(&out)?;
                model.rollback(cache, &verified.tape, keep)?;
                out = cache_arrays(cache).into_iter().cloned().collect();
            }
            Ok(out)
        };
        let time = |f: &dyn Fn(&mut Vec<LayerCache>) -> Result<Vec<Array>>| -> Result<Sample> {
            for _ in 0..3 {
                let mut cache = context.clone(); // warm-up: kernels compile on first use
                sample(|| f(&mut cache))?;
            }
            let mut samples = Vec::with_capacity(repeats);
            for _ in 0..repeats.max(1) {
                let mut cache = context.clone();
                samples.push(sample(|| f(&mut cache))?);
            }
            Ok(medians(samples))
        };
        let decoded = time(&|c| decode(c))?;
        let verified = time(&|c| verify(c, None))?;
        let verify_rollback_ms = time(&|c| verify(c, Some(block / 2)))?.total_ms;
        let draft = match self.drafter() {
            Some(drafter) if prompt_tokens > block => {
                let context_taps = prefill.taps.as_ref().expect("the prefill tapped");
                let mut primed = drafter.new_cache();
                let seen = context_taps.index((.., ..-(block as i32), ..));
                let fresh = context_taps.index((.., -(block as i32).., ..));
                let mask = drafter.config().mask_token_id;
                let mut tokens = vec![mask; block];
                tokens[0] = ids(1, prompt_tokens)[0];
                let tokens = row(tokens);
                let first = drafter.forward(model, &tokens, &seen, &mut primed)?;
                eval([&first])?;
                let mut samples = Vec::with_capacity(repeats);
                for i in 0..repeats.max(1) + 3 {
                    let mut cache = primed.clone();
                    let s = sample(|| {
                        let logits = drafter.forward(model, &tokens, &fresh, &mut cache)?;
                        Ok(vec![argmax_rows(&logits)?])
                    })?;
                    if i >= 3 {
                        samples.push(s);
                    }
                }
                Some(medians(samples))
            }
            _ => None,
        };
        Ok(VerifyCost {
            prompt_tokens,
            block,
            decode_ms: decoded.total_ms,
            verify_ms: verified.total_ms,
            verify_rollback_ms,
            ratio: verified.total_ms / decoded.total_ms,
            ratio_with_rollback: verify_rollback_ms / decoded.total_ms,
            decode_queued_ms: decoded.queued_ms,
            verify_queued_ms: verified.queued_ms,
            decode_built_ms: decoded.built_ms,
            verify_built_ms: verified.built_ms,
            draft_ms: draft.as_ref().map(|d| d.total_ms),
            draft_queued_ms: draft.as_ref().map(|d| d.queued_ms),
        })
    }
}
