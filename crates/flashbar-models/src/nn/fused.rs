//! The layers' small elementwise chains as plain MLX ops. mlx-rs's
//! compiled functions (its `nn::silu` among them) cost the host some 30 us
//! a call on the H200, more than the launches they save: compiling the
//! MLP's `silu(gate) * up` and the attention's output gate into one kernel
//! each ran the embedded target at ~1,000 tok/s against ~1,450 for the ops
//! one by one (docs/gpu.md, "Fewer calls"). Elementwise, so every row is
//! computed alike whatever the number of rows. `FLASHBAR_COMPILE_OPS=1`
//! takes mlx-rs's compiled `silu` instead, for benchmarks.

use crate::error::Result;
use mlx_rs::ops::sigmoid;
use mlx_rs::Array;

/// `1` runs the MLP's gate through mlx-rs's compiled `silu`.
pub const COMPILE_OPS_ENV: &str = "FLASHBAR_COMPILE_OPS";

fn compiled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(COMPILE_OPS_ENV).as_deref() == Ok("1"))
}

/// `silu(gate) * up`, the MLP's gate, with silu as mlx-rs computes it:
/// `x * sigmoid(x)`.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    if compiled() {
        return Ok(mlx_rs::nn::silu(gate)?.multiply(up)?);
    }
    Ok(gate.multiply(sigmoid(gate)?)?.multiply(up)?)
}

/// `x * sigmoid(gate)`, the gated attention's output gate.
pub fn sigmoid_gate(x: &Array, gate: &Array) -> Result<Array> {
    Ok(x.multiply(sigmoid(gate)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::Dtype;

    /// The ops give what mlx-rs's compiled silu gives, bit for bit, in f32
    /// and bf16, on strided views (a stacked map's columns).
    #[test]
    fn the_ops_equal_the_compiled_silu() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let v: Vec<f32> = (0..512)
                .map(|i| ((i as f32 + 1.0) * 0.37).sin() * 6.0)
                .collect();
            let both = Array::from_slice(&v, &[2, 256]).as_dtype(dtype).unwrap();
            let halves = mlx_rs::ops::split_equal(&both, 2, -1).unwrap();
            let (gate, up) = (&halves[0], &halves[1]);
            let ours = swiglu(gate, up).unwrap();
            let compiled = mlx_rs::nn::silu(gate).unwrap().multiply(up).unwrap();
            assert_eq!(ours.dtype(), dtype);
            let (ours, compiled) = (
                ours.as_dtype(Dtype::Float32).unwrap(),
                compiled.as_dtype(Dtype::Float32).unwrap(),
            );
            assert_eq!(
                ours.as_slice::<f32>(),
                compiled.as_slice::<f32>(),
                "{dtype:?}"
            );
        }
    }
}
