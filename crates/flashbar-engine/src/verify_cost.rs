//! What a DFlash verify costs next to one plain decode step. A round commits
//! at most `block` tokens for one verify, so `verify / decode` caps every
//! speedup speculation can give (docs/dflash.md, "Where the speed bound is").

use crate::engine::Engine;
use crate::error::Result;
use flashbar_models::dflash_config::default_taps;
use flashbar_models::qwen3_5::cache_arrays;
use flashbar_models::{LayerCache, Outputs};
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::transforms::eval;
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

        let decode = |cache: &mut Vec<LayerCache>| -> Result<()> {
            let logits = model
                .forward(&row(ids(1, prompt_tokens)), cache, Outputs::ALL)?
                .logits;
            let token = argmax_axis(&logits, -1, false)?;
            let mut out = cache_arrays(cache);
            out.push(&token);
            Ok(eval(out)?)
        };
        let verify = |cache: &mut Vec<LayerCache>, keep: Option<usize>| -> Result<()> {
            let verified = model.verify(&row(ids(block, prompt_tokens)), cache, &taps)?;
            let token = argmax_axis(&verified.logits, -1, false)?;
            let tapped = verified.taps.iter();
            eval(
                [&token]
                    .into_iter()
                    .chain(tapped)
                    .chain(verified.tape.arrays()),
            )?;
            if let Some(keep) = keep {
                model.rollback(cache, &verified.tape, keep)?;
            }
            Ok(eval(cache_arrays(cache))?)
        };
        let time = |f: &dyn Fn(&mut Vec<LayerCache>) -> Result<()>| -> Result<f64> {
            for _ in 0..3 {
                f(&mut context.clone())?; // warm-up: kernels compile on first use
            }
            let mut samples = Vec::with_capacity(repeats);
            for _ in 0..repeats.max(1) {
                let mut cache = context.clone();
                let clock = Instant::now();
                f(&mut cache)?;
                samples.push(clock.elapsed().as_secs_f64() * 1e3);
            }
            samples.sort_by(f64::total_cmp);
            Ok(samples[samples.len() / 2])
        };
        let decode_ms = time(&|c| decode(c))?;
        let verify_ms = time(&|c| verify(c, None))?;
        let verify_rollback_ms = time(&|c| verify(c, Some(block / 2)))?;
        Ok(VerifyCost {
            prompt_tokens,
            block,
            decode_ms,
            verify_ms,
            verify_rollback_ms,
            ratio: verify_ms / decode_ms,
            ratio_with_rollback: verify_rollback_ms / decode_ms,
        })
    }
}
