//! `flashbar smoke`'s checks of the fused gated-delta layer kernel
//! ([`gdn_kernels::layer`], CUDA): a block of T tokens against T one-token
//! calls, bit for bit (what makes a verify equal its decode steps), and the
//! tape's replay against the state of the first n one-token calls. The
//! kernel against the op-by-op layer is checked with the models
//! (`flashbar_models::nn::gated_delta::smoke_checks`).

use super::{host_f32, seeded_values, CheckResult};
use crate::gdn_kernels::{self, LayerParams, LayerShape};
use mlx_rs::error::Exception;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

/// A 9B-sized head pair (Dk = Dv = 128, two value heads a key head).
const SHAPE: LayerShape = LayerShape {
    hk: 2,
    hv: 4,
    dk: 128,
    dv: 128,
    conv_kernel: 4,
    qk_eps: 1e-6 / 128.0,
    norm_eps: 1e-6,
    q_scale: 1.0 / 128.0,
    k_scale: 0.088_388_35,
};
const STEPS: i32 = 16;

fn values(seed: u64, shape: &[i32], centre: f32, spread: f32) -> Result<Array, Exception> {
    let count = shape.iter().product::<i32>() as usize;
    let host: Vec<f32> = seeded_values(seed, count)
        .into_iter()
        .map(|x| centre + spread * x)
        .collect();
    Array::from_slice(&host, shape).as_dtype(Dtype::Bfloat16)
}

/// Bits of `a` that differ from `b` (a length mismatch counts as all).
fn differing(a: &Array, b: &Array) -> Result<usize, Exception> {
    let (a, b) = (host_f32(a)?, host_f32(b)?);
    if a.len() != b.len() {
        return Ok(a.len().max(b.len()));
    }
    Ok(a.iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count())
}

/// Returns (values differing between the block and its one-token calls;
/// state values differing between replays and one-token calls).
pub(crate) fn layer() -> Result<[CheckResult; 2], Exception> {
    let (hv, dv, dk) = (SHAPE.hv, SHAPE.dv, SHAPE.dk);
    let channels = 2 * SHAPE.hk * dk + hv * dv;
    let window = SHAPE.conv_kernel - 1;
    let params = LayerParams::new(
        &SHAPE,
        &values(60, &[channels, SHAPE.conv_kernel, 1], 0.0, 0.5)?,
        &values(61, &[hv], 1.0, 0.9)?,
        &values(62, &[hv], 0.5, 0.5)?,
        &values(63, &[dv], 1.0, 0.1)?,
    )?;
    let qkv = values(64, &[1, STEPS, channels], 0.0, 2.0)?;
    let z = values(65, &[1, STEPS, hv * dv], 0.0, 2.0)?;
    let b = values(66, &[1, STEPS, hv], 0.0, 3.0)?;
    let a = values(67, &[1, STEPS, hv], 0.0, 3.0)?;
    let conv0 = values(68, &[1, window, channels], 0.0, 2.0)?;
    let state0 = values(69, &[1, hv, dv, dk], 0.0, 0.5)?.as_dtype(Dtype::Float32)?;

    let block = gdn_kernels::layer(&SHAPE, &params, &qkv, &z, &b, &a, &conv0, &state0)?;
    let (mut conv, mut state) = (conv0.clone(), state0.clone());
    let (mut outs, mut ks, mut gs, mut deltas, mut states) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in 0..STEPS {
        let at = |x: &Array| x.index((.., t..t + 1));
        let step = gdn_kernels::layer(
            &SHAPE,
            &params,
            &at(&qkv),
            &at(&z),
            &at(&b),
            &at(&a),
            &conv,
            &state,
        )?;
        (conv, state) = (step.conv_state, step.state);
        states.push(state.clone());
        outs.push(step.out);
        ks.push(step.k);
        gs.push(step.g);
        deltas.push(step.delta);
    }
    let mut rows = 0;
    for (whole, parts) in [
        (&block.out, &outs),
        (&block.k, &ks),
        (&block.g, &gs),
        (&block.delta, &deltas),
    ] {
        rows += differing(whole, &concatenate(parts, 1)?)?;
    }
    rows += differing(&block.state, &state)?;
    rows += differing(&block.conv_state, &conv)?;

    let mut replayed = 0;
    for n in [0, 1, 7, STEPS] {
        let expected = if n == 0 {
            state0.clone()
        } else {
            states[n as usize - 1].clone()
        };
        let state = gdn_kernels::replay(&state0, &block.k, &block.g, &block.delta, n)?;
        replayed += differing(&state, &expected)?;
    }
    Ok([
        CheckResult {
            name: "gdn_layer_block_vs_steps",
            max_error: rows as f64,
            tolerance: 0.0,
            cross_device_tolerance: 0.0,
            output: host_f32(&block.out)?,
        },
        CheckResult {
            name: "gdn_layer_replay",
            max_error: replayed as f64,
            tolerance: 0.0,
            cross_device_tolerance: 0.0,
            output: Vec::new(),
        },
    ])
}
