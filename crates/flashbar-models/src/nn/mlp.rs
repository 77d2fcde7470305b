//! The SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`.

use crate::error::Result;
use crate::nn::linear::{Fused, Linear, Weights};
use crate::nn::{fused, host};
use mlx_rs::Array;

pub struct Mlp {
    /// `gate_proj` and `up_proj`.
    gate_up: Fused,
    down_proj: Linear,
}

impl Mlp {
    pub fn load(weights: &mut Weights, path: &str) -> Result<Self> {
        Ok(Mlp {
            gate_up: Fused::load(
                weights,
                &["gate", "up"].map(|part| format!("{path}.{part}_proj")),
            )?,
            down_proj: Linear::load(weights, &format!("{path}.down_proj"))?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gate_up = self.gate_up.forward(x)?;
        // On the host path the products' outputs are host arrays already:
        // the gate on the host too, bit for bit MLX's (docs/cpu.md, "Host ops").
        let host = match self.gate_up.is_host() {
            true => host::swiglu(&gate_up[0], &gate_up[1])?,
            false => None,
        };
        let hidden = match host {
            Some(hidden) => hidden,
            None => fused::swiglu(&gate_up[0], &gate_up[1])?,
        };
        self.down_proj.forward(&hidden)
    }
}
