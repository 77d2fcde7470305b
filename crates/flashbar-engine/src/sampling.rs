//! Choosing the next token from logits.
//!
//! Temperature 0 is greedy (argmax). Otherwise the logits are tempered,
//! filtered (top-k, top-p, min-p) and sampled with a uniform drawn from a key
//! derived from (seed, absolute position) alone, so any path that computes the
//! same logits for a position (plain decoding, or a speculative verify) draws
//! the same token there.

use crate::error::EngineError;
use serde::{Deserialize, Serialize};

/// The highest temperature taken (OpenAI's range, used by the app too).
pub const MAX_TEMPERATURE: f32 = 2.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// The one check of sampling values (the server, the app and the CLI
    /// all get it through the engine), naming the bad field.
    pub fn validate(&self) -> Result<(), EngineError> {
        let t = self.temperature;
        if !(0.0..=MAX_TEMPERATURE).contains(&t) {
            return Err(EngineError::param(
                "temperature",
                format!("temperature must be in [0, {MAX_TEMPERATURE}], got {t}"),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::param(
                "top_p",
                format!("top_p must be in (0, 1], got {}", self.top_p),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(EngineError::param(
                "min_p",
                format!("min_p must be in [0, 1], got {}", self.min_p),
            ));
        }
        Ok(())
    }

    /// The token at absolute `position` given its logits.
    pub fn sample(&self, logits: &[f32], position: u64) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let mut candidates = tempered_probabilities(logits, self.temperature);
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.top_k > 0 && self.top_k < candidates.len() {
            candidates.truncate(self.top_k);
        }
        if self.min_p > 0.0 {
            let floor = candidates[0].1 * self.min_p as f64;
            candidates.retain(|c| c.1 >= floor);
        }
        if self.top_p < 1.0 {
            let mut mass = 0.0;
            let keep = candidates
                .iter()
                .position(|c| {
                    mass += c.1;
                    mass >= self.top_p as f64
                })
                .map_or(candidates.len(), |i| i + 1);
            candidates.truncate(keep);
        }
        let total: f64 = candidates.iter().map(|c| c.1).sum();
        let mut target = uniform(self.seed, position) * total;
        for &(id, p) in &candidates {
            if target < p {
                return id;
            }
            target -= p;
        }
        candidates.last().map_or(0, |c| c.0)
    }
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// (token, probability) for every token, at temperature `t`, in f64.
fn tempered_probabilities(logits: &[f32], t: f32) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = t as f64;
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - max) / t).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    weights
        .into_iter()
        .enumerate()
        .map(|(i, w)| (i as u32, w / total))
        .collect()
}

/// A uniform in [0, 1) from (seed, position): two rounds of SplitMix64.
pub fn uniform(seed: u64, position: u64) -> f64 {
    let mixed = splitmix64(splitmix64(seed) ^ position.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    (mixed >> 11) as f64 / (1u64 << 53) as f64
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: 7,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_is_argmax() {
        assert_eq!(params(0.0).sample(&[0.1, 3.0, -1.0, 2.9], 5), 1);
    }

    #[test]
    fn the_same_seed_and_position_draw_the_same_token() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = params(1.0);
        for position in 0..100 {
            assert_eq!(p.sample(&logits, position), p.sample(&logits, position));
        }
        let draws: std::collections::BTreeSet<_> =
            (0..100).map(|pos| p.sample(&logits, pos)).collect();
        assert!(
            draws.len() > 10,
            "positions should vary the draw: {draws:?}"
        );
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // p = softmax([ln 1, ln 3]) = [0.25, 0.75]
        let logits = [0.0f32, 3f32.ln()];
        let ones = (0..20_000)
            .filter(|&pos| params(1.0).sample(&logits, pos) == 1)
            .count();
        let share = ones as f64 / 20_000.0;
        assert!((share - 0.75).abs() < 0.02, "share {share}");
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.5f32, 0.4, 2.0, 1.9];
        let p = SamplingParams {
            top_k: 1,
            ..params(5.0)
        };
        assert!((0..200).all(|pos| p.sample(&logits, pos) == 2));
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let logits = [5.0f32, 4.9, -10.0, -10.0];
        let top_p = SamplingParams {
            top_p: 0.9,
            ..params(1.0)
        };
        let min_p = SamplingParams {
            min_p: 0.5,
            ..params(1.0)
        };
        for pos in 0..500 {
            assert!(top_p.sample(&logits, pos) < 2);
            assert!(min_p.sample(&logits, pos) < 2);
        }
    }

    #[test]
    fn bad_params_are_refused() {
        assert!(params(-1.0).validate().is_err());
        assert!(SamplingParams {
            top_p: 0.0,
            ..params(1.0)
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            min_p: 2.0,
            ..params(1.0)
        }
        .validate()
        .is_err());
        assert!(params(0.7).validate().is_ok());
        assert!(params(2.0).validate().is_ok());
        let hot = params(2.5).validate().unwrap_err();
        assert!(
            matches!(
                hot,
                EngineError::InvalidParam {
                    param: "temperature",
                    ..
                }
            ),
            "{hot:?}"
        );
        assert!(params(f32::NAN).validate().is_err());
    }
}
