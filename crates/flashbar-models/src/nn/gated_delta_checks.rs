//! `flashbar smoke`'s checks of a whole gated-delta layer on a GPU with the
//! fused kernel ([`gdn_kernels::layer`], docs/gpu.md "One kernel per
//! gated-delta layer"): against the same layer op by op, and a verified block
//! against its decode steps, bit for bit. A 4-bit layer of 9B-sized heads,
//! so its maps run on the row-invariant quantized matmul as a real
//! checkpoint's do.

use crate::config::{QuantParams, Quantization, TextConfig};
use crate::error::Result;
use crate::nn::gated_delta::{GatedDeltaNet, GdnState};
use crate::nn::linear::Weights;
use flashbar_mlx::gdn_kernels;
use flashbar_mlx::smoke::{host_f32, seeded_values, CheckResult};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, quantize};
use mlx_rs::{Array, Dtype};
use std::collections::HashMap;

const HIDDEN: i32 = 256;
const HK: i32 = 2;
const HV: i32 = 4;
const DK: i32 = 128;
const DV: i32 = 128;
const K: i32 = 4;
const PREFILL: i32 = 5;
const BLOCK: i32 = 16;

fn config() -> Result<TextConfig> {
    let json = serde_json::json!({
        "hidden_size": HIDDEN, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 16,
        "linear_num_value_heads": HV, "linear_num_key_heads": HK,
        "linear_key_head_dim": DK, "linear_value_head_dim": DV,
        "linear_conv_kernel_dim": K,
    });
    Ok(serde_json::from_value(json)
        .map_err(|e| mlx_rs::error::Exception::custom(format!("smoke config: {e}")))?)
}

fn values(seed: u64, shape: &[i32], centre: f32, spread: f32, dtype: Dtype) -> Result<Array> {
    let count = shape.iter().product::<i32>() as usize;
    let host: Vec<f32> = seeded_values(seed, count)
        .into_iter()
        .map(|x| centre + spread * x)
        .collect();
    Ok(Array::from_slice(&host, shape).as_dtype(dtype)?)
}

/// One layer's tensors in `dtype`, its linear maps 4-bit (group 64).
fn tensors(dtype: Dtype) -> Result<HashMap<String, Array>> {
    let channels = 2 * HK * DK + HV * DV;
    let mut map = HashMap::new();
    let maps = [
        ("in_proj_qkv", channels, HIDDEN),
        ("in_proj_z", HV * DV, HIDDEN),
        ("in_proj_b", HV, HIDDEN),
        ("in_proj_a", HV, HIDDEN),
        ("out_proj", HIDDEN, HV * DV),
    ];
    for (seed, (name, rows, cols)) in maps.into_iter().enumerate() {
        let w = values(
            70 + seed as u64,
            &[rows, cols],
            0.0,
            1.0 / (cols as f32).sqrt(),
            dtype,
        )?;
        let (packed, scales, biases) = quantize(&w, 64, 4)?;
        map.insert(format!("l.{name}.weight"), packed);
        map.insert(format!("l.{name}.scales"), scales);
        map.insert(format!("l.{name}.biases"), biases);
    }
    map.insert(
        "l.conv1d.weight".into(),
        values(80, &[channels, K, 1], 0.0, 0.5, dtype)?,
    );
    map.insert("l.dt_bias".into(), values(81, &[HV], 0.5, 0.5, dtype)?);
    map.insert(
        "l.A_log".into(),
        values(82, &[HV], 1.0, 0.9, Dtype::Float32)?,
    );
    map.insert("l.norm.weight".into(), values(83, &[DV], 1.0, 0.1, dtype)?);
    Ok(map)
}

fn layer(map: &HashMap<String, Array>, fused: bool) -> Result<GatedDeltaNet> {
    let quantization = Quantization {
        default: Some(QuantParams {
            group_size: 64,
            bits: 4,
        }),
        ..Quantization::default()
    };
    let mut weights = Weights::new(map.clone(), quantization);
    let mut layer = GatedDeltaNet::load(&mut weights, "l", &config()?)?;
    if !fused {
        layer.drop_fused_kernel();
    }
    Ok(layer)
}

/// A prefill, then a block, on `layer`: the block's output.
fn prefill_then_block(layer: &GatedDeltaNet, x: &Array) -> Result<(Array, GdnState)> {
    let mut state = GdnState::default();
    layer.forward(&x.index((.., ..PREFILL)), &mut state)?;
    let out = layer.forward(&x.index((.., PREFILL..)), &mut state)?;
    Ok((out, state))
}

fn largest_relative(a: &Array, reference: &Array) -> Result<f64> {
    let (a, r) = (host_f32(a)?, host_f32(reference)?);
    let scale = r.iter().map(|v| v.abs() as f64).fold(0.0, f64::max);
    let diff = a
        .iter()
        .zip(&r)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max);
    Ok(if a.len() == r.len() {
        diff / scale.max(f64::MIN_POSITIVE)
    } else {
        f64::INFINITY
    })
}

/// The checks, on the current device (a GPU with [`gdn_kernels::layer`]).
pub fn smoke_checks() -> Result<Vec<CheckResult>> {
    let mut checks = Vec::new();
    // f32: only the order of a few sums and the exp/log implementations
    // differ; bf16: those can move an intermediate by one bf16 step.
    for (dtype, name, tolerance) in [
        (Dtype::Float32, "gdn_layer_vs_ops_f32", 1e-4),
        (Dtype::Bfloat16, "gdn_layer_vs_ops_bf16", 3e-2),
    ] {
        let map = tensors(dtype)?;
        let x = values(84, &[1, PREFILL + BLOCK, HIDDEN], 0.0, 1.0, dtype)?;
        let (fused, _) = prefill_then_block(&layer(&map, true)?, &x)?;
        let (ops, _) = prefill_then_block(&layer(&map, false)?, &x)?;
        checks.push(CheckResult {
            name,
            max_error: largest_relative(&fused, &ops)?,
            tolerance,
            cross_device_tolerance: tolerance,
            output: host_f32(&fused)?,
        });
    }

    // A verified block against its decode steps: every output value and
    // the state after it, bit for bit.
    let map = tensors(Dtype::Bfloat16)?;
    let fused = layer(&map, true)?;
    let x = values(85, &[1, PREFILL + BLOCK, HIDDEN], 0.0, 1.0, Dtype::Bfloat16)?;
    let (block, block_state) = prefill_then_block(&fused, &x)?;
    let mut state = GdnState::default();
    fused.forward(&x.index((.., ..PREFILL)), &mut state)?;
    let steps = (PREFILL..PREFILL + BLOCK)
        .map(|t| fused.forward(&x.index((.., t..t + 1)), &mut state))
        .collect::<Result<Vec<_>>>()?;
    let steps = concatenate(&steps, 1)?;
    let mut differing = 0usize;
    let mut pairs = vec![(block, steps)];
    match (block_state.conv_and_ssm()?, state.conv_and_ssm()?) {
        (Some((conv_a, ssm_a)), Some((conv_b, ssm_b))) => {
            pairs.push((ssm_a, ssm_b));
            pairs.push((conv_a, conv_b));
        }
        _ => differing += 2,
    }
    for (a, b) in &pairs {
        let (a, b) = (host_f32(a)?, host_f32(b)?);
        differing += if a.len() == b.len() {
            a.iter()
                .zip(&b)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count()
        } else {
            a.len().max(b.len())
        };
    }
    checks.push(CheckResult {
        name: "gdn_layer_block_vs_decode",
        max_error: differing as f64,
        tolerance: 0.0,
        cross_device_tolerance: 0.0,
        output: Vec::new(),
    });
    Ok(checks)
}

/// Whether this device runs the checks.
pub fn available() -> bool {
    gdn_kernels::layer_available(flashbar_mlx::device::current())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(a: &Array) -> Vec<u32> {
        host_f32(a).unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// On the CPU a bf16 layer keeps its cache on the host; moved to MLX
    /// arrays (as a forward on MLX's path does) it holds the same values in
    /// the arrays' types, and the next step from it is the next step from
    /// the cache that stayed, bit for bit, output and cache.
    #[test]
    fn a_host_cache_moves_to_arrays_and_back_unchanged() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let map = tensors(Dtype::Bfloat16).unwrap();
        let layer = layer(&map, false).unwrap();
        let x = values(86, &[1, PREFILL + 1, HIDDEN], 0.0, 1.0, Dtype::Bfloat16).unwrap();
        let mut held = GdnState::default();
        layer.forward(&x.index((.., ..PREFILL)), &mut held).unwrap();
        assert!(held.host.is_some() && held.arrays().next().is_none());

        let mut moved = held.clone();
        moved.move_to_arrays().unwrap();
        assert!(moved.host.is_none());
        let (conv, ssm) = moved.conv_and_ssm().unwrap().unwrap();
        assert_eq!(
            (conv.dtype(), ssm.dtype()),
            (Dtype::Bfloat16, Dtype::Float32)
        );
        assert_eq!(conv.shape(), [1, K - 1, 2 * HK * DK + HV * DV]);
        assert_eq!(ssm.shape(), [1, HV, DV, DK]);
        let (held_conv, held_ssm) = held.conv_and_ssm().unwrap().unwrap();
        assert_eq!(bits(&conv), bits(&held_conv));
        assert_eq!(bits(&ssm), bits(&held_ssm));
        assert!(
            bits(&ssm).iter().any(|&b| b != 0),
            "the prefill moved the state"
        );

        let step = x.index((.., PREFILL..));
        let from_held = layer.forward(&step, &mut held).unwrap();
        let from_moved = layer.forward(&step, &mut moved).unwrap();
        assert_eq!(bits(&from_held), bits(&from_moved));
        let (a, b) = (
            held.conv_and_ssm().unwrap().unwrap(),
            moved.conv_and_ssm().unwrap().unwrap(),
        );
        assert_eq!((bits(&a.0), bits(&a.1)), (bits(&b.0), bits(&b.1)));
    }
}
