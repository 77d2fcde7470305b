//! A MoE's experts: one linear map per expert, applied to each row by its
//! expert's index (docs/gpu.md, "The experts").

use super::{fuse_ends, LinearWeight, Packed, Weights};
use crate::error::Result;
use crate::nn::fused;
use flashbar_mlx::row_invariant;
use mlx_rs::ops::{concatenate, gather_mm, gather_qmm};
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

    /// Stacks `extra` (one map `[out, in]` in this map's packed format)
    /// after the experts, as expert E (docs/gpu.md, "The shared expert
    /// among the experts"); the experts' arrays are replaced, so memory
    /// grows by `extra` alone. False, and nothing changed, where the
    /// formats differ.
    pub(crate) fn append_expert(&mut self, extra: &Packed) -> Result<bool> {
        let LinearWeight::Quantized(q) = &self.weight else {
            return Ok(false);
        };
        if !self.fits_expert(extra) {
            return Ok(false);
        }
        let appended = Packed::rebuilt(q, |of| {
            Ok(concatenate(&[of(q).clone(), of(extra).expand_dims(0)?], 0)?)
        })?;
        self.weight = LinearWeight::Quantized(appended);
        Ok(true)
    }

    /// Whether `extra` is one more expert's map in this map's packed format.
    pub(crate) fn fits_expert(&self, extra: &Packed) -> bool {
        let LinearWeight::Quantized(q) = &self.weight else {
            return false;
        };
        q.bits == extra.bits
            && q.group_size == extra.group_size
            && q.row_kernel == extra.row_kernel
            && [
                (&q.weight, &extra.weight),
                (&q.scales, &extra.scales),
                (&q.biases, &extra.biases),
            ]
            .iter()
            .all(|(a, b)| a.ndim() == 3 && a.shape()[1..] == *b.shape() && a.dtype() == b.dtype())
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

    /// The row-invariant experts' kernel on `x` `[R, in]` with the (row,
    /// expert) pairs of `row_invariant::moe_route` (`[2, P]`), for `tokens`
    /// tokens; with `glu` this map is a [`ExpertsGlu::Paired`] pair and
    /// the output `silu(gate) * up` (`[P, out / 2]`). None where the kernel
    /// does not take them.
    pub fn forward_pairs(
        &self,
        x: &Array,
        pairs: &Array,
        tokens: i32,
        glu: bool,
    ) -> Result<Option<Array>> {
        let LinearWeight::Quantized(q) = &self.weight else {
            return Ok(None);
        };
        let (n, k) = (q.weight.shape()[1], x.shape()[x.ndim() - 1]);
        if !q.row_kernel
            || !row_invariant::takes_gathered(x, &q.scales, q.group_size, q.bits, tokens)
            || (glu && !row_invariant::takes_glu(n, k, q.bits))
        {
            return Ok(None);
        }
        Ok(Some(row_invariant::gather_quantized_matmul_pairs(
            x,
            &q.weight,
            &q.scales,
            &q.biases,
            pairs,
            tokens,
            q.group_size,
            q.bits,
            glu,
        )?))
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
        // A prefill's rows go by MLX's gather_qmm here (nn/moe.rs runs
        // them through the block's kernels where those are on).
        if tokens > row_invariant::MAX_ROWS {
            return Ok(None);
        }
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

/// A MoE's experts' gate and up maps.
pub enum ExpertsGlu {
    Apart {
        gate: SwitchLinear,
        up: SwitchLinear,
    },
    /// One map, each expert's rows paired (16 of gate, the same 16 of up:
    /// `row_invariant::pair_glu_rows`) for the gathered kernel's GLU end,
    /// where `pair` asks for it and the row kernels take the shape (memory
    /// unchanged: the rows are only reordered).
    Paired(SwitchLinear),
}

impl ExpertsGlu {
    pub fn load(weights: &mut Weights, gate: &str, up: &str, pair: bool) -> Result<Self> {
        let (gate, up) = (
            SwitchLinear::load(weights, gate)?,
            SwitchLinear::load(weights, up)?,
        );
        if let (LinearWeight::Quantized(g), LinearWeight::Quantized(u)) = (&gate.weight, &up.weight)
        {
            let alike = g.bits == u.bits
                && g.group_size == u.group_size
                && g.weight.shape() == u.weight.shape()
                && g.scales.dtype() == u.scales.dtype();
            let (n, k) = (2 * g.weight.shape()[1], g.weight.shape()[2] * (32 / g.bits));
            if pair
                && alike
                && g.row_kernel
                && fuse_ends()
                && row_invariant::takes_glu(n, k, g.bits)
            {
                let paired =
                    Packed::rebuilt(g, |of| Ok(row_invariant::pair_glu_rows(of(g), of(u))?))?;
                return Ok(ExpertsGlu::Paired(SwitchLinear {
                    weight: LinearWeight::Quantized(paired),
                }));
            }
        }
        Ok(ExpertsGlu::Apart { gate, up })
    }

    /// [`SwitchLinear::append_expert`] for a paired map (`extra`: gate and
    /// up paired the same way); false where the maps are apart.
    pub(crate) fn append_expert(&mut self, extra: &Packed) -> Result<bool> {
        match self {
            ExpertsGlu::Paired(both) => both.append_expert(extra),
            ExpertsGlu::Apart { .. } => Ok(false),
        }
    }

    /// `silu(gate) * up` of each row `x` `[..., 1, in]` with its experts
    /// `indices`, by the ops (a paired map's product split by views).
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        match self {
            ExpertsGlu::Apart { gate, up } => {
                let up = up.forward(x, indices)?;
                fused::swiglu(&gate.forward(x, indices)?, &up)
            }
            ExpertsGlu::Paired(both) => {
                let (gate, up) = row_invariant::unpair_glu_columns(&both.forward(x, indices)?)?;
                fused::swiglu(&gate, &up)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    fn packed(seed: i32, experts: i32, out: i32, inputs: i32) -> Packed {
        let n = experts * out * inputs;
        let values: Vec<f32> = (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 0.1)
            .collect();
        let w = Array::from_slice(&values, &[experts, out, inputs])
            .as_dtype(mlx_rs::Dtype::Bfloat16)
            .unwrap();
        let (weight, scales, biases) = mlx_rs::ops::quantize(&w, 64, 4).unwrap();
        Packed {
            weight,
            scales,
            biases,
            group_size: 64,
            bits: 4,
            row_kernel: false,
        }
    }

    /// The shared expert stacked after the experts (docs/gpu.md, "The
    /// shared expert among the experts") is expert E, and the experts
    /// before it give what they gave; a map of another format is refused,
    /// with nothing changed.
    #[test]
    fn an_appended_expert_is_the_last_and_changes_no_other() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let switch = |q| SwitchLinear {
            weight: LinearWeight::Quantized(q),
        };
        let mut experts = switch(packed(3, 4, 32, 128));
        let extra = packed(4, 1, 32, 128);
        let one = |of: &Array| of.index(0);
        let extra = Packed {
            weight: one(&extra.weight),
            scales: one(&extra.scales),
            biases: one(&extra.biases),
            ..extra
        };
        let x: Vec<f32> = (0..2 * 128)
            .map(|i| ((i % 29) as f32 - 14.0) / 15.0)
            .collect();
        let x = Array::from_slice(&x, &[1, 2, 1, 1, 128])
            .as_dtype(mlx_rs::Dtype::Bfloat16)
            .unwrap();
        let routed = Array::from_slice(&[0u32, 3, 1, 2], &[1, 2, 2]);
        let before = experts.forward(&x, &routed).unwrap();

        let wider = packed(5, 1, 32, 64);
        let wider = Packed {
            weight: one(&wider.weight),
            scales: one(&wider.scales),
            biases: one(&wider.biases),
            ..wider
        };
        assert!(!experts.append_expert(&wider).unwrap());
        assert!(experts.append_expert(&extra).unwrap());
        let LinearWeight::Quantized(q) = &experts.weight else {
            panic!("the experts stay packed");
        };
        assert_eq!(q.weight.shape()[0], 5);
        assert!(q.scales.index(4).eq_values(&extra.scales).unwrap());
        assert!(experts
            .forward(&x, &routed)
            .unwrap()
            .eq_values(&before)
            .unwrap());
        // Expert 4 is the appended map.
        let last = Array::from_slice(&[4u32, 4], &[1, 2, 1]);
        let alone_first = Array::from_slice(&[0u32, 0], &[1, 2, 1]);
        let alone = switch(Packed {
            weight: extra.weight.expand_dims(0).unwrap(),
            scales: extra.scales.expand_dims(0).unwrap(),
            biases: extra.biases.expand_dims(0).unwrap(),
            ..extra
        });
        assert!(experts
            .forward(&x, &last)
            .unwrap()
            .eq_values(alone.forward(&x, &alone_first).unwrap())
            .unwrap());
    }

    /// A prefill runs paired experts (the GPU's layout) by the ops: the
    /// paired product split back into gate and up by views. It must give
    /// what the maps apart give, bit for bit (each expert's rows paired
    /// alone, each output column its own sum).
    #[test]
    fn paired_experts_give_what_the_maps_apart_give() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let (gate, up) = (packed(1, 4, 32, 128), packed(2, 4, 32, 128));
        let paired = Packed::rebuilt(&gate, |of| {
            Ok(row_invariant::pair_glu_rows(of(&gate), of(&up))?)
        })
        .unwrap();
        let apart = ExpertsGlu::Apart {
            gate: SwitchLinear {
                weight: LinearWeight::Quantized(gate),
            },
            up: SwitchLinear {
                weight: LinearWeight::Quantized(up),
            },
        };
        let paired = ExpertsGlu::Paired(SwitchLinear {
            weight: LinearWeight::Quantized(paired),
        });
        // 3 tokens, 2 experts each: [B, L, 1, 1, in] rows, [B, L, k] experts.
        let x: Vec<f32> = (0..3 * 128)
            .map(|i| ((i % 37) as f32 - 18.0) / 20.0)
            .collect();
        let x = Array::from_slice(&x, &[1, 3, 1, 1, 128])
            .as_dtype(mlx_rs::Dtype::Bfloat16)
            .unwrap();
        let experts = Array::from_slice(&[0u32, 3, 1, 2, 3, 0], &[1, 3, 2]);
        let (a, p) = (
            apart.forward(&x, &experts).unwrap(),
            paired.forward(&x, &experts).unwrap(),
        );
        assert_eq!(a.shape(), &[1, 3, 2, 1, 32]);
        assert_eq!(p.shape(), a.shape());
        assert!(
            a.eq_values(&p).unwrap(),
            "paired experts differ from the maps apart"
        );
        // Gate and up the other way round do not pass.
        let map = |seed| SwitchLinear {
            weight: LinearWeight::Quantized(packed(seed, 4, 32, 128)),
        };
        let swapped = ExpertsGlu::Apart {
            gate: map(2),
            up: map(1),
        };
        assert!(!swapped
            .forward(&x, &experts)
            .unwrap()
            .eq_values(&p)
            .unwrap());
    }
}
