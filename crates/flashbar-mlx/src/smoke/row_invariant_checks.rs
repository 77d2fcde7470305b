//! `flashbar smoke`'s checks of the row-invariant kernels, on a GPU: rows of
//! an M-row call against 1-row calls, bit for bit, and the kernels against
//! MLX's own quantized matmul, attention and conv1d within rounding.

use super::{seeded_values, CheckResult};
use crate::row_invariant::{
    causal_attention, causal_attention_gated_in, causal_attention_in, causal_attention_in_tokens,
    depthwise_conv, full_attention, gather_quantized_matmul, pair_glu_rows, quantized_matmul,
    quantized_matmul_parts, quantized_matmul_with, unpair_glu_columns, Ends,
};
use mlx_rs::error::Exception;
use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{
    concatenate, conv1d, gather_qmm, quantize, quantized_matmul as mlx_quantized_matmul, sigmoid,
    split_equal,
};
use mlx_rs::{Array, Dtype};

/// (inputs, outputs, bits, group) of the layers checked: the embedded
/// pair's 8-bit shapes, the 9B's and the 35B-A3B's 4-bit ones (narrow).
const QMM_SHAPES: [(i32, i32, i32, i32); 5] = [
    (384, 768, 8, 64),
    (1152, 384, 8, 64),
    (4096, 1024, 4, 64),
    (2048, 512, 4, 32),
    (512, 2048, 8, 128),
];
pub(super) const ROWS: [i32; 6] = [1, 2, 15, 16, 17, 32];

pub(super) fn values(seed: u64, shape: &[i32], dtype: Dtype) -> Result<Array, Exception> {
    let count = shape.iter().product::<i32>() as usize;
    Array::from_slice(&seeded_values(seed, count), shape).as_dtype(dtype)
}

/// Rows of `batch` that differ from `singles` (same shape, rows on `axis`).
pub(super) fn rows_differing(batch: &Array, singles: &Array, axis: i32) -> Result<f64, Exception> {
    let other_axes: Vec<i32> = (0..batch.ndim() as i32).filter(|a| *a != axis).collect();
    let differ = batch.ne(singles)?.any_axes(&other_axes, false)?;
    item(&differ.as_dtype(Dtype::Float32)?.sum(None)?)
}

pub(super) fn item(scalar: &Array) -> Result<f64, Exception> {
    scalar
        .try_item_exact::<f32>()
        .map(f64::from)
        .map_err(|e| Exception::custom(e.to_string()))
}

pub(super) fn largest_relative(a: &Array, reference: &Array) -> Result<f64, Exception> {
    let (a, r) = (
        a.as_dtype(Dtype::Float32)?,
        reference.as_dtype(Dtype::Float32)?,
    );
    let diff = item(&a.subtract(&r)?.abs()?.max(None)?)?;
    let scale = item(&r.abs()?.max(None)?)?;
    Ok(diff / scale.max(f64::MIN_POSITIVE))
}

/// A bf16 map of `n` outputs and `k` inputs from `seed`, quantized; with
/// `glu` its rows 0..n/2 are a gate and the rest an up map, paired as the
/// load pairs them.
pub(super) fn seeded_weight(
    seed: u64,
    [n, k]: [i32; 2],
    group: i32,
    bits: i32,
    glu: bool,
) -> Result<(Array, Array, Array), Exception> {
    let w = values(seed, &[n, k], Dtype::Float32)?.multiply(Array::from_f32(0.05))?;
    let (wq, scales, biases) = quantize(&w.as_dtype(Dtype::Bfloat16)?, group, bits)?;
    if !glu {
        return Ok((wq, scales, biases));
    }
    let pair = |a: &Array| -> Result<Array, Exception> {
        let halves = split_equal(a, 2, 0)?;
        pair_glu_rows(&halves[0], &halves[1])
    };
    Ok((pair(&wq)?, pair(&scales)?, pair(&biases)?))
}

/// Every check here gives two results: the rows of many-row calls that
/// differ from 1-row calls (none may), and the largest difference from
/// MLX's own op, within `tolerance`.
pub(super) fn rows_and_reference(
    rows: (&'static str, f64),
    reference: (&'static str, f64),
    tolerance: f64,
    output: Vec<f32>,
) -> [CheckResult; 2] {
    [
        CheckResult {
            name: rows.0,
            max_error: rows.1,
            tolerance: 0.0,
            cross_device_tolerance: f64::INFINITY,
            output: Vec::new(),
        },
        CheckResult {
            name: reference.0,
            max_error: reference.1,
            tolerance,
            cross_device_tolerance: f64::INFINITY,
            output,
        },
    ]
}

/// Returns (rows differing, over every shape, dtype and M; largest
/// difference from MLX relative to its largest value).
pub(crate) fn qmm() -> Result<[CheckResult; 2], Exception> {
    let (mut differing, mut versus_mlx) = (0.0, 0.0f64);
    let mut output = Vec::new();
    for (seed, (k, n, bits, group)) in QMM_SHAPES.into_iter().enumerate() {
        // f16 on the first shape only: MLX compiles each kernel variant on
        // first use, seconds each on CUDA.
        let dtypes: &[Dtype] = if seed == 0 {
            &[Dtype::Bfloat16, Dtype::Float16]
        } else {
            &[Dtype::Bfloat16]
        };
        for &dtype in dtypes {
            let seed = 2 * seed as u64 + u64::from(dtype == Dtype::Float16);
            let w = values(100 + seed, &[n, k], Dtype::Float32)?.multiply(Array::from_f32(0.05))?;
            let (wq, scales, biases) = quantize(&w.as_dtype(dtype)?, group, bits)?;
            let x = values(200 + seed, &[32, k], dtype)?;
            let singles = (0..32)
                .map(|i| quantized_matmul(&x.index(i..i + 1), &wq, &scales, &biases, group, bits))
                .collect::<Result<Vec<_>, _>>()?;
            let singles = concatenate(&singles, 0)?;
            for m in ROWS {
                let batch = quantized_matmul(&x.index(..m), &wq, &scales, &biases, group, bits)?;
                differing += rows_differing(&batch, &singles.index(..m), 0)?;
            }
            let reference = mlx_quantized_matmul(&x, &wq, &scales, &biases, true, group, bits)?;
            versus_mlx = versus_mlx.max(largest_relative(&singles, &reference)?);
            output.extend(super::host_f32(&singles.index(..2))?);
        }
    }
    Ok(rows_and_reference(
        ("qmm_kernel_rows_invariant", differing),
        ("qmm_kernel_vs_mlx", versus_mlx),
        // Weights dequantized to the activations' type before the tensor
        // cores, against MLX's f32 dequantization: rounding only.
        2e-2,
        output,
    ))
}

/// The fused ends (a SwiGLU's gate on a paired gate/up product, a residual
/// added to the output; docs/gpu.md "Fused ends") at an MLP's gate/up shape
/// and an output projection's: rows of M-row calls against 1-row calls, bit
/// for bit, and each fused call against the same steps as separate MLX ops
/// around the plain kernel (the ops a prefill's layers run).
pub(crate) fn qmm_ends() -> Result<[CheckResult; 2], Exception> {
    let (mut differing, mut versus_ops) = (0.0, 0.0f64);
    let mut output = Vec::new();
    // (inputs, outputs of the product, bits, group, GLU)
    for (seed, (k, n, bits, group, glu)) in [
        (384, 2304, 8, 64, true),
        (1024, 2048, 4, 64, true),
        (1024, 384, 8, 64, false),
    ]
    .into_iter()
    .enumerate()
    {
        let dtype = Dtype::Bfloat16;
        let seed = 300 + 4 * seed as u64;
        let (wq, scales, biases) = seeded_weight(seed, [n, k], group, bits, glu)?;
        let out_n = if glu { n / 2 } else { n };
        let x = values(seed + 1, &[32, k], Dtype::Float32)?
            .multiply(Array::from_f32(3.0))?
            .as_dtype(dtype)?;
        let residual = values(seed + 2, &[32, out_n], dtype)?;
        let call = |rows: std::ops::Range<i32>| {
            let residual = residual.index(rows.clone());
            let ends = Ends {
                glu,
                residual: Some(&residual),
            };
            quantized_matmul_with(&x.index(rows), &wq, &scales, &biases, group, bits, ends)
        };
        let singles = (0..32)
            .map(|i| call(i..i + 1))
            .collect::<Result<Vec<_>, _>>()?;
        let singles = concatenate(&singles, 0)?;
        for m in ROWS {
            differing += rows_differing(&call(0..m)?, &singles.index(..m), 0)?;
        }
        let product = quantized_matmul(&x, &wq, &scales, &biases, group, bits)?;
        let out = match glu {
            true => {
                let (gate, up) = unpair_glu_columns(&product)?;
                gate.multiply(sigmoid(&gate)?)?.multiply(&up)?
            }
            false => product,
        };
        versus_ops = versus_ops.max(largest_relative(&singles, &out.add(&residual)?)?);
        output.extend(super::host_f32(&singles.index(..2))?);
    }
    Ok(rows_and_reference(
        ("qmm_fused_ends_rows_invariant", differing),
        ("qmm_fused_ends_vs_ops", versus_ops),
        // The same steps, each rounded to bf16 as MLX's ops round them:
        // apart only where the kernel's sigmoid rounds otherwise.
        1e-2,
        output,
    ))
}

/// A stacked weight's product written part by part
/// ([`quantized_matmul_parts`]; docs/gpu.md, "Stacked maps' parts apart"):
/// each part against the same columns of the whole product, bit for bit,
/// for blocks of 1 to 32 rows (each part of an M-row call is contiguous).
/// Returns the elements that differ, over every shape and M.
pub(crate) fn qmm_parts() -> Result<CheckResult, Exception> {
    let mut differing = 0.0;
    // (inputs, the maps' widths, bits, group): a gated-delta layer's four
    // input maps (narrow) and an attention layer's q/k/v.
    let shapes: [(i32, &[i32], i32, i32); 2] = [
        (512, &[768, 256, 32, 32], 4, 64),
        (384, &[512, 128, 128], 8, 64),
    ];
    for (seed, (k, widths, bits, group)) in shapes.into_iter().enumerate() {
        let dtype = Dtype::Bfloat16;
        let n: i32 = widths.iter().sum();
        let seed = 500 + 4 * seed as u64;
        let w = values(seed, &[n, k], Dtype::Float32)?.multiply(Array::from_f32(0.05))?;
        let (wq, scales, biases) = quantize(&w.as_dtype(dtype)?, group, bits)?;
        let x = values(seed + 1, &[1, 32, k], dtype)?;
        for m in ROWS {
            let x = x.index((.., ..m, ..));
            let whole = quantized_matmul(&x, &wq, &scales, &biases, group, bits)?;
            let parts = quantized_matmul_parts(&x, &wq, &scales, &biases, group, bits, widths)?;
            let mut start = 0;
            for (part, width) in parts.iter().zip(widths) {
                let same_columns = whole.index((.., .., start..start + width));
                differing += item(
                    &part
                        .ne(&same_columns)?
                        .as_dtype(Dtype::Float32)?
                        .sum(None)?,
                )?;
                start += width;
            }
        }
    }
    Ok(CheckResult {
        name: "qmm_parts_vs_whole",
        max_error: differing,
        tolerance: 0.0,
        cross_device_tolerance: f64::INFINITY,
        output: Vec::new(),
    })
}

/// The same two checks for a MoE's experts (docs/gpu.md, "The experts"):
/// 16 experts, 4 a token, up to 32 tokens; each token's rows of an M-token
/// call against a 1-token call (where they sit first in their experts'
/// tiles), bit for bit, and against MLX's `gather_qmm` within rounding.
pub(crate) fn gathered_qmm() -> Result<[CheckResult; 2], Exception> {
    const EXPERTS: i32 = 16;
    const TOP: i32 = 4;
    let (mut differing, mut versus_mlx) = (0.0, 0.0f64);
    let mut output = Vec::new();
    for (seed, (k, n, bits, group)) in [(256, 512, 4, 64), (512, 256, 8, 64)]
        .into_iter()
        .enumerate()
    {
        let dtype = Dtype::Bfloat16;
        let seed = 400 + 4 * seed as u64;
        let w = values(seed, &[EXPERTS, n, k], Dtype::Float32)?.multiply(Array::from_f32(0.05))?;
        let (wq, scales, biases) = quantize(&w.as_dtype(dtype)?, group, bits)?;
        let x = values(seed + 1, &[32, k], dtype)?;
        // Token t meets experts (t + 5j) % 16: distinct, and shared between tokens.
        let experts_of = |t: i32| (0..TOP).map(move |j| (t + 5 * j) % EXPERTS);
        let call = |tokens: std::ops::Range<i32>| {
            let count = tokens.len() as i32;
            let rows: Vec<i32> = (0..count).flat_map(|t| [t; TOP as usize]).collect();
            let experts: Vec<i32> = tokens.clone().flat_map(experts_of).collect();
            gather_quantized_matmul(
                &x.index(tokens),
                &wq,
                &scales,
                &biases,
                &Array::from_slice(&rows, &[count * TOP]),
                &Array::from_slice(&experts, &[count * TOP]),
                count,
                group,
                bits,
            )
        };
        let singles = (0..32)
            .map(|t| call(t..t + 1))
            .collect::<Result<Vec<_>, _>>()?;
        let singles = concatenate(&singles, 0)?;
        for m in ROWS {
            differing += rows_differing(&call(0..m)?, &singles.index(..m * TOP), 0)?;
        }
        let experts: Vec<i32> = (0..32).flat_map(experts_of).collect();
        let indices = Array::from_slice(&experts, &[32, TOP]);
        let reference = gather_qmm(
            &x.expand_dims_axes(&[-2, -3])?,
            &wq,
            &scales,
            &biases,
            None,
            &indices,
            true,
            group,
            bits,
            false,
        )?
        .reshape(&[32 * TOP, n])?;
        versus_mlx = versus_mlx.max(largest_relative(&singles, &reference)?);
        output.extend(super::host_f32(&singles.index(..2))?);
    }
    Ok(rows_and_reference(
        ("qmm_gathered_rows_invariant", differing),
        ("qmm_gathered_vs_mlx", versus_mlx),
        // As for the dense kernel: bf16 dequantization, rounding only.
        2e-2,
        output,
    ))
}

/// The same two checks for the attention kernel: each of 16 queries against
/// a 1-query call over the cache cut after it (causal), or over the same
/// keys (a drafted block). The kernel cuts the cache into chunks of 128
/// keys: contexts inside one chunk, over several, and with the 16 queries
/// on both sides of a chunk's end (264: positions 248..263).
pub(crate) fn attention() -> Result<[CheckResult; 2], Exception> {
    let (mut differing, mut versus_sdpa) = (0.0, 0.0f64);
    for (seed, (heads, kv_heads, dim, length)) in [
        (6, 2, 64, 300),
        (16, 4, 256, 530),
        (8, 8, 128, 40),
        (16, 4, 256, 264),
        (32, 2, 128, 1100),
    ]
    .into_iter()
    .enumerate()
    {
        for dtype in [Dtype::Bfloat16, Dtype::Float32] {
            let seed = 10 * seed as u64 + u64::from(dtype == Dtype::Float32);
            let t = 16;
            let q = values(300 + seed, &[1, heads, t, dim], dtype)?;
            let k = values(400 + seed, &[1, kv_heads, length, dim], dtype)?;
            let v = values(500 + seed, &[1, kv_heads, length, dim], dtype)?;
            let scale = (dim as f32).powf(-0.5);
            let block = causal_attention(&q, &k, &v, scale)?;
            let singles = (0..t)
                .map(|i| {
                    let upto = length - t + i + 1;
                    causal_attention(
                        &q.index((.., .., i..i + 1, ..)),
                        &k.index((.., .., ..upto, ..)),
                        &v.index((.., .., ..upto, ..)),
                        scale,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            differing += rows_differing(&block, &concatenate(&singles, 2)?, 2)?;
            let mask = ScaledDotProductAttentionMask::Causal;
            let reference = scaled_dot_product_attention(&q, &k, &v, scale, Some(mask), None)?;
            versus_sdpa = versus_sdpa.max(largest_relative(&block, &reference)?);
            // A drafted block: every query over every key.
            let block = full_attention(&q, &k, &v, scale)?;
            let singles = (0..t)
                .map(|i| full_attention(&q.index((.., .., i..i + 1, ..)), &k, &v, scale))
                .collect::<Result<Vec<_>, _>>()?;
            differing += rows_differing(&block, &concatenate(&singles, 2)?, 2)?;
            let reference = scaled_dot_product_attention(&q, &k, &v, scale, None, None)?;
            versus_sdpa = versus_sdpa.max(largest_relative(&block, &reference)?);
        }
    }
    Ok(rows_and_reference(
        ("attention_kernel_rows_invariant", differing),
        ("attention_kernel_vs_sdpa", versus_sdpa),
        2e-2,
        Vec::new(),
    ))
}

/// The cache in buffers with room ([`causal_attention_in`]; docs/gpu.md,
/// "A KV cache with room"): 16 queries over the first L positions of a
/// buffer whose tail holds other values, against the same over the L
/// positions alone, bit for bit, and in the token-major form the layers
/// take ([`causal_attention_in_tokens`]). Returns the elements that differ.
pub(crate) fn attention_room() -> Result<CheckResult, Exception> {
    let mut differing = 0.0;
    for (seed, (heads, kv_heads, dim, length)) in
        [(16, 4, 256, 530), (6, 2, 64, 300), (32, 2, 128, 1100)]
            .into_iter()
            .enumerate()
    {
        let dtype = Dtype::Bfloat16;
        let seed = 10 * seed as u64;
        let t = 16;
        let capacity = (length / 256 + 2) * 256;
        let q = values(900 + seed, &[1, heads, t, dim], dtype)?;
        let kb = values(910 + seed, &[1, kv_heads, capacity, dim], dtype)?;
        let vb = values(920 + seed, &[1, kv_heads, capacity, dim], dtype)?;
        let (k, v) = (
            kb.index((.., .., ..length, ..)).contiguous()?,
            vb.index((.., .., ..length, ..)).contiguous()?,
        );
        let scale = (dim as f32).powf(-0.5);
        let exact = causal_attention(&q, &k, &v, scale)?;
        let room = causal_attention_in(&q, &kb, &vb, length, scale)?;
        differing += item(&room.ne(&exact)?.as_dtype(Dtype::Float32)?.sum(None)?)?;
        // The token-major form the layers take, the same values.
        let tokens = causal_attention_in_tokens(&q, &kb, &vb, length, scale, None)?;
        let as_tokens = exact
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[1, t, heads * dim])?;
        differing += item(&tokens.ne(&as_tokens)?.as_dtype(Dtype::Float32)?.sum(None)?)?;
    }
    Ok(CheckResult {
        name: "attention_room_vs_exact",
        max_error: differing,
        tolerance: 0.0,
        cross_device_tolerance: f64::INFINITY,
        output: Vec::new(),
    })
}

/// The gated attention's output gate in the merge
/// ([`causal_attention_gated_in`]; docs/gpu.md, "The attention's gate in its
/// merge"): against [`causal_attention_in`] followed by MLX's `sigmoid` and
/// `multiply` on the gate's view of the query product, as the model's ops
/// run them, bit for bit. Returns the elements that differ.
pub(crate) fn attention_gate() -> Result<CheckResult, Exception> {
    let mut differing = 0.0;
    for (seed, (heads, kv_heads, dim, length, t)) in [
        (16, 4, 256, 530, 16),
        (16, 2, 256, 300, 1),
        (8, 2, 128, 77, 5),
    ]
    .into_iter()
    .enumerate()
    {
        for dtype in [Dtype::Bfloat16, Dtype::Float16] {
            let seed = 10 * seed as u64 + u64::from(dtype == Dtype::Float16);
            let capacity = (length / 256 + 2) * 256;
            let q = values(940 + seed, &[1, heads, t, dim], dtype)?;
            let kb = values(950 + seed, &[1, kv_heads, capacity, dim], dtype)?;
            let vb = values(960 + seed, &[1, kv_heads, capacity, dim], dtype)?;
            // Gate values over [-6, 6): both branches of the sigmoid, and
            // its saturating ends.
            let product = values(970 + seed, &[1, t, heads * 2 * dim], Dtype::Float32)?
                .multiply(Array::from_f32(6.0))?
                .as_dtype(dtype)?;
            let scale = (dim as f32).powf(-0.5);
            let fused = causal_attention_gated_in(&q, &kb, &vb, length, scale, &product)?;
            let out = causal_attention_in(&q, &kb, &vb, length, scale)?;
            let halves =
                mlx_rs::ops::split_equal(&product.reshape(&[1, t, heads, 2 * dim])?, 2, -1)?;
            let gate = halves[1].transpose_axes(&[0, 2, 1, 3])?;
            let ops = out.multiply(mlx_rs::ops::sigmoid(&gate)?)?;
            differing += item(&fused.ne(&ops)?.as_dtype(Dtype::Float32)?.sum(None)?)?;
        }
    }
    Ok(CheckResult {
        name: "attention_gate_in_merge",
        max_error: differing,
        tolerance: 0.0,
        cross_device_tolerance: f64::INFINITY,
        output: Vec::new(),
    })
}

/// The same two checks for the gated-delta layers' depthwise convolution
/// (width 4, as Qwen3.5's): the outputs of a 1-, 2-, 15-, 16-, 17- and
/// 32-position call against 1-position calls, and against MLX's conv1d.
pub(crate) fn conv() -> Result<[CheckResult; 2], Exception> {
    let (mut differing, mut versus_mlx) = (0.0, 0.0f64);
    let width = 4;
    for (seed, channels) in [(0u64, 384), (1, 8192)] {
        for dtype in [Dtype::Bfloat16, Dtype::Float32] {
            let seed = 10 * seed + u64::from(dtype == Dtype::Float32);
            let w = values(600 + seed, &[channels, width, 1], dtype)?;
            for t in ROWS {
                let x = values(700 + seed, &[1, t + width - 1, channels], dtype)?;
                let block = depthwise_conv(&x, &w)?;
                let singles = (0..t)
                    .map(|i| depthwise_conv(&x.index((.., i..i + width, ..)), &w))
                    .collect::<Result<Vec<_>, _>>()?;
                differing += rows_differing(&block, &concatenate(&singles, 1)?, 1)?;
                let reference = conv1d(&x, &w, 1, 0, 1, channels)?;
                versus_mlx = versus_mlx.max(largest_relative(&block, &reference)?);
            }
        }
    }
    Ok(rows_and_reference(
        ("conv_kernel_rows_invariant", differing),
        ("conv_kernel_vs_mlx", versus_mlx),
        2e-2,
        Vec::new(),
    ))
}
