//! Column-panel kernels for bf16 weights: each output summed in k order,
//! in f32 or with MLX's CPU bf16 roundings ([`ColumnSum`]), vectorised
//! across the columns of a panel so every lane keeps its column's order.

use super::*;

/// How a product by bf16 weights sums, for bf16 inputs: what MLX's CPU
/// kernels do (docs/cpu.md, "Parity with mlx-lm").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnSum {
    /// MLX's quantized matmul in bf16: every product and every partial sum
    /// rounded to bf16, in k order.
    Bf16,
    /// MLX's bf16 gemm: the products and their sum in f32, in k order,
    /// rounded to bf16 once at the end (by the caller).
    F32,
}

/// Columns of a panel: weights stored by columns are kept as panels of
/// this many, each `[k, PANEL]` contiguous, so a strip of columns reads its
/// weights in one sequential stream per panel.
pub const PANEL: usize = 16;

/// One output of [`matmul_columns`]: row `x` against column `col` of the
/// panels `w`, summed in k order as `sum` says. The reference for the
/// vector kernels (same bits) and their tail.
#[inline]
pub(super) fn column_scalar(x: &[f32], w: &[bf16], col: usize, sum: ColumnSum) -> f32 {
    let k = x.len();
    let panel = &w[col / PANEL * k * PANEL..][..k * PANEL];
    let lane = col % PANEL;
    let mut acc = 0f32;
    for (i, &xv) in x.iter().enumerate() {
        let w = panel[i * PANEL + lane].widen();
        acc = match sum {
            ColumnSum::Bf16 => round_bf16_finite(acc + round_bf16_finite(xv * w)),
            ColumnSum::F32 => acc + xv * w,
        };
    }
    acc
}

/// [`round_bf16`] without its NaN case: the kernels' rounding, where a NaN
/// (from a NaN or infinite input) stays a NaN but may change its sign.
#[inline(always)]
pub(super) fn round_bf16_finite(x: f32) -> f32 {
    let u = x.to_bits();
    f32::from_bits(u.wrapping_add(0x7FFF + ((u >> 16) & 1)) & 0xFFFF_0000)
}

/// [`round_bf16_finite`] of eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn round8(v: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let u = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    let u = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(-65536)))
}

/// `B` registers of eight columns from column `c0` (a multiple of eight)
/// of `R` rows (`rows`, each `k` long in `x`): lane j of a register sums
/// exactly as [`column_scalar`] does for its column, so the bits are the
/// same. Writes `8 B` outputs per row into `out` (`[.., out_cols]`) from
/// column `out_c0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn strip_avx2<const R: usize, const B: usize, const ROUND: bool>(
    x: &[f32],
    k: usize,
    rows: [usize; R],
    w: &[bf16],
    c0: usize,
    out: &mut [f32],
    out_cols: usize,
    out_c0: usize,
) {
    use std::arch::x86_64::*;
    let start = |b: usize| {
        let col = c0 + 8 * b;
        col / PANEL * k * PANEL + col % PANEL
    };
    assert!(c0.is_multiple_of(8) && start(B - 1) + (k - 1) * PANEL + 8 <= w.len());
    assert!(out_c0 + 8 * B <= out_cols);
    let mut acc = [[_mm256_setzero_ps(); B]; R];
    let xs = rows.map(|r| x[r * k..(r + 1) * k].as_ptr());
    let from: [*const half::bf16; B] = std::array::from_fn(|b| w.as_ptr().add(start(b)));
    for i in 0..k {
        let ws: [__m256; B] =
            std::array::from_fn(|b| <half::bf16 as Load8>::load8(from[b].add(i * PANEL)));
        for r in 0..R {
            let xb = _mm256_set1_ps(*xs[r].add(i));
            for b in 0..B {
                let p = _mm256_mul_ps(xb, ws[b]);
                acc[r][b] = if ROUND {
                    round8(_mm256_add_ps(acc[r][b], round8(p)))
                } else {
                    _mm256_add_ps(acc[r][b], p)
                };
            }
        }
    }
    for (row, sums) in rows.iter().zip(&acc) {
        assert!((row + 1) * out_cols <= out.len());
        for (b, sum) in sums.iter().enumerate() {
            let at = row * out_cols + out_c0 + 8 * b;
            _mm256_storeu_ps(out.as_mut_ptr().add(at), *sum);
        }
    }
}

/// [`round_bf16_finite`] of sixteen lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn round16(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let u = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    let u = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
    _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(-65536)))
}

/// [`strip_avx2`] with sixteen-lane registers, one panel each, from panel
/// `p0`: the same operations per lane, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn strip_avx512<const R: usize, const B: usize, const ROUND: bool>(
    x: &[f32],
    k: usize,
    rows: [usize; R],
    w: &[bf16],
    p0: usize,
    out: &mut [f32],
    out_cols: usize,
    out_c0: usize,
) {
    use std::arch::x86_64::*;
    assert!((p0 + B) * k * PANEL <= w.len() && out_c0 + PANEL * B <= out_cols);
    let mut acc = [[_mm512_setzero_ps(); B]; R];
    let xs = rows.map(|r| x[r * k..(r + 1) * k].as_ptr());
    let from: [*const half::bf16; B] =
        std::array::from_fn(|b| w.as_ptr().add((p0 + b) * k * PANEL));
    for i in 0..k {
        let ws: [__m512; B] = std::array::from_fn(|b| {
            let halves = _mm256_loadu_si256(from[b].add(i * PANEL) as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16))
        });
        for r in 0..R {
            let xb = _mm512_set1_ps(*xs[r].add(i));
            for b in 0..B {
                let p = _mm512_mul_ps(xb, ws[b]);
                acc[r][b] = if ROUND {
                    round16(_mm512_add_ps(acc[r][b], round16(p)))
                } else {
                    _mm512_add_ps(acc[r][b], p)
                };
            }
        }
    }
    for (row, sums) in rows.iter().zip(&acc) {
        assert!((row + 1) * out_cols <= out.len());
        for (b, sum) in sums.iter().enumerate() {
            let at = row * out_cols + out_c0 + PANEL * b;
            _mm512_storeu_ps(out.as_mut_ptr().add(at), *sum);
        }
    }
}

/// Which vector kernels [`columns_range`] runs: set at run time, the same
/// bits whichever runs (`FLASHBAR_HOST_SIMD=avx2|scalar` forces a narrower
/// one, for the tests that compare them).
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum Simd {
    Scalar,
    Avx2,
    Avx512,
}

pub(super) fn simd() -> Simd {
    static CHOSEN: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let forced = std::env::var("FLASHBAR_HOST_SIMD").ok();
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = std::is_x86_feature_detected!("avx512f");
            let avx2 = std::is_x86_feature_detected!("avx2");
            match forced.as_deref() {
                Some("scalar") => Simd::Scalar,
                Some("avx2") if avx2 => Simd::Avx2,
                _ if avx512 => Simd::Avx512,
                _ if avx2 => Simd::Avx2,
                _ => Simd::Scalar,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = forced;
            Simd::Scalar
        }
    })
}

/// Columns `[c0, c1)` (`c0` a multiple of [`PANEL`]) of every row of `x`
/// `[rows, k]` by the panels `w`, into `out` `[rows, c1 - c0]`, by the
/// widest kernel this CPU has ([`Simd`]).
pub(super) fn columns_range(
    x: &[f32],
    k: usize,
    w: &[bf16],
    (c0, c1): (usize, usize),
    sum: ColumnSum,
    out: &mut [f32],
    kernels: Simd,
) {
    let rows = x.len() / k;
    let width = c1 - c0;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut c = c0;
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! strip {
            ($kernel:ident, $r:expr, $b:expr, $rows:expr, $at:expr) => {
                // SAFETY: the CPU has the kernel's features (`simd`); its
                // columns and outputs are checked inside `w` and `out` by
                // its asserts.
                unsafe {
                    match sum {
                        ColumnSum::Bf16 => {
                            $kernel::<$r, $b, true>(x, k, $rows, w, $at, out, width, c - c0)
                        }
                        ColumnSum::F32 => {
                            $kernel::<$r, $b, false>(x, k, $rows, w, $at, out, width, c - c0)
                        }
                    }
                }
            };
        }
        // Four rows by two registers, or one row by four: eight sums in flight.
        let step = if kernels == Simd::Avx512 { PANEL } else { 8 };
        while kernels != Simd::Scalar && c + 2 * step <= c1 {
            let wide = rows < ROW_BLOCK && c + 4 * step <= c1;
            let mut m = 0;
            while m + ROW_BLOCK <= rows {
                match kernels {
                    Simd::Avx512 => strip!(strip_avx512, 4, 2, [m, m + 1, m + 2, m + 3], c / PANEL),
                    _ => strip!(strip_avx2, 4, 2, [m, m + 1, m + 2, m + 3], c),
                }
                m += ROW_BLOCK;
            }
            for m in m..rows {
                match (kernels, wide) {
                    (Simd::Avx512, true) => strip!(strip_avx512, 1, 4, [m], c / PANEL),
                    (Simd::Avx512, false) => strip!(strip_avx512, 1, 2, [m], c / PANEL),
                    (_, true) => strip!(strip_avx2, 1, 4, [m], c),
                    (_, false) => strip!(strip_avx2, 1, 2, [m], c),
                }
            }
            c += if wide { 4 * step } else { 2 * step };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kernels;
    for m in 0..rows {
        let row = &x[m * k..(m + 1) * k];
        for col in c..c1 {
            out[m * width + col - c0] = column_scalar(row, w, col, sum);
        }
    }
}

/// `out[m, j] = x[m, :] . W[j, :]` for `x` `[rows, k]` and bf16 weights
/// `W` `[n, k]` stored as panels (`w`: [`to_panels`]), summed as `sum`
/// says (MLX's CPU kernels for bf16 inputs). Each output is its own
/// sequential sum, so it is the same however many rows come together;
/// threads take blocks of columns.
pub fn matmul_columns(x: &[f32], w: &[bf16], k: usize, n: usize, sum: ColumnSum, out: &mut [f32]) {
    let rows = x.len() / k;
    debug_assert_eq!(out.len(), rows * n);
    debug_assert!(w.len() >= n.div_ceil(PANEL) * PANEL * k);
    let block = if rows * n * k < PARALLEL_FROM {
        n
    } else {
        // A few blocks of whole 32-column strips per thread.
        (n.div_ceil(rayon::current_num_threads() * 4)).div_ceil(4 * PANEL) * 4 * PANEL
    };
    if block >= n {
        columns_range(x, k, w, (0, n), sum, out, simd());
        return;
    }
    let parts: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(block))
        .into_par_iter()
        .map(|b| {
            let (c0, c1) = (b * block, ((b + 1) * block).min(n));
            let mut part = vec![0f32; rows * (c1 - c0)];
            columns_range(x, k, w, (c0, c1), sum, &mut part, simd());
            (c0, part)
        })
        .collect();
    for (c0, part) in parts {
        let width = part.len() / rows;
        for m in 0..rows {
            out[m * n + c0..m * n + c0 + width].copy_from_slice(&part[m * width..(m + 1) * width]);
        }
    }
}

/// `values` `[n, k]` as bf16 panels `[ceil(n / PANEL), k, PANEL]` (the
/// last one padded with zeros), evaluated.
pub fn to_panels(values: &Array) -> Result<Array> {
    let (n, k) = (values.shape()[0], values.shape()[1]);
    let panel = PANEL as i32;
    let padded = (n + panel - 1) / panel * panel;
    let values = values.as_dtype(Dtype::Bfloat16)?;
    let values = if padded > n {
        let zeros = mlx_rs::ops::zeros_dtype(&[padded - n, k], Dtype::Bfloat16)?;
        mlx_rs::ops::concatenate(&[values, zeros], 0)?
    } else {
        values
    };
    let panels = values
        .reshape(&[padded / PANEL as i32, PANEL as i32, k])?
        .transpose_axes(&[0, 2, 1])?
        .contiguous()?;
    panels.eval()?;
    Ok(panels)
}

/// The `[n, k]` values of panels made by [`to_panels`].
pub fn from_panels(panels: &Array, n: i32) -> Result<Array> {
    let (count, k) = (panels.shape()[0], panels.shape()[1]);
    Ok(panels
        .transpose_axes(&[0, 2, 1])?
        .reshape(&[count * PANEL as i32, k])?
        .index((..n, ..)))
}

/// Rows `ids` of `W` `[n, k]` from its panels: `[ids.len(), k]` f32.
pub fn panel_rows(panels: &[bf16], k: usize, ids: &[i32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * k);
    for &id in ids {
        let id = id as usize;
        let panel = &panels[id / PANEL * k * PANEL..][..k * PANEL];
        out.extend((0..k).map(|i| panel[i * PANEL + id % PANEL].widen()));
    }
    out
}
