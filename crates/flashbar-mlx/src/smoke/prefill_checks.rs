//! `flashbar smoke`'s check of the quantized matmul for a prefill's many
//! rows (docs/gpu.md, "A prefill's products in the kernel"): a call of
//! more than 32 rows runs a block per tile of 64 rows (or 32,
//! `FLASHBAR_PREFILL_TILE=32`), and each of its rows must be the bits of a
//! 1-row call, for the plain product, its fused ends and its parts apart,
//! with either tile; and the same bits when run again.

use super::row_invariant_checks::{item, rows_differing, seeded_weight, values};
use super::CheckResult;
use crate::row_invariant::{
    parts_apart, quantized_matmul, quantized_matmul_tiled, quantized_matmul_with, Ends,
};
use mlx_rs::error::Exception;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

/// Rows of the long calls: ten tiles of 32 (a band of eight and a band of
/// two) or five of 64 (one band), the last one part full.
const ROWS: i32 = 300;

/// Rows of 300-row calls that differ from 1-row calls, and elements of a
/// second 300-row call that differ from the first, over the plain product
/// (a 4-bit and an 8-bit shape), the GLU and residual ends, and parts.
pub(crate) fn qmm_prefill() -> Result<CheckResult, Exception> {
    let dtype = Dtype::Bfloat16;
    let mut differing = 0.0;
    let ones = |f: &dyn Fn(std::ops::Range<i32>) -> Result<Array, Exception>| {
        let rows = (0..ROWS)
            .map(|i| f(i..i + 1))
            .collect::<Result<Vec<_>, _>>()?;
        concatenate(&rows, 0)
    };
    // (inputs, outputs, bits, group, GLU and residual ends)
    for (seed, (k, n, bits, group, ends)) in [
        (1024, 512, 4, 64, false),
        (384, 768, 8, 32, false),
        (1024, 2048, 4, 64, true),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 700 + 4 * seed as u64;
        let (wq, scales, biases) = seeded_weight(seed, [n, k], group, bits, ends)?;
        let x = values(seed + 1, &[ROWS, k], dtype)?;
        let residual = values(seed + 2, &[ROWS, n / 2], dtype)?;
        let call = |rows: std::ops::Range<i32>| match ends {
            true => {
                let residual = residual.index(rows.clone());
                let ends = Ends {
                    glu: true,
                    residual: Some(&residual),
                };
                quantized_matmul_with(&x.index(rows), &wq, &scales, &biases, group, bits, ends)
            }
            false => quantized_matmul(&x.index(rows), &wq, &scales, &biases, group, bits),
        };
        let single = ones(&call)?;
        for tile in [32, 64] {
            let tiled = || {
                let ends = match ends {
                    true => Ends {
                        glu: true,
                        residual: Some(&residual),
                    },
                    false => Ends::default(),
                };
                quantized_matmul_tiled(&x, &wq, &scales, &biases, group, bits, ends, &[], tile)
            };
            let long = tiled()?;
            differing += rows_differing(&long, &single, 0)?;
            differing += item(&long.ne(&tiled()?)?.as_dtype(Dtype::Float32)?.sum(None)?)?;
            if !ends {
                // Parts apart: each part's rows as the whole product's columns.
                let widths = [n / 2, n / 4, n / 4];
                let flat = quantized_matmul_tiled(
                    &x,
                    &wq,
                    &scales,
                    &biases,
                    group,
                    bits,
                    Ends::default(),
                    &widths,
                    tile,
                )?;
                let parts = parts_apart(&flat, &[ROWS], &widths)?;
                let mut start = 0;
                for (part, width) in parts.iter().zip(widths) {
                    let same = long.index((.., start..start + width));
                    differing += item(&part.ne(&same)?.as_dtype(Dtype::Float32)?.sum(None)?)?;
                    start += width;
                }
            }
        }
    }
    Ok(CheckResult {
        name: "qmm_prefill_rows_invariant",
        max_error: differing,
        tolerance: 0.0,
        cross_device_tolerance: f64::INFINITY,
        output: Vec::new(),
    })
}
