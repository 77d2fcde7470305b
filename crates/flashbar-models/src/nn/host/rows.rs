//! Row-major kernels: each output a dot product of 16 lanes folded in a
//! fixed tree (f32 weights, and bf16 ones widened exactly), and the
//! sequential dot of MLX's CPU reductions.

use super::*;

/// Lanes of every dot product; their sums are folded in a fixed tree.
pub(super) const LANES: usize = 16;

/// Work (multiply-adds) below which a product runs on one thread: a
/// decode step's small projections cost less than handing them out.
pub(super) const PARALLEL_FROM: usize = 1 << 17;

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
pub(super) fn dot_lanes<X: Weight, W: Weight>(a: &[X], b: &[W]) -> f32 {
    let mut acc = [0f32; LANES];
    let whole = a.len() / LANES * LANES;
    for (x, y) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for l in 0..LANES {
            acc[l] += x[l].widen() * y[l].widen();
        }
    }
    fold_lanes(acc, &a[whole..], &b[whole..])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_avx2<X: Weight, W: Weight>(a: &[X], b: &[W]) -> f32 {
    dot_lanes(a, b)
}

/// [`dot_lanes`], compiled for AVX2 where the CPU has it: the same
/// operations in the same order, so the same bits, only wider registers.
#[inline]
pub fn dot<X: Weight, W: Weight>(a: &[X], b: &[W]) -> f32 {
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
pub(super) fn fold_lanes<X: Weight, W: Weight>(
    mut acc: [f32; LANES],
    x_tail: &[X],
    w_tail: &[W],
) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for (x, y) in x_tail.iter().zip(w_tail) {
        sum += x.widen() * y.widen();
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
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot4_avx2<X: Load8, W: Load8>(xs: [&[X]; 4], w: &[W]) -> [f32; 4] {
    use std::arch::x86_64::*;
    // Every row is read as far as `w`.
    assert!(xs.iter().all(|x| x.len() >= w.len()));
    let whole = w.len() / LANES * LANES;
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < whole {
        let w0 = W::load8(w.as_ptr().add(i));
        let w1 = W::load8(w.as_ptr().add(i + 8));
        for r in 0..4 {
            let p = xs[r].as_ptr().add(i);
            lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(X::load8(p), w0));
            hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(X::load8(p.add(8)), w1));
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
    // Stored as one vector: a caller that reads the four as one vector
    // (attention's scores) would otherwise wait for four scalar stores to
    // reach memory (a failed store-to-load forward, some 15 cycles).
    let mut out = [0f32; 4];
    _mm_storeu_ps(
        out.as_mut_ptr(),
        _mm_set_ps(sums[3], sums[2], sums[1], sums[0]),
    );
    out
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
pub(super) fn dot4<X: HostWeight, W: HostWeight>(xs: [&[X]; 4], w: &[W]) -> [f32; 4] {
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
pub(super) const ROW_BLOCK: usize = 4;

/// `out[m, n] = x[m, :] . w[n, :]` for `x` `[rows, k]` and `w` `[cols, k]`,
/// both row-major. Each element is bit for bit one [`dot`], however many
/// rows come together: row-invariant by design.
pub fn matmul_nt<W: HostWeight>(x: &[f32], w: &[W], k: usize, out: &mut [f32]) {
    let (rows, cols) = (x.len() / k, w.len() / k);
    debug_assert_eq!(out.len(), rows * cols);
    // One weight row at a time against every input row (4 at once): each
    // weight is read from memory once per product, the inputs stay in cache.
    // With AVX-512, four weight rows at a time against four input rows.
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
    // Weight rows `ws` (a run of them) into `put(m, j, value)`, j counted
    // from the first of `ws`.
    let columns = |ws: &[W], put: &mut dyn FnMut(usize, usize, f32)| {
        #[cfg(target_arch = "x86_64")]
        let done = rows_x86::tiles(x, ws, k, put);
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        for j in done..ws.len() / k {
            column(&ws[j * k..(j + 1) * k], &mut |m, v| put(m, j, v));
        }
    };
    if rows * cols * k < PARALLEL_FROM {
        columns(w, &mut |m, j, v| out[m * cols + j] = v);
        return;
    }
    // Threads take blocks of weight rows; each writes its own columns,
    // gathered per block and copied into place.
    let block = cols.div_ceil(pool::threads() * 4).max(1);
    let mut parts: Vec<(usize, Vec<f32>)> = (0..cols.div_ceil(block))
        .map(|b| (b * block, Vec::new()))
        .collect();
    let jobs: Vec<_> = w.chunks(block * k).zip(parts.iter_mut()).collect();
    pool::each(jobs, |(ws, (_, part))| {
        let width = ws.len() / k;
        *part = vec![0f32; rows * width];
        columns(ws, &mut |m, j, v| part[m * width + j] = v);
    });
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
pub fn sequential_dot<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in a.iter().zip(b) {
        sum += x * y.widen();
    }
    sum
}
