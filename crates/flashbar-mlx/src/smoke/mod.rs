//! Numerical smoke checks of the MLX operations Flashbar's models rely on.
//!
//! Each check computes on a given device from inputs made by a seeded host
//! generator, compares with a reference computed independently (in f64 on the
//! host, or through a different MLX path), and keeps its raw output so that
//! the same check on two devices (CPU vs CUDA) can be compared as well.

mod gdn_layer_checks;
mod head_checks;
mod moe_checks;
mod prefill_checks;
mod row_invariant_checks;

use crate::device::Backend;
use crate::{gdn_kernels, row_invariant};
use half::{bf16, f16};
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{dequantize, gather_qmm, matmul, quantize, quantized_matmul, repeat_axis, stack};
use mlx_rs::{with_device, Array, ArrayElement, Device, Dtype};
use std::path::Path;

/// The outcome of one check on one device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckResult {
    pub name: &'static str,
    /// Largest error against the reference, in the check's own unit.
    pub max_error: f64,
    pub tolerance: f64,
    /// How far this output may differ between two devices, relative to its
    /// largest value (see [`relative_difference`]).
    pub cross_device_tolerance: f64,
    /// Raw output values, for comparing the same check across devices.
    #[serde(skip)]
    pub output: Vec<f32>,
}

impl CheckResult {
    pub fn passed(&self) -> bool {
        self.max_error <= self.tolerance
    }
}

/// `moe` keeps, of the GPU-only checks, the MoE block's alone (a short
/// GPU call on a machine whose kernel caches are cold).
pub const SMOKE_ONLY_ENV: &str = "FLASHBAR_SMOKE_ONLY";

/// Runs every check on `backend`'s device; `scratch` is a folder for the
/// safetensors file. `done` sees each result as soon as it is known (a GPU
/// run compiles kernels for minutes; a run cut short still says how far it
/// got).
pub fn run_all(
    backend: Backend,
    scratch: &Path,
    done: &mut dyn FnMut(&CheckResult),
) -> Result<Vec<CheckResult>, Exception> {
    with_device(backend.device(), || {
        let mut checks = Vec::new();
        let mut add = |new: Vec<CheckResult>| {
            new.iter().for_each(&mut *done);
            checks.extend(new);
        };
        add(vec![matmul_f32(backend)?]);
        add(vec![quantize_4bit()?]);
        add(vec![quantized_matmul_4bit()?]);
        add(vec![gather_qmm_4bit()?]);
        add(vec![safetensors_round_trip(
            &scratch.join("smoke.safetensors"),
        )?]);
        add(vec![half_round_trip()?]);
        // GPU-only checks go last, so that the checks both devices run line up.
        let moe_only = std::env::var(SMOKE_ONLY_ENV).as_deref() == Ok("moe");
        if gdn_kernels::available(backend) && !moe_only {
            add(vec![gdn_kernel_vs_ops()?]);
        }
        if row_invariant::available(backend) && !moe_only {
            add(row_invariant_checks::qmm()?.into());
            add(row_invariant_checks::qmm_ends()?.into());
            add(vec![row_invariant_checks::qmm_parts()?]);
            add(vec![prefill_checks::qmm_prefill()?]);
            add(row_invariant_checks::gathered_qmm()?.into());
            add(row_invariant_checks::attention()?.into());
            add(vec![row_invariant_checks::attention_room()?]);
            add(vec![row_invariant_checks::attention_gate()?]);
            add(head_checks::head()?.into());
            add(row_invariant_checks::conv()?.into());
        }
        if row_invariant::available(backend) {
            add(moe_checks::moe_block()?);
        }
        if gdn_kernels::layer_available(backend) && !moe_only {
            add(gdn_layer_checks::layer()?.into());
        }
        Ok(checks)
    })
}

/// Largest |a - b| between two outputs of the same check, e.g. CPU vs GPU,
/// relative to the largest |a|. None if their lengths differ.
pub fn relative_difference(a: &[f32], b: &[f32]) -> Option<f64> {
    (a.len() == b.len()).then(|| max_abs_diff(a, b) / max_abs(a).max(f64::MIN_POSITIVE))
}

/// A deterministic stream of values in [-1, 1) (xorshift64*), the same on every machine.
pub fn seeded_values(seed: u64, count: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
            (bits as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

/// MLX's CUDA backend multiplies f32 matrices in TF32 (10-bit mantissa)
/// unless `MLX_ENABLE_TF32=0`; other backends keep full f32.
pub fn f32_matmul_tolerance(backend: Backend) -> f64 {
    let tf32 = backend == Backend::Cuda
        && std::env::var("MLX_ENABLE_TF32").map_or(true, |v| v.trim() != "0");
    if tf32 {
        2e-3
    } else {
        1e-5
    }
}

fn matmul_f32(backend: Backend) -> Result<CheckResult, Exception> {
    let (m, k, n) = (48, 96, 40);
    let a = seeded_values(1, m * k);
    let b = seeded_values(2, k * n);
    let out = matmul(
        Array::from_slice(&a, &[m as i32, k as i32]),
        Array::from_slice(&b, &[k as i32, n as i32]),
    )?;
    let output = to_f32_vec(&out)?;
    let mut reference = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
            reference[i * n + j] = dot as f32;
        }
    }
    Ok(CheckResult {
        name: "matmul_f32",
        max_error: max_abs_diff(&output, &reference) / max_abs(&reference),
        tolerance: f32_matmul_tolerance(backend),
        cross_device_tolerance: f32_matmul_tolerance(backend),
        output,
    })
}

/// 4-bit affine quantization: every weight comes back within one step of its
/// group (MLX moves the scale so that the group's edge value is exact, which
/// can cost up to a whole step rather than half of one).
fn quantize_4bit() -> Result<CheckResult, Exception> {
    let (rows, cols, group) = (64, 256, 64);
    let values = seeded_values(3, rows * cols);
    let w = Array::from_slice(&values, &[rows as i32, cols as i32]);
    let (wq, scales, biases) = quantize(&w, group, 4)?;
    let w_hat = to_f32_vec(&dequantize(&wq, &scales, &biases, group, 4)?)?;
    let scales = to_f32_vec(&scales)?;
    let worst_steps = (0..rows * cols)
        .map(|i| ((values[i] - w_hat[i]).abs() / scales[i / group as usize].abs()) as f64)
        .fold(0.0, f64::max);
    Ok(CheckResult {
        name: "quantize_4bit",
        max_error: worst_steps,
        tolerance: 1.0 + 1e-3,
        cross_device_tolerance: 1e-6,
        output: w_hat,
    })
}

/// quantized_matmul against matmul with the dequantized weight.
fn quantized_matmul_4bit() -> Result<CheckResult, Exception> {
    let (rows, cols, batch, group) = (64, 256, 8, 64);
    let w = Array::from_slice(&seeded_values(3, rows * cols), &[rows as i32, cols as i32]);
    let x = Array::from_slice(
        &seeded_values(4, batch * cols),
        &[batch as i32, cols as i32],
    );
    let (wq, scales, biases) = quantize(&w, group, 4)?;
    let w_hat = dequantize(&wq, &scales, &biases, group, 4)?;
    let out = quantized_matmul(&x, &wq, &scales, &biases, true, group, 4)?;
    let reference = matmul(&x, w_hat.transpose_axes(&[1, 0])?)?;
    let output = to_f32_vec(&out)?;
    let reference = to_f32_vec(&reference)?;
    Ok(CheckResult {
        name: "quantized_matmul_4bit",
        max_error: max_abs_diff(&output, &reference) / max_abs(&reference),
        // GPU kernels accumulate in a different order than dequantize + matmul.
        tolerance: 2e-3,
        cross_device_tolerance: 2e-3,
        output,
    })
}

/// gather_qmm over stacked 4-bit experts == quantized_matmul with each chosen expert.
fn gather_qmm_4bit() -> Result<CheckResult, Exception> {
    let (experts, rows, cols, group) = (4usize, 32usize, 128usize, 64);
    let mut packed = Vec::new();
    let mut scales = Vec::new();
    let mut biases = Vec::new();
    for e in 0..experts {
        let w = Array::from_slice(
            &seeded_values(10 + e as u64, rows * cols),
            &[rows as i32, cols as i32],
        );
        let (wq, s, b) = quantize(&w, group, 4)?;
        packed.push(wq);
        scales.push(s);
        biases.push(b);
    }
    let (wq, s, b) = (stack(&packed, 0)?, stack(&scales, 0)?, stack(&biases, 0)?);
    let chosen: [u32; 3] = [2, 0, 3];
    let x = Array::from_slice(
        &seeded_values(20, chosen.len() * cols),
        &[3, 1, cols as i32],
    );
    let indices = Array::from_slice(&chosen, &[3]);
    let out = gather_qmm(&x, &wq, &s, &b, None, &indices, true, group, 4, false)?;
    let output = to_f32_vec(&out)?;

    let mut reference = Vec::new();
    for (row, &expert) in chosen.iter().enumerate() {
        let e = expert as usize;
        let xi = Array::from_slice(
            &to_f32_vec(&x)?[row * cols..(row + 1) * cols],
            &[1, cols as i32],
        );
        let yi = quantized_matmul(&xi, &packed[e], &scales[e], &biases[e], true, group, 4)?;
        reference.extend(to_f32_vec(&yi)?);
    }
    Ok(CheckResult {
        name: "gather_qmm_4bit",
        max_error: max_abs_diff(&output, &reference) / max_abs(&reference),
        tolerance: 1e-5,
        cross_device_tolerance: 2e-3,
        output,
    })
}

/// Writes f32, bf16, f16 and packed u32 tensors and reads them back bit for bit.
fn safetensors_round_trip(path: &Path) -> Result<CheckResult, Exception> {
    let values = seeded_values(30, 64);
    let f32s = Array::from_slice(&values, &[8, 8]);
    let bf16s = f32s.as_dtype(Dtype::Bfloat16)?;
    let f16s = f32s.as_dtype(Dtype::Float16)?;
    let (packed, _, _) = quantize(
        Array::from_slice(&seeded_values(31, 64 * 64), &[64, 64]),
        64,
        4,
    )?;
    let tensors = [
        ("a.f32", &f32s),
        ("a.bf16", &bf16s),
        ("a.f16", &f16s),
        ("a.packed", &packed),
    ];
    Array::save_safetensors(tensors, None, path).map_err(io_exception)?;
    let loaded = Array::load_safetensors(path).map_err(io_exception)?;
    let mut mismatches = 0usize;
    for (name, original) in tensors {
        let Some(read) = loaded.get(name) else {
            mismatches += 1;
            continue;
        };
        if read.dtype() != original.dtype() || read.shape() != original.shape() {
            mismatches += 1;
            continue;
        }
        let same = mlx_rs::ops::array_eq(read, original, false)?;
        mismatches += usize::from(!scalar::<bool>(&same)?);
    }
    Ok(CheckResult {
        name: "safetensors_round_trip",
        max_error: mismatches as f64,
        tolerance: 0.0,
        cross_device_tolerance: 0.0,
        output: to_f32_vec(&loaded["a.bf16"])?,
    })
}

/// f16 / bf16 conversions and the half-precision host accessors (which need
/// mlx-sys' x86_64 half shim): exact for representable values, and within
/// half a unit in the last place otherwise.
fn half_round_trip() -> Result<CheckResult, Exception> {
    let exact: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
    let exact_array = Array::from_slice(&exact, &[64]);
    let as_f16 = exact_array.as_dtype(Dtype::Float16)?;
    let as_bf16 = exact_array.as_dtype(Dtype::Bfloat16)?;
    let f16_host = host::<f16>(&as_f16)?;
    let bf16_host = host::<bf16>(&as_bf16)?;
    let mut error = 0.0f64;
    for (i, &value) in exact.iter().enumerate() {
        error = error.max((f16_host[i].to_f32() - value).abs() as f64);
        error = error.max((bf16_host[i].to_f32() - value).abs() as f64);
    }
    let first_f16 = scalar::<f16>(&as_f16.index(0))?.to_f32();
    let first_bf16 = scalar::<bf16>(&as_bf16.index(0))?.to_f32();
    error = error.max((first_f16 - exact[0]).abs() as f64);
    error = error.max((first_bf16 - exact[0]).abs() as f64);

    // Arbitrary values: rounding error relative to the value, in units of each
    // format's half-ulp (2^-11 for f16, 2^-8 for bf16); must stay <= 1.
    let values = seeded_values(40, 256);
    let array = Array::from_slice(&values, &[256]);
    let f16_back = to_f32_vec(&array.as_dtype(Dtype::Float16)?)?;
    let bf16_back = to_f32_vec(&array.as_dtype(Dtype::Bfloat16)?)?;
    let mut worst_half_ulps = 0.0f64;
    for i in 0..values.len() {
        let magnitude = values[i].abs().max(1e-3) as f64;
        let e16 = (f16_back[i] - values[i]).abs() as f64 / magnitude / 2f64.powi(-11);
        let eb16 = (bf16_back[i] - values[i]).abs() as f64 / magnitude / 2f64.powi(-8);
        worst_half_ulps = worst_half_ulps.max(e16).max(eb16);
    }
    Ok(CheckResult {
        name: "half_round_trip",
        // Exact values must be exact; the rest within one half-ulp.
        max_error: if error > 0.0 {
            f64::INFINITY
        } else {
            worst_half_ulps
        },
        tolerance: 1.0,
        cross_device_tolerance: 0.0,
        output: bf16_back,
    })
}

/// The custom gated-delta kernels ([`gdn_kernels`], GPU only) against the
/// MLX-ops recurrence computed on the CPU: `record`'s y, new state and delta
/// tape within 1e-4 of it, relative to each output's largest value. And
/// `replay` of the tape for n = 0, 7 and T steps must give, bit for bit, the
/// state that recording those n steps gives; otherwise the error is infinite.
fn gdn_kernel_vs_ops() -> Result<CheckResult, Exception> {
    let (b, t, hk, hv, dk, dv) = (1, 16, 2, 4, 32, 16);
    let values = |seed: u64, shape: &[i32], centre: f32, spread: f32| {
        let count = shape.iter().product::<i32>() as usize;
        let values: Vec<f32> = seeded_values(seed, count)
            .into_iter()
            .map(|x| centre + spread * x)
            .collect();
        (values, shape.to_vec())
    };
    let host = [
        values(50, &[b, t, hk, dk], 0.0, 0.25), // q
        values(51, &[b, t, hk, dk], 0.0, 0.25), // k
        values(52, &[b, t, hv, dv], 0.0, 1.0),  // v
        values(53, &[b, t, hv], 0.75, 0.24),    // g in (0.5, 1)
        values(54, &[b, t, hv], 0.5, 0.49),     // beta in (0, 1)
        values(55, &[b, hv, dv, dk], 0.0, 0.5), // state
    ];
    let arrays = || {
        host.each_ref()
            .map(|(v, shape)| Array::from_slice(v, shape))
    };
    let [q, k, v, g, beta, state] = arrays();

    let (y, new_state, delta) = gdn_kernels::record(&q, &k, &v, &g, &beta, &state)?;
    let reference = with_device(Device::cpu(), || {
        let [q, k, v, g, beta, state] = arrays();
        gdn_ops_reference(&q, &k, &v, &g, &beta, state)
    })?;
    let mut error = 0.0f64;
    for (output, reference) in [
        (&y, &reference.0),
        (&new_state, &reference.1),
        (&delta, &reference.2),
    ] {
        let (output, reference) = (to_f32_vec(output)?, to_f32_vec(reference)?);
        if output.len() != reference.len() {
            return Err(Exception::custom("gdn_kernel_vs_ops: output sizes differ"));
        }
        error = error.max(max_abs_diff(&output, &reference) / max_abs(&reference));
    }

    let prefix = |a: &Array, n: i32| a.index((.., ..n));
    let n = 7;
    let (_, after_n, _) = gdn_kernels::record(
        &prefix(&q, n),
        &prefix(&k, n),
        &prefix(&v, n),
        &prefix(&g, n),
        &prefix(&beta, n),
        &state,
    )?;
    let mut exact = true;
    for (n, recorded) in [(0, &state), (n, &after_n), (t, &new_state)] {
        let replayed = to_f32_vec(&gdn_kernels::replay(&state, &k, &g, &delta, n)?)?;
        let recorded = to_f32_vec(recorded)?;
        exact &= replayed.len() == recorded.len()
            && replayed
                .iter()
                .zip(&recorded)
                .all(|(a, b)| a.to_bits() == b.to_bits());
    }
    Ok(CheckResult {
        name: "gdn_kernel_vs_ops",
        max_error: if exact { error } else { f64::INFINITY },
        tolerance: 1e-4,
        cross_device_tolerance: 1e-4,
        output: to_f32_vec(&y)?,
    })
}

/// The gated delta recurrence with MLX ops, as flashbar-models' `recurrence`
/// computes it, also returning the per-step delta: (y, state, delta).
fn gdn_ops_reference(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    mut state: Array,
) -> Result<(Array, Array, Array), Exception> {
    let repeat = v.shape()[2] / q.shape()[2];
    let q = repeat_axis::<f32>(q.clone(), repeat, 2)?;
    let k = repeat_axis::<f32>(k.clone(), repeat, 2)?;
    let mut ys = Vec::new();
    let mut deltas = Vec::new();
    for t in 0..q.shape()[1] {
        let q_t = q.index((.., t)); // [B, H, Dk]
        let k_t = k.index((.., t)).expand_dims(-2)?; // [B, H, 1, Dk]
        let v_t = v.index((.., t)); // [B, H, Dv]
        let g_t = g.index((.., t)).expand_dims_axes(&[-1, -2])?; // [B, H, 1, 1]
        let beta_t = beta.index((.., t)).expand_dims(-1)?; // [B, H, 1]

        state = state.multiply(&g_t)?;
        let kv = state.multiply(&k_t)?.sum_axis(-1, false)?; // [B, H, Dv]
        let delta = v_t.subtract(&kv)?.multiply(&beta_t)?;
        state = state.add(k_t.multiply(delta.expand_dims(-1)?)?)?;
        ys.push(state.multiply(q_t.expand_dims(-2)?)?.sum_axis(-1, false)?);
        deltas.push(delta);
    }
    Ok((stack(&ys, 1)?, state, stack(&deltas, 1)?))
}

fn to_f32_vec(array: &Array) -> Result<Vec<f32>, Exception> {
    host::<f32>(&array.as_dtype(Dtype::Float32)?)
}

/// An array's values as f32 on the host.
pub fn host_f32(array: &Array) -> Result<Vec<f32>, Exception> {
    to_f32_vec(array)
}

/// Evaluates and copies an array to the host (errors, never panics).
fn host<T: ArrayElement + Copy>(array: &Array) -> Result<Vec<T>, Exception> {
    array.eval()?;
    let slice = array
        .try_as_slice::<T>()
        .map_err(|e| Exception::custom(e.to_string()))?;
    Ok(slice.to_vec())
}

fn scalar<T: ArrayElement>(array: &Array) -> Result<T, Exception> {
    array
        .try_item_exact::<T>()
        .map_err(|e| Exception::custom(e.to_string()))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
}

fn max_abs(values: &[f32]) -> f64 {
    values.iter().map(|v| v.abs() as f64).fold(0.0, f64::max)
}

fn io_exception(error: mlx_rs::error::IoError) -> Exception {
    Exception::custom(error.to_string())
}
