//! CPU kernels in Rust over evaluated arrays, for the products a verify and
//! a decode step must compute alike: every output row comes from the same
//! fixed-order sums whatever the number of rows, so row i of a 16-token
//! verify is bit for bit the 1-token step of that token (docs/cpu.md, "Row
//! invariance"). BLAS does not promise that: OpenBLAS sums edge rows in
//! another order, and MLX's CPU attention multiplies through it.
//!
//! The sums are written as 16 lanes of separate multiplies and adds
//! (Rust never fuses them), so the rounding is the same with SSE, AVX2 or
//! NEON, on every machine; rows are spread over threads, which never changes
//! what any one row computes.

use crate::error::Result;
use half::bf16;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use rayon::prelude::*;

/// Lanes of every dot product; their sums are folded in a fixed tree.
const LANES: usize = 16;

/// Work (multiply-adds) below which a product runs on one thread: a
/// decode step's small projections cost less than handing them out.
const PARALLEL_FROM: usize = 1 << 17;

/// A weight value as the kernels read it: f32, or bf16, which widens to
/// f32 exactly (a shift), so a product over bf16-stored weights is bit for
/// bit the product over the same values stored as f32, at half the bytes
/// a decode step reads.
pub trait Weight: Copy + Send + Sync {
    fn widen(self) -> f32;
}

impl Weight for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Weight for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

/// `sum_i a[i] b[i]` in a fixed order (16 lanes, then a fixed tree, then
/// the tail in order).
#[inline(always)]
fn dot_lanes<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    let mut acc = [0f32; LANES];
    let whole = a.len() / LANES * LANES;
    for (x, y) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for l in 0..LANES {
            acc[l] += x[l] * y[l].widen();
        }
    }
    fold_lanes(acc, &a[whole..], &b[whole..])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    dot_lanes(a, b)
}

/// [`dot_lanes`], compiled for AVX2 where the CPU has it: the same
/// operations in the same order, so the same bits, only wider registers.
#[inline]
pub fn dot<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_lanes(a, b)
}

/// Folds 16 lane sums in [`dot_lanes`]'s fixed tree and adds the tail
/// (`x[whole..] . w[whole..]`) in order.
#[inline(always)]
fn fold_lanes<W: Weight>(mut acc: [f32; LANES], x_tail: &[f32], w_tail: &[W]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for (x, y) in x_tail.iter().zip(w_tail) {
        sum += x * y.widen();
    }
    sum
}

/// Eight weights widened into one AVX2 register.
#[cfg(target_arch = "x86_64")]
pub trait Load8: Weight {
    /// # Safety
    /// AVX2, and 8 values readable at `p`.
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

#[cfg(target_arch = "x86_64")]
impl Load8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

#[cfg(target_arch = "x86_64")]
impl Load8 for bf16 {
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let halves = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16))
    }
}

/// Four rows of `x` against one `w` at once, each bit for bit its own
/// [`dot`]: the same lanes (two 8-float registers, a multiply then an add,
/// never fused), the same fold. The four rows share each load of `w` and
/// keep eight chains of additions in flight instead of two, so a verify's
/// rows cost what the multiplies cost, not what one chain's latency does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot4_avx2<W: Load8>(xs: [&[f32]; 4], w: &[W]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let whole = w.len() / LANES * LANES;
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < whole {
        let w0 = W::load8(w.as_ptr().add(i));
        let w1 = W::load8(w.as_ptr().add(i + 8));
        for r in 0..4 {
            let p = xs[r].as_ptr().add(i);
            lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(_mm256_loadu_ps(p), w0));
            hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(_mm256_loadu_ps(p.add(8)), w1));
        }
        i += LANES;
    }
    let mut sums = [0f32; 4];
    for r in 0..4 {
        let mut acc = [0f32; LANES];
        _mm256_storeu_ps(acc.as_mut_ptr(), lo[r]);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi[r]);
        sums[r] = fold_lanes(acc, &xs[r][whole..], &w[whole..]);
    }
    sums
}

/// The weight types the kernels take: [`Weight`], and on x86-64 the AVX2
/// load of eight of them.
#[cfg(target_arch = "x86_64")]
pub trait HostWeight: Load8 {}
#[cfg(target_arch = "x86_64")]
impl<W: Load8> HostWeight for W {}
#[cfg(not(target_arch = "x86_64"))]
pub trait HostWeight: Weight {}
#[cfg(not(target_arch = "x86_64"))]
impl<W: Weight> HostWeight for W {}

/// Four rows' [`dot`]s with `w`: together where the CPU has AVX2, one by
/// one elsewhere; the same bits either way.
#[inline]
fn dot4<W: HostWeight>(xs: [&[f32]; 4], w: &[W]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && xs.iter().all(|x| x.len() == w.len()) {
            // SAFETY: the CPU has AVX2 and every row is as long as `w`
            // (checked just above), so every load is in bounds.
            return unsafe { dot4_avx2(xs, w) };
        }
    }
    xs.map(|x| dot(x, w))
}

/// Input rows multiplied together against each weight row.
const ROW_BLOCK: usize = 4;

/// `out[m, n] = x[m, :] . w[n, :]` for `x` `[rows, k]` and `w` `[cols, k]`,
/// both row-major. Each element is bit for bit one [`dot`], however many
/// rows come together: row-invariant by design.
pub fn matmul_nt<W: HostWeight>(x: &[f32], w: &[W], k: usize, out: &mut [f32]) {
    let (rows, cols) = (x.len() / k, w.len() / k);
    debug_assert_eq!(out.len(), rows * cols);
    // One weight row at a time against every input row (4 at once): each
    // weight is read from memory once per product, the inputs stay in cache.
    let column = |w_n: &[W], put: &mut dyn FnMut(usize, f32)| {
        let row = |m: usize| &x[m * k..(m + 1) * k];
        let mut m = 0;
        while m + ROW_BLOCK <= rows {
            let sums = dot4([row(m), row(m + 1), row(m + 2), row(m + 3)], w_n);
            for (r, sum) in sums.into_iter().enumerate() {
                put(m + r, sum);
            }
            m += ROW_BLOCK;
        }
        for m in m..rows {
            put(m, dot(row(m), w_n));
        }
    };
    if rows * cols * k < PARALLEL_FROM {
        for (n, w_n) in w.chunks_exact(k).enumerate() {
            column(w_n, &mut |m, v| out[m * cols + n] = v);
        }
        return;
    }
    // Threads take blocks of weight rows; each writes its own columns,
    // gathered per block and copied into place.
    let block = cols.div_ceil(rayon::current_num_threads() * 4).max(1);
    let parts: Vec<(usize, Vec<f32>)> = w
        .par_chunks(block * k)
        .enumerate()
        .map(|(b, ws)| {
            let first = b * block;
            let width = ws.len() / k;
            let mut part = vec![0f32; rows * width];
            for (j, w_n) in ws.chunks_exact(k).enumerate() {
                column(w_n, &mut |m, v| part[m * width + j] = v);
            }
            (first, part)
        })
        .collect();
    for (first, part) in parts {
        let width = part.len() / rows;
        for m in 0..rows {
            out[m * cols + first..m * cols + first + width]
                .copy_from_slice(&part[m * width..(m + 1) * width]);
        }
    }
}

/// `a . b` summed in index order from zero, each product rounded to f32
/// before it is added: what MLX's CPU reductions and its bf16 gemm compute
/// (docs/cpu.md, "Parity with mlx-lm").
#[inline]
pub fn sequential_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in a.iter().zip(b) {
        sum += x * y;
    }
    sum
}

/// `x` rounded to bf16 (and widened back) as MLX rounds it: to nearest,
/// ties to even, NaN kept a NaN.
#[inline(always)]
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return f32::from_bits(0x7FC0_0000);
    }
    let u = x.to_bits();
    f32::from_bits(u.wrapping_add(0x7FFF + ((u >> 16) & 1)) & 0xFFFF_0000)
}

/// MLX's CPU `exp` (its `simd::exp`, also what its softmax runs): 2^(x
/// log2 e) as a power of two times a degree-6 polynomial of the fraction,
/// with fused multiply-adds; 0 below -88 and infinity above 88. Not libm's
/// exp: the two differ in the last bits.
// The constants as MLX writes them (rounded to f32 alike), not `LOG2_E`.
#[allow(clippy::approx_constant, clippy::excessive_precision)]
#[inline]
pub fn mlx_exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > 88.0 {
        return f32::INFINITY;
    }
    if x < -88.0 {
        return 0.0;
    }
    let y = x * 1.442695f32;
    let ipart = (y + 0.5).floor();
    let fpart = y - ipart;
    let mut p = 1.535336188319500e-4f32;
    for c in [
        1.339887440266574e-3f32,
        9.618437357674640e-3,
        5.550332471162809e-2,
        2.402264791363012e-1,
        6.931472028550421e-1,
        1.0,
    ] {
        p = p.mul_add(fpart, c);
    }
    let two_to_i = f32::from_bits(((ipart as i32).wrapping_add(127) as u32).wrapping_shl(23));
    two_to_i * p
}

/// Which arithmetic the host kernels use for bf16 checkpoints
/// (docs/cpu.md, "Parity with mlx-lm"): f32 sums (the default: more
/// precise, faster, and the arithmetic of MLX's GPU kernels, which the
/// drafters are trained against), or MLX's CPU kernels bit for bit, whose
/// quantized matmul rounds every product and partial sum to bf16 (what
/// mlx-lm computes on a CPU; the parity tests use it). Both are
/// row-invariant, so DFlash stays lossless in either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arithmetic {
    F32,
    Mlx,
}

/// `mlx` selects [`Arithmetic::Mlx`] for the process; anything else, or
/// nothing, [`Arithmetic::F32`].
pub const ARITHMETIC_ENV: &str = "FLASHBAR_CPU_ARITHMETIC";

/// 0: not read yet; 1: F32; 2: Mlx.
static ARITHMETIC: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The process's arithmetic: [`set_arithmetic`]'s, else [`ARITHMETIC_ENV`]'s.
/// Read when weights load and when attention runs.
pub fn arithmetic() -> Arithmetic {
    use std::sync::atomic::Ordering;
    match ARITHMETIC.load(Ordering::Relaxed) {
        1 => Arithmetic::F32,
        2 => Arithmetic::Mlx,
        _ => {
            let mode = if std::env::var(ARITHMETIC_ENV).as_deref() == Ok("mlx") {
                Arithmetic::Mlx
            } else {
                Arithmetic::F32
            };
            set_arithmetic(mode);
            mode
        }
    }
}

/// Sets the process's arithmetic (before loading a model).
pub fn set_arithmetic(mode: Arithmetic) {
    let code = match mode {
        Arithmetic::F32 => 1,
        Arithmetic::Mlx => 2,
    };
    ARITHMETIC.store(code, std::sync::atomic::Ordering::Relaxed);
}

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
fn column_scalar(x: &[f32], w: &[bf16], col: usize, sum: ColumnSum) -> f32 {
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
fn round_bf16_finite(x: f32) -> f32 {
    let u = x.to_bits();
    f32::from_bits(u.wrapping_add(0x7FFF + ((u >> 16) & 1)) & 0xFFFF_0000)
}

/// [`round_bf16_finite`] of eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round8(v: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
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
unsafe fn strip_avx2<const R: usize, const B: usize, const ROUND: bool>(
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
unsafe fn round16(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
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
unsafe fn strip_avx512<const R: usize, const B: usize, const ROUND: bool>(
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
enum Simd {
    Scalar,
    Avx2,
    Avx512,
}

fn simd() -> Simd {
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
fn columns_range(
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

/// Causal attention for bf16 inputs as MLX's CPU
/// `scaled_dot_product_attention` computes it (docs/cpu.md, "Parity with
/// mlx-lm"), per query: q times the scale (both bf16) rounded to bf16; each
/// score an f32 [`sequential_dot`] rounded to bf16; a precise softmax (f32
/// max, [`mlx_exp`], an f32 sum in position order, one reciprocal, each
/// weight rounded to bf16); each output an f32 sum of weight times value in
/// position order, rounded to bf16. Masked positions weigh exactly 0 there,
/// so leaving them out changes no bit. Shapes as in [`attention`].
pub fn attention_bf16(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (heads, kv_heads, len, total, d): (usize, usize, usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let group = heads / kv_heads;
    let scale = round_bf16(scale);
    let one = |index: usize, out: &mut [f32]| {
        let (h, l) = (index / len, index % len);
        let kv = h / group;
        let query: Vec<f32> = q[index * d..(index + 1) * d]
            .iter()
            .map(|x| round_bf16(x * scale))
            .collect();
        let visible = total - len + l + 1;
        let keys = &k[kv * total * d..];
        let values = &v[kv * total * d..];
        let scores: Vec<f32> = (0..visible)
            .map(|s| round_bf16(sequential_dot(&query, &keys[s * d..(s + 1) * d])))
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for score in &scores {
            sum += mlx_exp(score - max);
        }
        let inverse = 1.0 / sum;
        out.fill(0.0);
        for (s, score) in scores.iter().enumerate() {
            let weight = round_bf16(mlx_exp(score - max) * inverse);
            for (o, value) in out.iter_mut().zip(&values[s * d..(s + 1) * d]) {
                *o += weight * value;
            }
        }
        for o in out.iter_mut() {
            *o = round_bf16(*o);
        }
    };
    if heads * len * total * d < PARALLEL_FROM {
        for (index, row) in out.chunks_exact_mut(d).enumerate() {
            one(index, row);
        }
    } else {
        out.par_chunks_exact_mut(d)
            .enumerate()
            .for_each(|(index, row)| one(index, row));
    }
}

/// Causal attention of `q` `[heads, len, d]` over `k`, `v` `[kv_heads,
/// total, d]` (the last `len` positions of `total` are the queries'),
/// grouped heads (head h reads kv head h / (heads / kv_heads)).
/// Per query: scores `scale * q.k` by [`dot`], softmax with the max
/// subtracted, and the weighted sum of values in position order: what one
/// query computes does not depend on how many came with it.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (heads, kv_heads, len, total, d): (usize, usize, usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let group = heads / kv_heads;
    let one = |index: usize, out: &mut [f32]| {
        let (h, l) = (index / len, index % len);
        let kv = h / group;
        let query = &q[index * d..(index + 1) * d];
        let visible = total - len + l + 1;
        let keys = &k[kv * total * d..];
        let values = &v[kv * total * d..];
        let mut scores: Vec<f32> = (0..visible)
            .map(|s| dot(query, &keys[s * d..(s + 1) * d]) * scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for score in &mut scores {
            *score = (*score - max).exp();
            sum += *score;
        }
        out.fill(0.0);
        for (s, weight) in scores.iter().enumerate() {
            for (o, value) in out.iter_mut().zip(&values[s * d..(s + 1) * d]) {
                *o += weight * value;
            }
        }
        for o in out.iter_mut() {
            *o /= sum;
        }
    };
    if heads * len * total * d < PARALLEL_FROM {
        for (index, row) in out.chunks_exact_mut(d).enumerate() {
            one(index, row);
        }
    } else {
        out.par_chunks_exact_mut(d)
            .enumerate()
            .for_each(|(index, row)| one(index, row));
    }
}

/// An array's values as f32, row-major (evaluated first).
pub fn host_f32(array: &Array) -> Result<Vec<f32>> {
    let array = array.as_dtype(Dtype::Float32)?.contiguous()?;
    array.eval()?;
    Ok(array.as_slice::<f32>().to_vec())
}

/// A linear map's weights as the host kernels hold them: evaluated,
/// contiguous, and laid out for the sums they take.
#[derive(Clone)]
pub struct HostMatrix {
    pub weight: Array,
    pub layout: Layout,
    /// Outputs (n) and inputs (k) of the map.
    pub n: usize,
    pub k: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[n, k]` f32 or bf16, by [`matmul_nt`] (f32 checkpoints).
    Rows,
    /// bf16 panels ([`to_panels`]), by [`matmul_columns`]: bf16
    /// checkpoints, whose bf16 inputs it multiplies exactly as MLX's CPU
    /// kernels do. Inputs of another type take [`ColumnSum::F32`].
    Columns(ColumnSum),
}

impl HostMatrix {
    /// `values` `[n, k]` stored f32 by rows.
    pub fn rows(values: &Array) -> Result<Self> {
        let weight = values.as_dtype(Dtype::Float32)?.contiguous()?;
        weight.eval()?;
        Ok(HostMatrix {
            n: weight.shape()[0] as usize,
            k: weight.shape()[1] as usize,
            weight,
            layout: Layout::Rows,
        })
    }

    /// `values` `[n, k]` (bf16 values) stored as bf16 panels, summed as `sum` says.
    pub fn columns(values: &Array, sum: ColumnSum) -> Result<Self> {
        Ok(HostMatrix {
            n: values.shape()[0] as usize,
            k: values.shape()[1] as usize,
            weight: to_panels(values)?,
            layout: Layout::Columns(sum),
        })
    }

    /// The `[n, k]` values.
    pub fn values(&self) -> Result<Array> {
        match self.layout {
            Layout::Rows => Ok(self.weight.clone()),
            Layout::Columns(_) => from_panels(&self.weight, self.n as i32),
        }
    }

    /// Maps of the same input stacked into one (outputs in order), or None
    /// when they are not summed alike.
    pub fn stack(parts: &[&HostMatrix]) -> Result<Option<Self>> {
        let layout = parts[0].layout;
        if parts
            .iter()
            .any(|p| p.layout != layout || p.k != parts[0].k)
        {
            return Ok(None);
        }
        let values = parts
            .iter()
            .map(|p| p.values())
            .collect::<Result<Vec<_>>>()?;
        let stacked = mlx_rs::ops::concatenate(&values, 0)?;
        Ok(Some(match layout {
            Layout::Rows => HostMatrix::rows(&stacked)?,
            Layout::Columns(sum) => HostMatrix::columns(&stacked, sum)?,
        }))
    }

    /// Input width k and output width n.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Rows `ids` of the `[n, k]` values, f32, `[ids.len(), k]`.
    pub fn gather_rows(&self, ids: &[i32]) -> Result<Vec<f32>> {
        if let Some(bad) = ids.iter().find(|&&id| id < 0 || id as usize >= self.n) {
            return Err(mlx_rs::error::Exception::custom(format!(
                "token id {bad} out of range (vocabulary {})",
                self.n
            ))
            .into());
        }
        Ok(match (self.layout, self.weight.dtype()) {
            (Layout::Columns(_), _) => panel_rows(self.weight.as_slice::<bf16>(), self.k, ids),
            (Layout::Rows, Dtype::Bfloat16) => {
                let w = self.weight.as_slice::<bf16>();
                ids.iter()
                    .flat_map(|&id| {
                        w[id as usize * self.k..][..self.k]
                            .iter()
                            .map(|v| v.widen())
                    })
                    .collect()
            }
            (Layout::Rows, _) => {
                let w = self.weight.as_slice::<f32>();
                ids.iter()
                    .flat_map(|&id| w[id as usize * self.k..][..self.k].iter().copied())
                    .collect()
            }
        })
    }

    /// `x W^T` for `xs` `[rows, k]` whose values are of type `dtype`.
    fn product(&self, xs: &[f32], dtype: Dtype) -> Vec<f32> {
        let (k, n) = self.dims();
        let mut out = vec![0f32; xs.len() / k * n];
        match (self.layout, self.weight.dtype()) {
            (Layout::Rows, Dtype::Bfloat16) => {
                matmul_nt(xs, self.weight.as_slice::<bf16>(), k, &mut out)
            }
            (Layout::Rows, _) => matmul_nt(xs, self.weight.as_slice::<f32>(), k, &mut out),
            (Layout::Columns(sum), _) => {
                let sum = if dtype == Dtype::Bfloat16 {
                    sum
                } else {
                    ColumnSum::F32
                };
                matmul_columns(xs, self.weight.as_slice::<bf16>(), k, n, sum, &mut out)
            }
        }
        out
    }
}

/// `x W^T` for `x` `[..., k]`, in `x`'s dtype.
pub fn linear(x: &Array, weight: &HostMatrix) -> Result<Array> {
    let shape = x.shape().to_vec();
    let (_, cols) = weight.dims();
    let xs = host_f32(x)?;
    let out = weight.product(&xs, x.dtype());
    let mut out_shape = shape;
    *out_shape.last_mut().unwrap() = cols as i32;
    Ok(Array::from_slice(&out, &out_shape).as_dtype(x.dtype())?)
}

/// `x W^T` for the stacked weights of several maps of the same `x`
/// (`cols`: each map's width, in order), one array per map, in `x`'s dtype:
/// one host product, one read of `x`, instead of one each. Each output is
/// the same sum as the map's own product gives, so the values are bit
/// for bit those of the maps one by one.
pub fn linear_split(x: &Array, weight: &HostMatrix, cols: &[i32]) -> Result<Vec<Array>> {
    let shape = x.shape().to_vec();
    let (_, all) = weight.dims();
    let xs = host_f32(x)?;
    let out = weight.product(&xs, x.dtype());
    let mut first = 0usize;
    cols.iter()
        .map(|&n| {
            let n = n as usize;
            let part: Vec<f32> = out
                .chunks_exact(all)
                .flat_map(|row| &row[first..first + n])
                .copied()
                .collect();
            first += n;
            let mut part_shape = shape.clone();
            *part_shape.last_mut().unwrap() = n as i32;
            Ok(Array::from_slice(&part, &part_shape).as_dtype(x.dtype())?)
        })
        .collect()
}

/// [`attention`] (f32) or, for bf16 inputs in [`Arithmetic::Mlx`],
/// [`attention_bf16`] for MLX arrays: `q` `[1, heads, len, d]`, `k`, `v`
/// `[1, kv_heads, total, d]`; returns `[1, heads, len, d]` in `q`'s dtype.
pub fn causal_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    arithmetic: Arithmetic,
) -> Result<Array> {
    let (qs, ks) = (q.shape(), k.shape());
    let dims = (
        qs[1] as usize,
        ks[1] as usize,
        qs[2] as usize,
        ks[2] as usize,
        qs[3] as usize,
    );
    let (qh, kh, vh) = (host_f32(q)?, host_f32(k)?, host_f32(v)?);
    let mut out = vec![0f32; qh.len()];
    if arithmetic == Arithmetic::Mlx && [q, k, v].iter().all(|a| a.dtype() == Dtype::Bfloat16) {
        attention_bf16(&qh, &kh, &vh, dims, scale, &mut out);
    } else {
        attention(&qh, &kh, &vh, dims, scale, &mut out);
    }
    Ok(Array::from_slice(&out, qs).as_dtype(q.dtype())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, salt: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + salt) * 0.618_034).sin() * 1.3)
            .collect()
    }

    /// bf16 values (as f32) of a deterministic, sign-mixed sequence, some
    /// of them products that land exactly on bf16 ties.
    fn bf16_values(n: usize, salt: f32, scale: f32) -> Vec<f32> {
        values(n, salt)
            .into_iter()
            .map(|v| bf16::from_f32(v * scale).to_f32())
            .collect()
    }

    fn cpu() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    }

    fn host(a: &Array) -> Vec<f32> {
        host_f32(a).unwrap()
    }

    /// Every vector kernel, at every blocking and tail, gives its scalar
    /// reference's bits: AVX-512, AVX2 and scalar machines agree.
    #[test]
    fn column_kernels_equal_their_scalar_reference() {
        cpu();
        for (n, k) in [(16, 64), (100, 37), (4096, 24), (72, 384)] {
            let w = Array::from_slice(&bf16_values(n * k, 1.0, 0.7), &[n as i32, k as i32]);
            let panels = to_panels(&w).unwrap();
            let panels = panels.as_slice::<bf16>();
            for rows in [1, 3, 4, 6, 16] {
                let x = bf16_values(rows * k, 2.0, 1.9);
                for sum in [ColumnSum::Bf16, ColumnSum::F32] {
                    let want: Vec<f32> = (0..rows)
                        .flat_map(|m| {
                            let row = &x[m * k..(m + 1) * k];
                            (0..n).map(move |c| column_scalar(row, panels, c, sum))
                        })
                        .collect();
                    for kernels in [Simd::Scalar, Simd::Avx2, Simd::Avx512] {
                        #[cfg(target_arch = "x86_64")]
                        if (kernels == Simd::Avx2 && !std::is_x86_feature_detected!("avx2"))
                            || (kernels == Simd::Avx512
                                && !std::is_x86_feature_detected!("avx512f"))
                        {
                            continue;
                        }
                        let mut out = vec![0f32; rows * n];
                        columns_range(&x, k, panels, (0, n), sum, &mut out, kernels);
                        let same = out
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{n}x{k}, {rows} rows, {sum:?}");
                    }
                    let mut out = vec![0f32; rows * n];
                    matmul_columns(&x, panels, k, n, sum, &mut out);
                    assert_eq!(out, want, "{n}x{k}, {rows} rows, {sum:?}, threaded");
                }
            }
        }
    }

    /// The two column sums are MLX's CPU kernels for bf16 inputs: its
    /// quantized matmul (bf16 scales) and its bf16 gemm, bit for bit.
    #[test]
    fn column_sums_are_mlx_cpu_kernels_for_bf16() {
        cpu();
        let (n, k, rows) = (200, 256, 5);
        let w = Array::from_slice(&values(n * k, 3.0), &[n as i32, k as i32])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let x = Array::from_slice(&bf16_values(rows * k, 4.0, 2.0), &[rows as i32, k as i32])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let (packed, scales, biases) = mlx_rs::ops::quantize(&w, 64, 8).unwrap();
        assert_eq!(scales.dtype(), Dtype::Bfloat16);
        let dequantized = mlx_rs::ops::dequantize(&packed, &scales, &biases, 64, 8).unwrap();
        let mlx =
            mlx_rs::ops::quantized_matmul(&x, &packed, &scales, &biases, true, 64, 8).unwrap();
        let ours = linear(
            &x,
            &HostMatrix::columns(&dequantized, ColumnSum::Bf16).unwrap(),
        )
        .unwrap();
        assert_eq!(host(&ours), host(&mlx), "quantized matmul");
        // An f32 sum of the same values is not it: the test tells them apart.
        let f32_sum = linear(&x, &HostMatrix::rows(&dequantized).unwrap()).unwrap();
        assert_ne!(host(&f32_sum), host(&mlx));

        let mlx = mlx_rs::ops::matmul(&x, w.t()).unwrap();
        let ours = linear(&x, &HostMatrix::columns(&w, ColumnSum::F32).unwrap()).unwrap();
        assert_eq!(host(&ours), host(&mlx), "bf16 gemm");
    }

    /// [`round_bf16`] is MLX's f32 -> bf16 cast, ties included; [`mlx_exp`]
    /// is MLX's CPU exp, bit for bit.
    #[test]
    fn rounding_and_exp_are_mlx_s() {
        cpu();
        let mut xs: Vec<f32> = values(5000, 0.3).iter().map(|v| v * 40.0).collect();
        // Exact ties (low 16 bits 0x8000) with even and odd kept bits.
        xs.extend([0x3F80_8000u32, 0x3F81_8000, 0xBF80_8000, 0x4000_7FFF].map(f32::from_bits));
        xs.extend([-100.0, -88.5, -87.9, 0.0, 1e-30, 87.9, 89.0]);
        let a = Array::from_slice(&xs, &[xs.len() as i32]);
        let cast = host(&a.as_dtype(Dtype::Bfloat16).unwrap());
        let ours: Vec<f32> = xs.iter().map(|&x| round_bf16(x)).collect();
        assert_eq!(ours, cast);
        let exp = host(&mlx_rs::ops::exp(&a).unwrap());
        let ours: Vec<f32> = xs.iter().map(|&x| mlx_exp(x)).collect();
        let same = ours
            .iter()
            .zip(&exp)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "exp differs");
    }

    /// bf16 attention is MLX's CPU scaled_dot_product_attention (its
    /// fallback of bf16 ops) bit for bit, a query alone (no mask) and a
    /// block (causal mask), and each query of the block is the lone query.
    #[test]
    fn bf16_attention_is_mlx_s_and_row_invariant() {
        use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
        cpu();
        let (heads, kv_heads, d, total) = (6, 2, 64, 40);
        let bf = |v: Vec<f32>, shape: &[i32]| {
            Array::from_slice(&v, shape)
                .as_dtype(Dtype::Bfloat16)
                .unwrap()
        };
        let k = bf(
            values(kv_heads * total * d, 2.0),
            &[1, kv_heads as i32, total as i32, d as i32],
        );
        let v = bf(
            values(kv_heads * total * d, 3.0),
            &[1, kv_heads as i32, total as i32, d as i32],
        );
        for (len, scale) in [(1, 0.125), (16, 0.125), (16, 0.088_388_35)] {
            let q = bf(
                values(heads * len * d, 1.0)
                    .iter()
                    .map(|x| x * 3.0)
                    .collect(),
                &[1, heads as i32, len as i32, d as i32],
            );
            let mask = (len > 1).then_some(ScaledDotProductAttentionMask::Causal);
            let mlx = scaled_dot_product_attention(&q, &k, &v, scale, mask, None).unwrap();
            let ours = causal_attention(&q, &k, &v, scale, Arithmetic::Mlx).unwrap();
            assert_eq!(ours.dtype(), Dtype::Bfloat16);
            assert_eq!(host(&ours), host(&mlx), "{len} queries, scale {scale}");
        }
        // Row invariance: each query of a block is the query alone.
        let len = 16;
        let q = bf16_values(heads * len * d, 1.0, 1.0);
        let dims = (heads, kv_heads, len, total, d);
        let (block, lone) = block_and_lone(attention_bf16, &q, &host(&k), &host(&v), dims);
        for (l, (_, lone)) in lone.iter().enumerate() {
            for h in 0..heads {
                assert_eq!(
                    &block[(h * len + l) * d..(h * len + l + 1) * d],
                    &lone[h * d..(h + 1) * d]
                );
            }
        }
    }

    type AttentionKernel =
        fn(&[f32], &[f32], &[f32], (usize, usize, usize, usize, usize), f32, &mut [f32]);
    /// A query alone and its output.
    type Lone = (Vec<f32>, Vec<f32>);

    /// `kernel` on a block of `len` queries (scale 0.125), and on each query
    /// alone over the keys up to its own position: the block's output and,
    /// per query, the lone query and its output (`[heads, d]` each).
    fn block_and_lone(
        kernel: AttentionKernel,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        (heads, kv_heads, len, total, d): (usize, usize, usize, usize, usize),
    ) -> (Vec<f32>, Vec<Lone>) {
        let mut block = vec![0f32; q.len()];
        kernel(q, k, v, (heads, kv_heads, len, total, d), 0.125, &mut block);
        let lone = (0..len)
            .map(|l| {
                let upto = total - len + l + 1;
                let lone_q: Vec<f32> = (0..heads)
                    .flat_map(|h| q[(h * len + l) * d..(h * len + l + 1) * d].to_vec())
                    .collect();
                let cut = |x: &[f32]| -> Vec<f32> {
                    (0..kv_heads)
                        .flat_map(|h| x[h * total * d..(h * total + upto) * d].to_vec())
                        .collect()
                };
                let mut out = vec![0f32; heads * d];
                let dims = (heads, kv_heads, 1, upto, d);
                kernel(&lone_q, &cut(k), &cut(v), dims, 0.125, &mut out);
                (lone_q, out)
            })
            .collect();
        (block, lone)
    }

    #[test]
    fn the_dot_is_the_same_with_and_without_wide_registers() {
        for len in [1, 15, 16, 17, 64, 384, 1000] {
            let (a, b) = (values(len, 0.5), values(len, 7.0));
            assert_eq!(dot(&a, &b).to_bits(), dot_lanes(&a, &b).to_bits(), "{len}");
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!(
                (dot(&a, &b) as f64 - exact).abs() < 1e-4 * len as f64,
                "{len}"
            );
        }
    }

    #[test]
    fn rows_dotted_together_are_each_rows_own_dot() {
        for len in [1, 15, 16, 17, 64, 384, 1000] {
            let w = values(len, 0.25);
            let xs: Vec<Vec<f32>> = (0..4).map(|r| values(len, 3.0 + r as f32)).collect();
            let together = dot4([&xs[0][..], &xs[1], &xs[2], &xs[3]], &w);
            for r in 0..4 {
                assert_eq!(
                    together[r].to_bits(),
                    dot(&xs[r], &w).to_bits(),
                    "{len}, row {r}"
                );
                assert_eq!(
                    together[r].to_bits(),
                    dot_lanes(&xs[r], &w).to_bits(),
                    "{len}, row {r}"
                );
            }
        }
    }

    /// Weights stored as bf16 give bit for bit the product of the same
    /// values stored as f32, one row or four at a time.
    #[test]
    fn bf16_stored_weights_give_the_f32_product() {
        for (cols, k) in [(8, 384), (96, 1000), (33, 17)] {
            let w16: Vec<bf16> = values(cols * k, 5.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let w32: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
            let x = values(6 * k, 2.0);
            let (mut a, mut b) = (vec![0f32; 6 * cols], vec![0f32; 6 * cols]);
            matmul_nt(&x, &w16, k, &mut a);
            matmul_nt(&x, &w32, k, &mut b);
            assert_eq!(a, b, "{cols}x{k}");
        }
    }

    /// Maps stacked into one product give each map's own product, bit for
    /// bit, in the input's shape and dtype.
    #[test]
    fn stacked_maps_give_each_maps_own_product() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let k = 384;
        let cols = [96, 8, 200];
        let parts: Vec<Array> = cols
            .iter()
            .enumerate()
            .map(|(i, &n)| Array::from_slice(&values(n * k, i as f32), &[n as i32, k as i32]))
            .collect();
        let stacked = mlx_rs::ops::concatenate(&parts, 0).unwrap();
        stacked.eval().unwrap();
        let rows = |weight: &Array| HostMatrix::rows(weight).unwrap();
        let x = Array::from_slice(&values(5 * k, 9.0), &[1, 5, k as i32])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let cols = cols.map(|n| n as i32);
        let split = linear_split(&x, &rows(&stacked), &cols).unwrap();
        assert_eq!(split.len(), 3);
        for (part, (weight, n)) in split.iter().zip(parts.iter().zip(cols)) {
            weight.eval().unwrap();
            let own = linear(&x, &rows(weight)).unwrap();
            assert_eq!(part.shape(), &[1, 5, n]);
            assert_eq!(part.dtype(), Dtype::Bfloat16);
            assert_eq!(host_f32(part).unwrap(), host_f32(&own).unwrap());
        }
    }

    /// Row i of an M-row product is bit for bit the 1-row product of row
    /// i, for every M up to a verify block and a prefill chunk, on one
    /// thread and on many.
    #[test]
    fn matmul_rows_do_not_depend_on_how_many_there_are() {
        for (cols, k) in [(8, 384), (1152, 384), (384, 1152), (3000, 64)] {
            let w = values(cols * k, 3.0);
            let x = values(80 * k, 11.0);
            let single = |m: usize| {
                let mut out = vec![0f32; cols];
                matmul_nt(&x[m * k..(m + 1) * k], &w, k, &mut out);
                out
            };
            let singles: Vec<Vec<f32>> = (0..80).map(single).collect();
            for rows in [2, 3, 5, 16, 80] {
                let mut out = vec![0f32; rows * cols];
                matmul_nt(&x[..rows * k], &w, k, &mut out);
                for m in 0..rows {
                    assert_eq!(
                        out[m * cols..(m + 1) * cols],
                        singles[m][..],
                        "{cols}x{k}, {rows} rows, row {m}"
                    );
                }
            }
        }
    }

    /// A query's output is the same attending alone (a decode step) or
    /// with the rest of its block (a verify), and matches the textbook
    /// softmax within f32 rounding.
    #[test]
    fn attention_rows_do_not_depend_on_the_block() {
        let (heads, kv_heads, d, total, len) = (6, 2, 64, 40, 16);
        let q = values(heads * len * d, 1.0);
        let k = values(kv_heads * total * d, 2.0);
        let v = values(kv_heads * total * d, 3.0);
        let (block, lone) = block_and_lone(attention, &q, &k, &v, (heads, kv_heads, len, total, d));
        for (l, (lone_q, lone)) in lone.iter().enumerate() {
            // The query alone, with the keys up to its own position.
            let upto = total - len + l + 1;
            for h in 0..heads {
                let row = &block[(h * len + l) * d..(h * len + l + 1) * d];
                assert_eq!(row, &lone[h * d..(h + 1) * d], "query {l}, head {h}");
                // Textbook softmax in f64.
                let kv = h / (heads / kv_heads);
                let qr = &lone_q[h * d..(h + 1) * d];
                let scores: Vec<f64> = (0..upto)
                    .map(|s| {
                        let key = &k[(kv * total + s) * d..(kv * total + s + 1) * d];
                        qr.iter()
                            .zip(key)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * 0.125
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total_e: f64 = e.iter().sum();
                for j in 0..d {
                    let want: f64 = (0..upto)
                        .map(|s| e[s] * v[(kv * total + s) * d + j] as f64)
                        .sum::<f64>()
                        / total_e;
                    assert!((row[j] as f64 - want).abs() < 1e-5, "{} vs {want}", row[j]);
                }
            }
        }
    }
}
