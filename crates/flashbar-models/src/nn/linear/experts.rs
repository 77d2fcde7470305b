//! A MoE's experts: one linear map per expert, applied to each row by its
//! expert's index (docs/gpu.md, "The experts").

use super::{LinearWeight, Packed, Weights};
use crate::error::Result;
use flashbar_mlx::row_invariant;
use mlx_rs::ops::{gather_mm, gather_qmm};
use mlx_rs::Array;

/// One linear map per expert, `[experts, out, in]`, applied by index.
pub struct SwitchLinear {
    weight: LinearWeight,
}

impl SwitchLinear {
    pub fn load(weights: &mut Weights, path: &str) -> Result<Self> {
        // Experts stay as they came: each token's rows go through its own
        // experts one row at a time, and MoE models are far past the limit.
        Ok(SwitchLinear {
            weight: LinearWeight::load(weights, path, false)?,
        })
    }

    /// `x`: `[..., 1, in]` rows, `indices`: the expert of each row.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        if let LinearWeight::Quantized(q) = &self.weight {
            if let Some(y) = Self::row_invariant(x, indices, q)? {
                return Ok(y);
            }
        }
        Ok(match &self.weight {
            LinearWeight::Dense(w) => gather_mm(x, w.swap_axes(-1, -2)?, None, indices, false)?,
            LinearWeight::Host { .. } => {
                return Err(mlx_rs::error::Exception::custom(
                    "experts are never unpacked for the host kernels",
                )
                .into())
            }
            LinearWeight::Quantized(q) => gather_qmm(
                x,
                &q.weight,
                &q.scales,
                &q.biases,
                None,
                indices,
                true,
                q.group_size,
                q.bits,
                false,
            )?,
        })
    }

    /// The row-invariant experts' kernel (decode and verify on CUDA,
    /// docs/gpu.md "The experts"), where it takes `x`: `[B, L, 1, 1, in]`
    /// (a token's row for each of its experts) or `[B, L, k, 1, in]` (a row
    /// per token and expert), `indices` `[B, L, k]`; None elsewhere.
    fn row_invariant(x: &Array, indices: &Array, q: &Packed) -> Result<Option<Array>> {
        let (xs, is) = (x.shape(), indices.shape());
        if !q.row_kernel || xs.len() != 5 || is.len() != 3 || xs[..2] != is[..2] {
            return Ok(None);
        }
        let (tokens, k, inputs) = (is[0] * is[1], is[2], xs[4]);
        let per_token = match xs[2] {
            1 => true,
            n if n == k => false,
            _ => return Ok(None),
        };
        let x2 = x.reshape(&[if per_token { tokens } else { tokens * k }, inputs])?;
        if !row_invariant::takes_gathered(&x2, &q.scales, q.group_size, q.bits, tokens) {
            return Ok(None);
        }
        // Output row p (token p / k, its expert p % k) reads row p / k of
        // x, or row p where each pair has its own.
        let rows: Vec<i32> = (0..tokens * k)
            .map(|p| if per_token { p / k } else { p })
            .collect();
        let y = row_invariant::gather_quantized_matmul(
            &x2,
            &q.weight,
            &q.scales,
            &q.biases,
            &Array::from_slice(&rows, &[tokens * k]),
            indices,
            tokens,
            q.group_size,
            q.bits,
        )?;
        let n = q.weight.shape()[1];
        Ok(Some(y.reshape(&[is[0], is[1], k, 1, n])?))
    }
}
