//! Column-panel kernels for bf16 weights: each output summed in k order,
//! by fused multiply-adds, in f32, or with MLX's CPU bf16 roundings
//! ([`ColumnSum`]), vectorised
//! across the columns of a panel so every lane keeps its column's order.

use super::*;

/// How a product by bf16 weights sums: the default arithmetic's fused
/// multiply-adds, or what MLX's CPU kernels do for bf16 inputs (docs/cpu.md,
/// "Parity with mlx-lm"). Every variant sums each output alone, in k order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ColumnSum {
    /// MLX's quantized matmul in bf16: every product and every partial sum
    /// rounded to bf16, in k order.
    Bf16,
    /// MLX's bf16 gemm: the products and their sum in f32, in k order,
    /// rounded to bf16 once at the end (by the caller).
    F32,
    /// The default arithmetic ([`super::Arithmetic::F32`]): each product
    /// added to the f32 sum by one fused multiply-add (one rounding, not
    /// two), in k order. IEEE 754 defines the fused operation exactly, so
    /// the bits are the same with FMA registers, NEON or a software
    /// `mul_add`; on x86 it takes half the arithmetic operations of a
    /// multiply and an add (docs/cpu.md, "Fused multiply-adds").
    Fused,
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
            ColumnSum::Fused => xv.mul_add(w, acc),
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

/// Binary exponents `[lo, hi]` of the non-zero magnitudes the pair
/// products take: every such value is a multiple of 2^-63 and below 2^49,
/// so every product is a multiple of 2^-126 and below 2^98, every partial
/// sum of up to 2^20 of them a multiple of 2^-126 (0 or normal: an f32
/// below 2^-102 that is such a multiple is exact, above it its spacing is
/// one) and finite.
pub const PAIR_RANGE: (i32, i32) = (-56, 48);

vectorized! {
    /// Whether every value is a bf16 value (as an f32: its low 16 bits zero)
    /// that is zero or of a magnitude within [`PAIR_RANGE`]. Every value is
    /// read (no early exit), so the loop runs in vector registers: it reads
    /// each product's inputs once more.
    pub fn in_pair_range(values: &[f32]) -> bool {
        let mut ok = true;
        for v in values {
            ok &= pair_bits_ok(v.to_bits());
        }
        ok
    }
}

/// [`in_pair_range`] of bf16 values.
pub fn bf16_in_pair_range(values: &[bf16]) -> bool {
    let mut ok = true;
    for v in values {
        ok &= pair_bits_ok(u32::from(v.to_bits()) << 16);
    }
    ok
}

/// Non-zero magnitudes within [`PAIR_RANGE`] have biased exponents in this
/// range.
const PAIR_EXPONENTS: std::ops::RangeInclusive<u32> =
    (PAIR_RANGE.0 + 127) as u32..=(PAIR_RANGE.1 + 127) as u32;

#[inline(always)]
fn pair_bits_ok(bits: u32) -> bool {
    let exponent = (bits >> 23) & 0xFF;
    (bits & 0xFFFF == 0) & ((bits & 0x7FFF_FFFF == 0) | PAIR_EXPONENTS.contains(&exponent))
}

/// Which vector kernels [`columns_range`] runs: set at run time, the same
/// bits whichever runs (`FLASHBAR_HOST_SIMD=avx512|avx2|scalar` forces a
/// narrower one, for the tests that compare them).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum Simd {
    Scalar,
    Avx2,
    Avx512,
    /// [`Simd::Avx512`], with the fused sums by bf16 pair products where
    /// the inputs and weights allow ([`pairs_apply`]).
    Avx512Bf16,
}

impl Simd {
    /// Whether the AVX-512 kernels run (alone or beside the pair products).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn avx512(self) -> bool {
        matches!(self, Simd::Avx512 | Simd::Avx512Bf16)
    }
}

pub(super) fn simd() -> Simd {
    static CHOSEN: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let forced = std::env::var("FLASHBAR_HOST_SIMD").ok();
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = std::is_x86_feature_detected!("avx512f");
            // Every AVX2 machine but a few VIA chips has FMA; the fused sum
            // needs it.
            let avx2 =
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            match forced.as_deref() {
                Some("scalar") => Simd::Scalar,
                Some("avx2") if avx2 => Simd::Avx2,
                Some("avx512") if avx512 => Simd::Avx512,
                _ if avx512 && columns_pairs::available() => Simd::Avx512Bf16,
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

/// Whether weights summed as `sum` may ever take the pair products here:
/// [`HostMatrix::columns`] checks their range only then.
pub fn pairs_may_run(sum: ColumnSum) -> bool {
    sum == ColumnSum::Fused && simd() == Simd::Avx512Bf16
}

/// Whether [`matmul_columns`] takes the pair products for these inputs and
/// weights (the weights' [`bf16_in_pair_range`], checked once when they
/// load): fused sums on even k with every input in range, where they give
/// the fused kernels' bits (docs/cpu.md, "bf16 pair products").
pub fn pairs_apply(x: &[f32], k: usize, sum: ColumnSum, weights_in_range: bool) -> bool {
    weights_in_range && k.is_multiple_of(2) && pairs_may_run(sum) && in_pair_range(x)
}

/// The outputs `[rows, stride]` of one product, which the parts of it
/// (blocks of columns, on several threads) write in place: each part
/// writes only its own columns, through this pointer (one `&mut` per part
/// would alias), checked against `len` at every store.
#[derive(Clone, Copy)]
pub(super) struct Outputs {
    ptr: *mut f32,
    len: usize,
    /// Outputs a row: the product's n.
    pub(super) stride: usize,
}

// SAFETY: the parts of a product write disjoint columns, and the slice
// outlives them (`matmul_columns` returns after `pool::each`).
unsafe impl Send for Outputs {}
unsafe impl Sync for Outputs {}

impl Outputs {
    pub(super) fn new(out: &mut [f32], stride: usize) -> Self {
        Outputs {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            stride,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn as_mut_ptr(&self) -> *mut f32 {
        self.ptr
    }

    /// Writes output `(row, col)`.
    fn put(&self, row: usize, col: usize, value: f32) {
        let at = row * self.stride + col;
        assert!(col < self.stride && at < self.len);
        // SAFETY: in bounds (just checked); no other part writes `col`.
        unsafe { *self.ptr.add(at) = value };
    }
}

/// Columns `[c0, c1)` (`c0` a multiple of [`PANEL`]) of every row of `x`
/// `[rows, k]` by the panels `w`, into those columns of `out`, by the
/// widest kernel this CPU has ([`Simd`]); by the pair products where
/// given `x` as their words (`pairs`: where [`pairs_apply`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn columns_range(
    x: &[f32],
    k: usize,
    w: &[bf16],
    (c0, c1): (usize, usize),
    sum: ColumnSum,
    out: Outputs,
    kernels: Simd,
    pairs: Option<&[u32]>,
) {
    assert!(c0.is_multiple_of(PANEL), "column block at {c0}");
    assert!(c1 <= out.stride && x.len() / k * out.stride <= out.len());
    let rows = x.len() / k;
    #[cfg(target_arch = "x86_64")]
    let c = match kernels {
        Simd::Avx512Bf16 if pairs.is_some() => {
            columns_pairs::range(pairs.unwrap_or_default(), k, w, (c0, c1), out)
        }
        Simd::Avx512 | Simd::Avx512Bf16 => columns_x86::range_avx512(x, k, w, (c0, c1), sum, out),
        Simd::Avx2 => columns_x86::range_avx2(x, k, w, (c0, c1), sum, out),
        Simd::Scalar => c0,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let c = {
        let _ = (kernels, pairs);
        c0
    };
    for m in 0..rows {
        let row = &x[m * k..(m + 1) * k];
        for col in c..c1 {
            out.put(m, col, column_scalar(row, w, col, sum));
        }
    }
}

/// `out[m, j] = x[m, :] . W[j, :]` for `x` `[rows, k]` and bf16 weights
/// `W` `[n, k]` stored as panels (`w`: [`to_panels`]), summed as `sum`
/// says (MLX's CPU kernels for bf16 inputs). Each output is its own
/// sequential sum, so it is the same however many rows come together;
/// threads take blocks of columns. `weights_in_range`: the weights'
/// [`bf16_in_pair_range`], which lets the fused sums take the pair
/// products (the same bits).
pub fn matmul_columns(
    x: &[f32],
    w: &[bf16],
    (k, n): (usize, usize),
    sum: ColumnSum,
    weights_in_range: bool,
    out: &mut [f32],
) {
    let rows = x.len() / k;
    #[cfg(target_arch = "x86_64")]
    let words = pairs_apply(x, k, sum, weights_in_range).then(|| columns_pairs::pair_words(x));
    #[cfg(not(target_arch = "x86_64"))]
    let words: Option<Vec<u32>> = {
        let _ = weights_in_range;
        None
    };
    let pairs = words.as_deref();
    debug_assert_eq!(out.len(), rows * n);
    debug_assert!(w.len() >= n.div_ceil(PANEL) * PANEL * k);
    let block = if rows * n * k < PARALLEL_FROM {
        n
    } else {
        // A few blocks of whole 32-column strips per thread.
        (n.div_ceil(pool::threads() * 4)).div_ceil(4 * PANEL) * 4 * PANEL
    };
    assert_eq!(out.len(), rows * n);
    let out = Outputs::new(out, n);
    if block >= n {
        columns_range(x, k, w, (0, n), sum, out, simd(), pairs);
        return;
    }
    let starts: Vec<usize> = (0..n).step_by(block).collect();
    pool::each(starts, |c0| {
        columns_range(x, k, w, (c0, (c0 + block).min(n)), sum, out, simd(), pairs);
    });
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
