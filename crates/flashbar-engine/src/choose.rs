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
