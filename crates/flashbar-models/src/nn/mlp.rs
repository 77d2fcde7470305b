//! The SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`.

use crate::error::Result;
use crate::nn::linear::{Fused, Linear, Onto, Packed, Weights};
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
            gate_up: Fused::load_glu(
                weights,
                &format!("{path}.gate_proj"),
                &format!("{path}.up_proj"),
            )?,
            down_proj: Linear::load(weights, &format!("{path}.down_proj"))?,
        })
    }

    /// [`Self::load`] with dense gate and up maps stacked into one product
    /// (`Fused::load_stacking_dense`): the drafter's, whose small products
    /// cost a call's floor on the GPU (docs/gpu.md, "The drafter's forward
    /// on the GPU").
    pub fn load_stacking_dense(weights: &mut Weights, path: &str) -> Result<Self> {
        Ok(Mlp {
            gate_up: Fused::load_stacking_dense(
                weights,
                &[format!("{path}.gate_proj"), format!("{path}.up_proj")],
            )?,
            down_proj: Linear::load(weights, &format!("{path}.down_proj"))?,
        })
    }

    /// Gate and up as two products again where they are one dense product
    /// (the tests compare the two).
    #[cfg(test)]
    pub(crate) fn unstacked(self) -> Result<Self> {
        Ok(Mlp {
            gate_up: self.gate_up.unstacked()?,
            down_proj: self.down_proj,
        })
    }

    /// Whether gate and up are one product.
    #[cfg(test)]
    pub(crate) fn is_stacked(&self) -> bool {
        self.gate_up.is_stacked()
    }

    /// The packed weights of the row-invariant kernels' two products: gate
    /// and up with their rows paired, and down. None where the block is not
    /// run so.
    pub(crate) fn packed_glu_and_down(&self) -> Option<(&Packed, &Packed)> {
        Some((self.gate_up.glu_packed()?, self.down_proj.packed()?))
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self.forward_onto(x, None)? {
            Onto::Apart(out) | Onto::Added(out) => Ok(out),
        }
    }

    /// [`Self::forward`], onto the residual stream `residual` when given.
    /// On the row-invariant kernels the gate/up product writes
    /// `silu(gate) * up` itself and the down product adds itself onto the
    /// residual: two calls for the layer's six steps (docs/gpu.md, "Fused
    /// ends").
    pub fn forward_onto(&self, x: &Array, residual: Option<&Array>) -> Result<Onto> {
        let hidden = match self.gate_up.forward_glu(x)? {
            Some(hidden) => hidden,
            None => self.hidden(x)?,
        };
        match residual {
            Some(residual) => self.down_proj.forward_onto(&hidden, residual),
            None => Ok(Onto::Apart(self.down_proj.forward(&hidden)?)),
        }
    }

    /// `silu(gate(x)) * up(x)` product by product.
    fn hidden(&self, x: &Array) -> Result<Array> {
        let gate_up = self.gate_up.forward(x)?;
        // On the host path the products' outputs are host arrays already:
        // the gate on the host too, bit for bit MLX's (docs/cpu.md, "Host ops").
        let host = match self.gate_up.is_host() {
            true => host::swiglu(&gate_up[0], &gate_up[1])?,
            false => None,
        };
        match host {
            Some(hidden) => Ok(hidden),
            None => fused::swiglu(&gate_up[0], &gate_up[1]),
        }
    }
}
