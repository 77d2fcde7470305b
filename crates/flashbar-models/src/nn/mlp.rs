//! The SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`.

use crate::error::Result;
use crate::nn::linear::{Linear, Weights};
use mlx_rs::nn::silu;
use mlx_rs::Array;

pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn load(weights: &mut Weights, path: &str) -> Result<Self> {
        Ok(Mlp {
            gate_proj: Linear::load(weights, &format!("{path}.gate_proj"))?,
            up_proj: Linear::load(weights, &format!("{path}.up_proj"))?,
            down_proj: Linear::load(weights, &format!("{path}.down_proj"))?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let hidden = silu(self.gate_proj.forward(x)?)?.multiply(self.up_proj.forward(x)?)?;
        self.down_proj.forward(&hidden)
    }
}
