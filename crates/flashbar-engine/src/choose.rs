//! Turning logits into tokens on the right side of the device boundary:
//! greedy picks stay on the device (queued asynchronously, so the next step
//! can be built before the token is read); sampling reads the logits and
//! draws with the position's key, so every path that computes the same
//! logits for a position picks the same token.

use crate::error::{mlx_error, Result};
use crate::sampling::SamplingParams;
use flashbar_mlx::device::{self, Backend};
use flashbar_models::nn::host;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};

/// The next token: still on the device (greedy), or already on the host.
pub(crate) enum Pending {
    Device(Array),
    Host(u32),
}

impl Pending {
    pub fn resolve(&self) -> Result<u32> {
        match self {
            Pending::Device(token) => token.try_item_exact::<u32>().map_err(mlx_error),
            Pending::Host(id) => Ok(*id),
        }
    }
}

/// What greedy takes the argmax of, per row of `logits` (`[..., vocab]`).
/// On the CPU in MLX's arithmetic (`nn::host::Arithmetic::Mlx`): mlx-lm's
/// log-probabilities, `logits - logsumexp(logits)` in
/// the logits' type (its `generate_step`'s default sampler), so a tie the
/// subtraction rounds two logits into breaks towards the lower id as there
/// (docs/cpu.md, "Parity with mlx-lm"); MLX's CPU logsumexp computes each
/// row alone, so a verify's rows still pick as the decode steps do.
/// Elsewhere the logits themselves.
fn greedy_scores(logits: &Array) -> Result<Array> {
    if device::current() != Backend::Cpu || host::arithmetic() != host::Arithmetic::Mlx {
        return Ok(logits.clone());
    }
    let normalizer = logits.logsumexp_axis(-1, true)?;
    Ok(logits.subtract(&normalizer)?)
}

/// The pick at the last row of `logits` `[1, n, vocab]`: greedy picks on
/// the device (evaluated asynchronously) or where the host kernels left
/// the logits ([`host_greedy`]); sampling copies the row to the host and
/// draws with the position's key.
pub(crate) fn choose_last(
    logits: &Array,
    sampling: &SamplingParams,
    position: u64,
) -> Result<Pending> {
    if sampling.is_greedy() {
        let rows = logits.shape()[1] as usize;
        if let Some(picks) = host_greedy(logits, rows - 1) {
            return Ok(Pending::Host(picks[0]));
        }
    }
    choose(&logits.index((0, -1)), sampling, position)
}

/// Greedy picks per row of `logits` `[1, n, vocab]` from row `first` on,
/// read on the host where the CPU's host kernels left them (evaluated,
/// row-major bf16 or f32) and greedy takes the logits themselves (not in
/// MLX's arithmetic, [`greedy_scores`]): the pick of MLX's argmax (the
/// first of the largest values), without its pass of
/// each row on MLX's one thread and the hand-over to it (a fifth of a
/// millisecond a verify on the embedded pair). None elsewhere.
pub(crate) fn host_greedy(logits: &Array, first: usize) -> Option<Vec<u32>> {
    if device::current() != Backend::Cpu || host::arithmetic() == host::Arithmetic::Mlx {
        return None;
    }
    let vocab = *logits.shape().last()? as usize;
    // Each value against the best so far from the first on, a later value
    // taken only if larger: ties keep the first, and a NaN never wins but in
    // the first place (as the linked MLX's argmax over an axis does).
    let pick = |row: &mut dyn Iterator<Item = f32>| -> u32 {
        let (mut best, mut at) = (f32::NAN, 0u32);
        for (i, v) in row.enumerate() {
            if i == 0 || v > best {
                (best, at) = (v, i as u32);
            }
        }
        at
    };
    match logits.dtype() {
        Dtype::Bfloat16 => {
            let values = logits.try_as_slice::<half::bf16>().ok()?;
            Some(
                values
                    .chunks_exact(vocab)
                    .skip(first)
                    .map(|row| pick(&mut row.iter().map(|v| v.to_f32())))
                    .collect(),
            )
        }
        Dtype::Float32 => {
            let values = logits.try_as_slice::<f32>().ok()?;
            Some(
                values
                    .chunks_exact(vocab)
                    .skip(first)
                    .map(|row| pick(&mut row.iter().copied()))
                    .collect(),
            )
        }
        _ => None,
    }
}

/// The argmax of each row of `logits` `[1, n, vocab]` as `[1, n]` u32: read
/// on the host where [`host_greedy`] can (the same picks), else MLX's
/// argmax, queued. Drafts are picked so, and the verify-cost benchmark
/// picks as the engine does.
pub(crate) fn argmax_rows(logits: &Array) -> Result<Array> {
    match host_greedy(logits, 0) {
        Some(picks) => Ok(Array::from_slice(&picks, &[1, picks.len() as i32])),
        None => Ok(argmax_axis(logits, -1, false)?.as_dtype(Dtype::Uint32)?),
    }
}

/// Greedy picks on the device (evaluated asynchronously); sampling copies
/// the logits `[vocab]` to the host and draws with the position's key.
pub(crate) fn choose(logits: &Array, sampling: &SamplingParams, position: u64) -> Result<Pending> {
    if sampling.is_greedy() {
        let token = argmax_axis(greedy_scores(logits)?, -1, false)?.as_dtype(Dtype::Uint32)?;
        mlx_rs::transforms::async_eval([&token])?;
        return Ok(Pending::Device(token));
    }
    let host = logits.as_dtype(Dtype::Float32)?;
    host.eval()?;
    let values = host.try_as_slice::<f32>().map_err(mlx_error)?;
    Ok(Pending::Host(sampling.sample(values, position)))
}

/// The target's choice at every row of `logits` `[1, n, vocab]`; row i is
/// the token at absolute position `first_position + i` (the sampling key).
/// Greedy picks on the device, as plain decoding does, so ties break alike.
pub(crate) fn choose_all(
    logits: &Array,
    sampling: &SamplingParams,
    first_position: usize,
) -> Result<Vec<u32>> {
    if sampling.is_greedy() {
        if let Some(picks) = host_greedy(logits, 0) {
            return Ok(picks);
        }
        return host_u32(&argmax_axis(greedy_scores(logits)?, -1, false)?.as_dtype(Dtype::Uint32)?);
    }
    let rows = logits.shape()[1];
    let host = logits.index(0).as_dtype(Dtype::Float32)?;
    host.eval()?;
    let values = host.try_as_slice::<f32>().map_err(mlx_error)?;
    let vocab = values.len() / rows as usize;
    Ok(values
        .chunks(vocab)
        .enumerate()
        .map(|(i, row)| sampling.sample(row, (first_position + i) as u64))
        .collect())
}

pub(crate) fn host_u32(array: &Array) -> Result<Vec<u32>> {
    let array = array.as_dtype(Dtype::Uint32)?.flatten(None, None)?;
    array.eval()?;
    Ok(array.try_as_slice::<u32>().map_err(mlx_error)?.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's greedy pick is the linked MLX's argmax's on every row,
    /// ties (the first of the largest), infinities and NaN included, in
    /// bf16 and f32.
    #[test]
    fn host_greedy_picks_what_mlx_argmax_picks() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let rows: [[f32; 5]; 8] = [
            [1.0, 3.0, 3.0, 2.0, -1.0],
            [-inf, -inf, -inf, -inf, -inf],
            [-inf, -inf, -1e30, -inf, -2e30],
            [inf, 1.0, inf, 0.0, 0.0],
            [1.0, nan, 5.0, nan, 9.0],
            [nan, 1.0, 2.0, 3.0, 4.0],
            [-0.0, 0.0, -0.0, 0.0, -1.0],
            [0.25, -3.5, 7.0, 7.0078125, 7.0],
        ];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        for dtype in [Dtype::Bfloat16, Dtype::Float32] {
            let logits = Array::from_slice(&flat, &[1, 8, 5])
                .as_dtype(dtype)
                .unwrap();
            logits.eval().unwrap();
            let want = host_u32(&argmax_axis(&logits, -1, false).unwrap()).unwrap();
            assert_eq!(host_greedy(&logits, 0), Some(want.clone()), "{dtype:?}");
            assert_eq!(
                host_greedy(&logits, 5),
                Some(want[5..].to_vec()),
                "{dtype:?}"
            );
        }
    }

    /// Drafts are picked as `[1, n]` u32 ids, MLX's argmax's, whether the
    /// host reads them or MLX's argmax runs (an array not yet evaluated).
    #[test]
    fn argmax_rows_are_mlx_argmax_as_ids() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let flat: Vec<f32> = (0..3 * 7)
            .map(|i| ((i * 5) % 7) as f32 - (i / 7) as f32)
            .collect();
        let logits = Array::from_slice(&flat, &[1, 3, 7]);
        let want = host_u32(&argmax_axis(&logits, -1, false).unwrap()).unwrap();
        for lazy in [false, true] {
            let input = if lazy {
                logits.multiply(Array::from_f32(1.0)).unwrap()
            } else {
                logits.clone()
            };
            let picks = argmax_rows(&input).unwrap();
            assert_eq!(picks.shape(), [1, 3], "lazy {lazy}");
            assert_eq!(picks.dtype(), Dtype::Uint32, "lazy {lazy}");
            assert_eq!(host_u32(&picks).unwrap(), want, "lazy {lazy}");
        }
    }
}
