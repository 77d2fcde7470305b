//! The x86-64 vector kernels of [`super::columns`]: a block of R input rows
//! by B registers of output columns, each lane its column's sum in k order
//! (so the bits of [`column_scalar`]), and the drivers that cover a range
//! of columns with them. R rows share every load and widening of a weight
//! register, so a verify's 16 rows cost what their multiplies and adds
//! cost (docs/cpu.md, "The host kernels"); which block runs never changes
//! what a row computes.

use super::*;

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

/// k steps (a panel's row of 16 weights each) that the kernels ask for
/// ahead of the one they multiply: 4 KB of each weight stream. A verify's
/// rows compute long enough on each load that the hardware's prefetch
/// alone left them waiting on memory (the embedded target's 27.5 MB of
/// weights do not stay in cache between two passes): 7.9 -> 6.6 ms for its
/// maps by 16 rows on one core (examples/host_matmul.rs).
const AHEAD: usize = 128;

/// Asks for the weights [`AHEAD`] steps past step `i` of each stream (past
/// a panel's end: the next panel's, which follows it in memory; a prefetch
/// never faults).
#[inline(always)]
unsafe fn prefetch<const B: usize>(from: &[*const bf16; B], i: usize) {
    use std::arch::x86_64::*;
    for f in from {
        _mm_prefetch::<_MM_HINT_T0>(f.wrapping_add((i + AHEAD) * PANEL) as *const i8);
    }
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
        prefetch(&from, i);
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
        prefetch(&from, i);
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

/// Columns `[c0, c1)` (`c0` a multiple of [`PANEL`]) of every row of `x`
/// `[rows, k]` into `out` `[rows, c1 - c0]`, every whole panel by AVX-512
/// blocks: sixteen rows by one register (sixteen sums in flight, one
/// widened weight load per sixteen products), then eight or four rows by
/// two, the rest one by one (a decode step: one row by four registers).
/// Returns the first column left for the scalar tail.
pub(super) fn range_avx512(
    x: &[f32],
    k: usize,
    w: &[bf16],
    (c0, c1): (usize, usize),
    sum: ColumnSum,
    out: &mut [f32],
) -> usize {
    let rows = x.len() / k;
    let width = c1 - c0;
    let (first, end) = (c0 / PANEL, c0 / PANEL + width / PANEL);
    macro_rules! run {
        ($r:literal, $b:literal, $m:expr, $p:expr) => {{
            let block: [usize; $r] = std::array::from_fn(|i| $m + i);
            let at = $p * PANEL - c0;
            // SAFETY: the CPU has AVX-512F (`simd`); the kernel's asserts
            // keep its loads inside `w` and its stores inside `out`.
            unsafe {
                match sum {
                    ColumnSum::Bf16 => {
                        strip_avx512::<$r, $b, true>(x, k, block, w, $p, out, width, at)
                    }
                    ColumnSum::F32 => {
                        strip_avx512::<$r, $b, false>(x, k, block, w, $p, out, width, at)
                    }
                }
            }
        }};
    }
    let mut p = first;
    while p < end {
        if rows < 4 && p + 4 <= end {
            for m in 0..rows {
                run!(1, 4, m, p);
            }
            p += 4;
            continue;
        }
        let two = p + 2 <= end;
        let mut m = 0;
        while m + 16 <= rows {
            run!(16, 1, m, p);
            if two {
                run!(16, 1, m, p + 1);
            }
            m += 16;
        }
        if m + 8 <= rows {
            if two {
                run!(8, 2, m, p);
            } else {
                run!(8, 1, m, p);
            }
            m += 8;
        }
        while m + 4 <= rows {
            if two {
                run!(4, 2, m, p);
            } else {
                run!(4, 1, m, p);
            }
            m += 4;
        }
        for m in m..rows {
            if two {
                run!(1, 2, m, p);
            } else {
                run!(1, 1, m, p);
            }
        }
        p += if two { 2 } else { 1 };
    }
    end * PANEL
}

/// [`range_avx512`] with eight-lane registers (sixteen of them, so eight
/// rows by one register at most): every whole register of columns.
pub(super) fn range_avx2(
    x: &[f32],
    k: usize,
    w: &[bf16],
    (c0, c1): (usize, usize),
    sum: ColumnSum,
    out: &mut [f32],
) -> usize {
    let rows = x.len() / k;
    let width = c1 - c0;
    let end = c0 + width / 8 * 8;
    macro_rules! run {
        ($r:literal, $b:literal, $m:expr, $c:expr) => {{
            let block: [usize; $r] = std::array::from_fn(|i| $m + i);
            let at = $c - c0;
            // SAFETY: the CPU has AVX2 (`simd`); the kernel's asserts keep
            // its loads inside `w` and its stores inside `out`.
            unsafe {
                match sum {
                    ColumnSum::Bf16 => {
                        strip_avx2::<$r, $b, true>(x, k, block, w, $c, out, width, at)
                    }
                    ColumnSum::F32 => {
                        strip_avx2::<$r, $b, false>(x, k, block, w, $c, out, width, at)
                    }
                }
            }
        }};
    }
    let mut c = c0;
    while c < end {
        if rows < 4 && c + 32 <= end {
            for m in 0..rows {
                run!(1, 4, m, c);
            }
            c += 32;
            continue;
        }
        let two = c + 16 <= end;
        let mut m = 0;
        while m + 8 <= rows {
            run!(8, 1, m, c);
            if two {
                run!(8, 1, m, c + 8);
            }
            m += 8;
        }
        while m + 4 <= rows {
            if two {
                run!(4, 2, m, c);
            } else {
                run!(4, 1, m, c);
            }
            m += 4;
        }
        for m in m..rows {
            if two {
                run!(1, 2, m, c);
            } else {
                run!(1, 1, m, c);
            }
        }
        c += if two { 16 } else { 8 };
    }
    end
}
