//! mlx-lm's `sanitize` for the Qwen3.5 / Qwen3.6 checkpoints, written once
//! and applied alike to the tensor headers (checked before any weight is
//! read) and to the arrays (when the weights load), so both always agree:
//! - HF checkpoints store the GDN conv kernel as `[C, 1, K]`, MLX as
//!   `[C, K, 1]`;
//! - HF stores some norm weights zero-centred (mlx-lm adds 1 converting);
//! - a tied output head's `lm_head.*` is dropped;
//! - HF MoE checkpoints fuse the experts' gate and up projections
//!   (`experts.gate_up_proj [E, 2I, H]`); MLX keeps them apart under
//!   `switch_mlp` (the split is `qwen3_5_moe.rs`'s).

use crate::config::{Architecture, ModelConfig};
use crate::error::Result;
use crate::qwen3_5_moe::{self, Experts};
use crate::spec::Header;
use mlx_rs::ops::split_equal;
use mlx_rs::Array;

/// What sanitize needs from a tensor: its rank and the three edits, on
/// the real data (an [`Array`]) or on its shape only (a [`Header`]).
pub(crate) trait Tensor: Sized {
    fn rank(&self) -> usize;
    /// `[C, 1, K]` -> `[C, K, 1]`.
    fn swap_conv(self) -> Result<Self>;
    /// A zero-centred norm weight plus one.
    fn shift_norm(self) -> Result<Self>;
    /// Two equal halves along the second-to-last axis.
    fn halves(self) -> Result<[Self; 2]>;
}

impl Tensor for Array {
    fn rank(&self) -> usize {
        self.ndim()
    }
    fn swap_conv(self) -> Result<Self> {
        Ok(self.swap_axes(1, 2)?)
    }
    fn shift_norm(self) -> Result<Self> {
        Ok(self.add(Array::from_f32(1.0))?.as_dtype(self.dtype())?)
    }
    fn halves(self) -> Result<[Self; 2]> {
        let mut halves = split_equal(&self, 2, -2)?.into_iter();
        match (halves.next(), halves.next()) {
            (Some(a), Some(b)) => Ok([a, b]),
            _ => unreachable!("split_equal into 2 gives 2 parts"),
        }
    }
}

impl Tensor for Header {
    fn rank(&self) -> usize {
        self.shape.len()
    }
    fn swap_conv(mut self) -> Result<Self> {
        self.shape.swap(1, 2);
        Ok(self)
    }
    fn shift_norm(self) -> Result<Self> {
        Ok(self)
    }
    fn halves(mut self) -> Result<[Self; 2]> {
        if let Some(rows) = self.shape.iter_mut().rev().nth(1) {
            *rows /= 2;
        }
        Ok([self.clone(), self])
    }
}

/// Norm weights HF stores zero-centred.
const SHIFTED_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// The tensors as the model loads them. `hf_layout`: the checkpoint is in
/// HF's layout (its conv kernels say so: [`is_hf_layout`]).
pub(crate) fn sanitize<T: Tensor>(
    config: &ModelConfig,
    tensors: impl IntoIterator<Item = (String, T)>,
    hf_layout: bool,
) -> Result<Vec<(String, T)>> {
    let mut out = Vec::new();
    for (name, tensor) in tensors {
        if config.text.tie_word_embeddings && name.starts_with("lm_head.") {
            continue;
        }
        let tensor = if !hf_layout {
            tensor
        } else if name.ends_with("conv1d.weight") && tensor.rank() == 3 {
            tensor.swap_conv()?
        } else if tensor.rank() == 1 && SHIFTED_NORMS.iter().any(|s| name.ends_with(s)) {
            tensor.shift_norm()?
        } else {
            tensor
        };
        match qwen3_5_moe::experts(&name).filter(|_| config.architecture == Architecture::Moe) {
            Some(Experts::GateUp { gate, up }) => {
                let [g, u] = tensor.halves()?;
                out.push((gate, g));
                out.push((up, u));
            }
            Some(Experts::Down(renamed)) => out.push((renamed, tensor)),
            None => out.push((name, tensor)),
        }
    }
    Ok(out)
}

/// Whether a checkpoint's conv kernels are in HF's `[C, 1, K]` layout.
pub(crate) fn is_hf_layout<'a>(
    shapes: impl IntoIterator<Item = (&'a String, &'a [usize])>,
) -> bool {
    shapes
        .into_iter()
        .any(|(name, shape)| name.ends_with("conv1d.weight") && shape.last() != Some(&1))
}
