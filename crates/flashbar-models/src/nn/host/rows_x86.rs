//! The AVX-512 tile of [`super::rows`]: four input rows against four
//! weight rows, sixteen dots at once, each the bits of its own [`dot`]
//! (lane l of a 16-lane register sums exactly as [`dot_lanes`]'s `acc[l]`,
//! a multiply then an add, never fused; then the same fold and tail). Each
//! load of an input row serves four weight rows and each load of a weight
//! row four input rows, where [`dot4`] loaded an input row for every
//! weight row: a verify's rows over f32 weights (the mid-size model's
//! maps, docs/cpu.md "The host kernels") cost what their multiplies cost.

use super::*;
use std::arch::x86_64::*;

/// Sixteen weights widened into one AVX-512 register.
#[inline(always)]
unsafe fn load16<W: Load8>(p: *const W) -> __m512 {
    let (lo, hi) = (W::load8(p), W::load8(p.add(8)));
    let both = _mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    );
    _mm512_castpd_ps(both)
}

/// `out[c][r]` = [`dot`]`(xs[r], ws[c])`, bit for bit.
///
/// # Safety
/// AVX-512F, and every row of `xs` and `ws` of one length.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot4x4_avx512<W: Load8>(xs: [&[f32]; 4], ws: [&[W]; 4]) -> [[f32; 4]; 4] {
    let k = ws[0].len();
    assert!(xs.iter().all(|x| x.len() == k) && ws.iter().all(|w| w.len() == k));
    let whole = k / LANES * LANES;
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let mut i = 0;
    while i < whole {
        let w: [__m512; 4] = std::array::from_fn(|c| load16(ws[c].as_ptr().add(i)));
        for r in 0..4 {
            let x = _mm512_loadu_ps(xs[r].as_ptr().add(i));
            for c in 0..4 {
                acc[c][r] = _mm512_add_ps(acc[c][r], _mm512_mul_ps(x, w[c]));
            }
        }
        i += LANES;
    }
    let mut out = [[0f32; 4]; 4];
    for c in 0..4 {
        for r in 0..4 {
            let mut lanes = [0f32; LANES];
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc[c][r]);
            out[c][r] = fold_lanes(lanes, &xs[r][whole..], &ws[c][whole..]);
        }
    }
    out
}

/// The weight rows `ws` (`[count, k]`) of [`matmul_nt`] against every row
/// of `x` in tiles of 4 by 4, where the CPU has AVX-512 and there are 4
/// rows; the rows past the last whole tile by [`dot`]. `put(m, j, value)`
/// with j counted from the first of `ws`. Returns how many weight rows it
/// did (a multiple of 4; the caller does the rest).
pub(super) fn tiles<W: HostWeight>(
    x: &[f32],
    ws: &[W],
    k: usize,
    put: &mut dyn FnMut(usize, usize, f32),
) -> usize {
    let (rows, count) = (x.len() / k, ws.len() / k);
    if rows < ROW_BLOCK || !simd().avx512() {
        return 0;
    }
    let (row, wr) = (
        |m: usize| &x[m * k..(m + 1) * k],
        |j: usize| &ws[j * k..(j + 1) * k],
    );
    let mut j = 0;
    while j + 4 <= count {
        let mut m = 0;
        while m + ROW_BLOCK <= rows {
            let xs = [row(m), row(m + 1), row(m + 2), row(m + 3)];
            // SAFETY: the CPU has AVX-512F (`simd`); every row is k long.
            let tile = unsafe { dot4x4_avx512(xs, [wr(j), wr(j + 1), wr(j + 2), wr(j + 3)]) };
            for (c, sums) in tile.iter().enumerate() {
                for (r, &sum) in sums.iter().enumerate() {
                    put(m + r, j + c, sum);
                }
            }
            m += ROW_BLOCK;
        }
        for m in m..rows {
            for c in 0..4 {
                put(m, j + c, dot(row(m), wr(j + c)));
            }
        }
        j += 4;
    }
    j
}
