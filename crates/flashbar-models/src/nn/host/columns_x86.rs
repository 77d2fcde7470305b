//! The x86-64 vector kernels of [`super::columns`]: a block of R input rows
//! by a few registers of output columns, each lane its column's sum in k
//! order (so the bits of [`column_scalar`]), and the drivers that cover a
//! range of columns with them. R rows share every load and widening of a
//! weight register, so a verify's 16 rows cost what their multiplies and
//! adds cost (docs/cpu.md, "The host kernels"); which block runs never
//! changes what a row computes.

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

/// A panel's row of sixteen bf16 weights as two registers of f32: lane j
/// of the first is column 2j, of the second column 2j + 1. Read as eight
/// 32-bit words, a word holds column 2j in its low half and 2j + 1 in its
/// high half, and a bf16 is the high half of its f32: a shift widens the
/// first, a mask the second. Two operations for sixteen weights (a
/// widening load and a shift for eight before), and the lanes are exact
/// f32 values, so nothing a lane sums changes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn widen_pairs(
    at: *const bf16,
    high: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256; 2] {
    use std::arch::x86_64::*;
    let words = _mm256_loadu_si256(at as *const __m256i);
    [
        _mm256_castsi256_ps(_mm256_slli_epi32(words, 16)),
        _mm256_castsi256_ps(_mm256_and_si256(words, high)),
    ]
}

/// One step of a lane's sum as [`column_scalar`] takes it for the
/// [`ColumnSum`] numbered `SUM`: `sum + x w`, fused, or a multiply then an
/// add (each rounded to bf16 for [`ColumnSum::Bf16`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step8<const SUM: u8>(
    sum: std::arch::x86_64::__m256,
    x: std::arch::x86_64::__m256,
    w: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if SUM == ColumnSum::Fused as u8 {
        _mm256_fmadd_ps(x, w, sum)
    } else if SUM == ColumnSum::Bf16 as u8 {
        round8(_mm256_add_ps(sum, round8(_mm256_mul_ps(x, w))))
    } else {
        _mm256_add_ps(sum, _mm256_mul_ps(x, w))
    }
}

/// `P` whole panels from panel `p0` of `R` rows (`rows`, each `k` long in
/// `x`): every lane sums its column exactly as [`column_scalar`] does for
/// the [`ColumnSum`] numbered `SUM` ([`step8`]), so the bits are the same
/// whatever the block. Writes `16 P` outputs per row into those columns
/// of `out` (panel `p0`'s first on).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn panels_avx2<const R: usize, const P: usize, const SUM: u8>(
    x: &[f32],
    k: usize,
    rows: [usize; R],
    w: &[bf16],
    p0: usize,
    out: Outputs,
) {
    use std::arch::x86_64::*;
    // Rows of the whole product's outputs; the strip's first column.
    let (out_cols, out_c0) = (out.stride, p0 * PANEL);
    assert!((p0 + P) * k * PANEL <= w.len() && out_c0 + PANEL * P <= out_cols);
    // acc[r][p]: the even and the odd columns of panel p for row r.
    let mut acc = [[[_mm256_setzero_ps(); 2]; P]; R];
    let xs = rows.map(|r| x[r * k..(r + 1) * k].as_ptr());
    let from: [*const half::bf16; P] =
        std::array::from_fn(|p| w.as_ptr().add((p0 + p) * k * PANEL));
    let high = _mm256_set1_epi32(-65536);
    for i in 0..k {
        prefetch(&from, i);
        let ws: [[__m256; 2]; P] =
            std::array::from_fn(|p| widen_pairs(from[p].add(i * PANEL), high));
        for r in 0..R {
            let xb = _mm256_broadcast_ss(&*xs[r].add(i));
            for p in 0..P {
                for (sum, w) in acc[r][p].iter_mut().zip(ws[p]) {
                    *sum = step8::<SUM>(*sum, xb, w);
                }
            }
        }
    }
    for (row, panels) in rows.iter().zip(&acc) {
        assert!((row + 1) * out_cols <= out.len());
        for (p, [even, odd]) in panels.iter().enumerate() {
            // Columns 0-3 | 8-11 and 4-7 | 12-15, then in order.
            let low = _mm256_unpacklo_ps(*even, *odd);
            let up = _mm256_unpackhi_ps(*even, *odd);
            let at = out.as_mut_ptr().add(row * out_cols + out_c0 + PANEL * p);
            _mm256_storeu_ps(at, _mm256_permute2f128_ps(low, up, 0x20));
            _mm256_storeu_ps(at.add(8), _mm256_permute2f128_ps(low, up, 0x31));
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

/// [`panels_avx2`] with sixteen-lane registers, one panel each, from panel
/// `p0`: the same operations per lane, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn strip_avx512<const R: usize, const B: usize, const SUM: u8>(
    x: &[f32],
    k: usize,
    rows: [usize; R],
    w: &[bf16],
    p0: usize,
    out: Outputs,
) {
    use std::arch::x86_64::*;
    // Rows of the whole product's outputs; the strip's first column.
    let (out_cols, out_c0) = (out.stride, p0 * PANEL);
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
                acc[r][b] = if SUM == ColumnSum::Fused as u8 {
                    _mm512_fmadd_ps(xb, ws[b], acc[r][b])
                } else if SUM == ColumnSum::Bf16 as u8 {
                    round16(_mm512_add_ps(acc[r][b], round16(_mm512_mul_ps(xb, ws[b]))))
                } else {
                    _mm512_add_ps(acc[r][b], _mm512_mul_ps(xb, ws[b]))
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
/// `[rows, k]` into those columns of `out`, every whole panel by AVX-512
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
    out: Outputs,
) -> usize {
    let rows = x.len() / k;
    let (first, end) = (c0 / PANEL, c1 / PANEL);
    macro_rules! run {
        ($r:literal, $b:literal, $m:expr, $p:expr) => {{
            let block: [usize; $r] = std::array::from_fn(|i| $m + i);
            // SAFETY: the CPU has AVX-512F (`simd`); the kernel's asserts
            // keep its loads inside `w` and its stores inside `out`.
            unsafe {
                match sum {
                    ColumnSum::Bf16 => {
                        strip_avx512::<$r, $b, { ColumnSum::Bf16 as u8 }>(x, k, block, w, $p, out)
                    }
                    ColumnSum::F32 => {
                        strip_avx512::<$r, $b, { ColumnSum::F32 as u8 }>(x, k, block, w, $p, out)
                    }
                    ColumnSum::Fused => {
                        strip_avx512::<$r, $b, { ColumnSum::Fused as u8 }>(x, k, block, w, $p, out)
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

/// [`range_avx512`] with eight-lane registers (sixteen of them): every
/// whole panel by blocks of four rows by one panel (eight sums in flight,
/// each panel's row of weights loaded and widened once for four rows; on
/// this machine's Zen 3 the broadcasts of the rows' values, not the
/// arithmetic, bounded eight rows by half a panel), the rest of the rows
/// one by one by two panels (a decode step). Returns the first column left
/// for the scalar tail.
pub(super) fn range_avx2(
    x: &[f32],
    k: usize,
    w: &[bf16],
    (c0, c1): (usize, usize),
    sum: ColumnSum,
    out: Outputs,
) -> usize {
    let rows = x.len() / k;
    let (first, end) = (c0 / PANEL, c1 / PANEL);
    macro_rules! run {
        ($r:literal, $p:literal, $m:expr, $at:expr) => {{
            let block: [usize; $r] = std::array::from_fn(|i| $m + i);
            // SAFETY: the CPU has AVX2 and FMA (`simd`); the kernel's
            // asserts keep its loads inside `w` and its stores inside `out`.
            unsafe {
                match sum {
                    ColumnSum::Bf16 => {
                        panels_avx2::<$r, $p, { ColumnSum::Bf16 as u8 }>(x, k, block, w, $at, out)
                    }
                    ColumnSum::F32 => {
                        panels_avx2::<$r, $p, { ColumnSum::F32 as u8 }>(x, k, block, w, $at, out)
                    }
                    ColumnSum::Fused => {
                        panels_avx2::<$r, $p, { ColumnSum::Fused as u8 }>(x, k, block, w, $at, out)
                    }
                }
            }
        }};
    }
    let mut p = first;
    while p < end {
        let two = p + 2 <= end;
        let mut m = 0;
        while m + 4 <= rows {
            run!(4, 1, m, p);
            if two {
                run!(4, 1, m, p + 1);
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
