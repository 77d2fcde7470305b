//! `flashbar smoke`'s checks of the attention head kernel
//! (`row_invariant::attention_head`; docs/gpu.md, "The attention's head in
//! one kernel"), on a GPU: the rows of a T-row call against 1-row calls at
//! their own positions, bit for bit; the queries and keys against MLX's
//! `rms_norm` and `rope` within rounding; the values exactly as given.

use super::row_invariant_checks::{item, largest_relative, rows_differing, values, ROWS};
use super::CheckResult;
use crate::row_invariant::{attention_head, head_params, HeadShape};
use mlx_rs::error::Exception;
use mlx_rs::fast::{rms_norm, rope};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, split_equal};
use mlx_rs::{Array, Dtype};

const EPS: f32 = 1e-6;

/// (heads, KV heads, head dim, RoPE dims, RoPE base): the 9B's, the
/// 35B-A3B's and the embedded target's attention layers.
const SHAPES: [(i32, i32, i32, i32, f32); 3] = [
    (16, 4, 256, 64, 1e7),
    (16, 2, 256, 64, 1e7),
    (6, 2, 64, 16, 1e4),
];

pub(crate) fn head() -> Result<[CheckResult; 3], Exception> {
    let (mut differing, mut versus_ops, mut values_off) = (0.0, 0.0f64, 0.0);
    for (seed, (heads, kv_heads, head_dim, rope_dims, base)) in SHAPES.into_iter().enumerate() {
        let shape = HeadShape {
            heads,
            kv_heads,
            head_dim,
            rope_dims,
            gated: true,
        };
        // f16 on the first shape only: each variant compiles on first use.
        let dtypes: &[Dtype] = if seed == 0 {
            &[Dtype::Bfloat16, Dtype::Float16]
        } else {
            &[Dtype::Bfloat16]
        };
        for &dtype in dtypes {
            let seed = 10 * seed as u64 + u64::from(dtype == Dtype::Float16);
            let t = 32;
            let offset = 517 + 3 * seed as i32;
            let scaled = |s: u64, shape: &[i32], by: f32| -> Result<Array, Exception> {
                values(s, shape, Dtype::Float32)?
                    .multiply(Array::from_f32(by))?
                    .as_dtype(dtype)
            };
            let qg = scaled(1000 + seed, &[1, t, heads * 2 * head_dim], 3.0)?;
            let k = scaled(1010 + seed, &[1, t, kv_heads * head_dim], 3.0)?;
            let v = scaled(1020 + seed, &[1, t, kv_heads * head_dim], 3.0)?;
            // Norm weights around 1, in the activations' type (an f32 `1.0`
            // would promote them to f32).
            let weight = |s: u64| -> Result<Array, Exception> {
                values(s, &[head_dim], Dtype::Float32)?
                    .multiply(Array::from_f32(0.5))?
                    .add(Array::from_f32(1.0))?
                    .as_dtype(dtype)
            };
            let (qw, kw) = (weight(1030 + seed)?, weight(1040 + seed)?);
            let params = head_params(base, 1.0, EPS);
            let call = |from: i32, to: i32| {
                let rows = |a: &Array| a.index((.., from..to, ..));
                attention_head(
                    &rows(&qg),
                    &rows(&k),
                    &rows(&v),
                    &qw,
                    &kw,
                    &params,
                    offset + from,
                    shape,
                )
            };
            let singles = (0..t)
                .map(|i| call(i, i + 1))
                .collect::<Result<Vec<_>, _>>()?;
            let singles: Vec<Array> = (0..3)
                .map(|part| {
                    let rows: Vec<&Array> = singles.iter().map(|s| &s[part]).collect();
                    concatenate(&rows, 2)
                })
                .collect::<Result<_, _>>()?;
            for m in ROWS {
                let batch = call(0, m)?;
                for (out, single) in batch.iter().zip(&singles) {
                    differing += rows_differing(out, &single.index((.., .., ..m, ..)), 2)?;
                }
            }

            // MLX's ops on the same rows, as the layer ran them before.
            let both = qg.reshape(&[1, t, heads, 2 * head_dim])?;
            let queries = &split_equal(&both, 2, -1)?[0];
            let by_ops = |x: &Array, w: &Array, h: i32| -> Result<Array, Exception> {
                let x = x.reshape(&[1, t, h, head_dim])?;
                let normed = rms_norm(&x, Some(w), EPS)?.transpose_axes(&[0, 2, 1, 3])?;
                rope(&normed, rope_dims, false, base, 1.0, offset, None)
            };
            let [q, kk, vv] = call(0, t)?;
            versus_ops = versus_ops.max(largest_relative(&q, &by_ops(queries, &qw, heads)?)?);
            versus_ops = versus_ops.max(largest_relative(&kk, &by_ops(&k, &kw, kv_heads)?)?);
            let given = v
                .reshape(&[1, t, kv_heads, head_dim])?
                .transpose_axes(&[0, 2, 1, 3])?;
            values_off += item(&vv.ne(&given)?.as_dtype(Dtype::Float32)?.sum(None)?)?;
        }
    }
    let result = |name, max_error, tolerance| CheckResult {
        name,
        max_error,
        tolerance,
        cross_device_tolerance: f64::INFINITY,
        output: Vec::new(),
    };
    Ok([
        result("attention_head_rows_invariant", differing, 0.0),
        // Each norm's sum of squares in another order than MLX's, and RoPE's
        // products unfused: a bit of the activations' type at most.
        result("attention_head_vs_ops", versus_ops, 2e-2),
        result("attention_head_values", values_off, 0.0),
    ])
}
