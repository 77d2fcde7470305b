//! The sparse MoE block of Qwen3.5/3.6-MoE: a softmax router picks the top-k
//! experts per token (SwiGLU experts applied through gather_mm / gather_qmm),
//! plus a shared expert scaled by its own sigmoid gate.

use crate::config::TextConfig;
use crate::error::Result;
use crate::nn::fused;
use crate::nn::linear::{Linear, SwitchLinear, Weights};
use crate::nn::mlp::Mlp;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, sigmoid, softmax_axis};
use mlx_rs::Array;

pub struct SparseMoe {
    gate: Linear,
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
    shared_expert: Mlp,
    shared_expert_gate: Linear,
    top_k: i32,
    norm_topk_prob: bool,
}

impl SparseMoe {
    pub fn load(weights: &mut Weights, path: &str, config: &TextConfig) -> Result<Self> {
        Ok(SparseMoe {
            gate: Linear::load(weights, &format!("{path}.gate"))?,
            gate_proj: SwitchLinear::load(weights, &format!("{path}.switch_mlp.gate_proj"))?,
            up_proj: SwitchLinear::load(weights, &format!("{path}.switch_mlp.up_proj"))?,
            down_proj: SwitchLinear::load(weights, &format!("{path}.switch_mlp.down_proj"))?,
            shared_expert: Mlp::load(weights, &format!("{path}.shared_expert"))?,
            shared_expert_gate: Linear::load(weights, &format!("{path}.shared_expert_gate"))?,
            top_k: config.num_experts_per_tok as i32,
            norm_topk_prob: config.norm_topk_prob,
        })
    }

    /// `x`: `[B, L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let probs = softmax_axis(self.gate.forward(x)?, -1, true)?;
        let k = self.top_k;
        let experts = argpartition_axis(&probs, -k, -1)?.index((.., .., -k..));
        let mut scores = probs.take_along_axis(&experts, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(scores.sum_axis(-1, true)?)?;
        }
        // Each token row meets each of its k experts: [B, L, 1, 1, hidden].
        let rows = x.expand_dims_axes(&[-2, -3])?;
        let up = self.up_proj.forward(&rows, &experts)?;
        let gate = self.gate_proj.forward(&rows, &experts)?;
        let hidden = fused::swiglu(&gate, &up)?;
        let out = self
            .down_proj
            .forward(&hidden, &experts)?
            .squeeze_axes(&[-2])?; // [B, L, k, hidden]
        let routed = out.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, false)?;

        let shared = self
            .shared_expert
            .forward(x)?
            .multiply(sigmoid(self.shared_expert_gate.forward(x)?)?)?;
        Ok(routed.add(shared)?)
    }
}
