//! The small row-wise ops of a layer (RMS norm, residual add, SwiGLU's
//! gate) on host memory, bit for bit what MLX's CPU ops compute for them,
//! so a decode step no longer hands each to MLX's worker thread between
//! two host products (docs/cpu.md, "Host ops"). MLX's CPU kernels are
//! scalar loops on Linux x86-64 (its SIMD width is 1 there): each op
//! computes in f32 and rounds its result to the array's type, and a
//! reduction sums in order from zero. What each op rounds is written with
//! it; `tests.rs` checks every one against MLX.
//!
//! Inputs are read without a copy through MLX when they are already
//! evaluated row-major bf16 or f32 ([`host_f32`]); outputs are evaluated
//! arrays made here ([`from_f32`]), which the next host op reads the same
//! way: a chain of host ops and products never waits for MLX.

use super::*;

/// An array's element type, when the host ops compute in it: bf16
/// (rounded after every op) or f32.
pub fn rounded(dtype: Dtype) -> Option<bool> {
    match dtype {
        Dtype::Bfloat16 => Some(true),
        Dtype::Float32 => Some(false),
        _ => None,
    }
}

/// Whether the host ops take arrays of this type (else MLX's ops run).
pub fn takes(dtype: Dtype) -> bool {
    rounded(dtype).is_some()
}

/// `x` rounded to the type (bf16 when `round`), as MLX stores an op's result.
#[inline(always)]
pub fn store(x: f32, round: bool) -> f32 {
    if round {
        round_bf16(x)
    } else {
        x
    }
}

/// A weight vector of a row-wise op (a norm's scale), its values as f32.
#[derive(Clone)]
pub struct HostVector {
    pub values: Vec<f32>,
    pub dtype: Dtype,
}

impl HostVector {
    pub fn of(array: &Array) -> Result<Self> {
        Ok(HostVector {
            values: host_f32(array)?,
            dtype: array.dtype(),
        })
    }
}

/// MLX's CPU `fast::rms_norm(x, w, eps)` for bf16 or f32 `x` and `w`,
/// which runs its fallback of ops there: `x` widened to f32, the squares
/// summed in order from zero, times `1/n` (rounded to f32), plus eps,
/// `1 / sqrt(..)`, `x` times that, rounded to the output type (bf16 when
/// both are bf16, else f32), times `w`, rounded to it. None for other
/// types (MLX's op runs then).
pub fn rms_norm(x: &Array, w: &HostVector, eps: f32) -> Result<Option<Array>> {
    let Some(out) = norm_type(x.dtype(), w.dtype) else {
        return Ok(None);
    };
    let mut values = host_f32(x)?;
    norm_rows(&mut values, w, eps, out == Dtype::Bfloat16);
    Ok(Some(from_f32(&values, x.shape(), out)?))
}

/// The output type of an RMS norm of `x` by a weight of type `w` (their
/// promotion), when the host ops take both.
pub fn norm_type(x: Dtype, w: Dtype) -> Option<Dtype> {
    match (rounded(x)?, rounded(w)?) {
        (true, true) => Some(Dtype::Bfloat16),
        _ => Some(Dtype::Float32),
    }
}

/// [`rms_norm`] in place over rows of `w`'s width, the results rounded to
/// bf16 when `round`; a verify's rows split over the pool's threads (each
/// row is computed alone, so the split changes no bit).
pub fn norm_rows(values: &mut [f32], w: &HostVector, eps: f32, round: bool) {
    let d = w.values.len();
    let threads = pool::threads();
    if values.len() < ZIP_PARALLEL_FROM || threads == 1 || values.len() < 2 * d {
        norm_rows_here(values, w, eps, round);
        return;
    }
    let rows = values.len() / d;
    let chunk = rows.div_ceil(threads) * d;
    pool::each(values.chunks_mut(chunk).collect(), |part| {
        norm_rows_here(part, w, eps, round)
    });
}

vectorized! {
    fn norm_rows_here(values: &mut [f32], w: &HostVector, eps: f32, round: bool) {
        let d = w.values.len();
        let inv_n = (1.0f64 / d as f64) as f32;
        for row in values.chunks_exact_mut(d) {
            let mut squares = 0f32;
            for &v in row.iter() {
                squares += v * v;
            }
            let r = 1.0f32 / (squares * inv_n + eps).sqrt();
            for (v, &wv) in row.iter_mut().zip(&w.values) {
                *v = store(store(*v * r, round) * wv, round);
            }
        }
    }
}

/// `a + b` for arrays of one shape and type, as MLX's add: the f32 sum
/// rounded to the type. None when they differ.
pub fn add(a: &Array, b: &Array) -> Result<Option<Array>> {
    let Some(round) = rounded(a.dtype()).filter(|_| b.dtype() == a.dtype()) else {
        return Ok(None);
    };
    if a.shape() != b.shape() {
        return Ok(None);
    }
    let mut values = host_f32(a)?;
    for (v, w) in values.iter_mut().zip(host_f32(b)?) {
        *v = store(*v + w, round);
    }
    Ok(Some(from_f32(&values, a.shape(), a.dtype())?))
}

/// MLX's CPU sigmoid: `y = 1 / (1 + exp(|x|))` in f32 with MLX's exp
/// rounded to the type, then `y` for negative `x`, else `1 - y`, rounded
/// to the type.
#[inline(always)]
pub fn sigmoid(x: f32, round: bool) -> f32 {
    let y = 1.0f32 / (1.0f32 + store(mlx_exp(x.abs()), round));
    store(if x < 0.0 { y } else { 1.0 - y }, round)
}

/// `out[i] = sigmoid(x[i], round)`, eight at a time where the CPU has AVX2
/// and FMA (the same bits: `sigmoid_x86.rs`).
pub fn sigmoids(x: &[f32], round: bool, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (just checked).
        unsafe { sigmoid_x86::sigmoids(x, round, out) };
        return;
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = sigmoid(v, round);
    }
}

/// `a[i] = f(a[i], b[i], sigmoid(b[i], round))`: a gate's arithmetic
/// around the sigmoid of its gate values, the sigmoids computed in blocks
/// by [`sigmoids`] and the rows split over threads as [`zip_with`] does
/// (each value alone: the same bits as one by one).
pub fn zip_with_sigmoid(
    a: &mut [f32],
    b: &[f32],
    round: bool,
    f: impl Fn(f32, f32, f32) -> f32 + Sync,
) {
    assert_eq!(a.len(), b.len());
    let here = |a: &mut [f32], b: &[f32]| {
        let mut s = [0f32; 256];
        for (a, b) in a.chunks_mut(256).zip(b.chunks(256)) {
            let s = &mut s[..b.len()];
            sigmoids(b, round, s);
            for ((a, &b), &s) in a.iter_mut().zip(b).zip(s.iter()) {
                *a = f(*a, b, s);
            }
        }
    };
    let threads = pool::threads();
    if a.len() < ZIP_PARALLEL_FROM || threads == 1 {
        here(a, b);
        return;
    }
    let chunk = a.len().div_ceil(threads);
    let jobs: Vec<_> = a.chunks_mut(chunk).zip(b.chunks(chunk)).collect();
    pool::each(jobs, |(a, b)| here(a, b));
}

/// mlx-rs's `silu` (`x * sigmoid(x)`, compiled; the JIT's kernel rounds
/// each intermediate to the type as the ops would).
#[inline(always)]
pub fn silu(x: f32, round: bool) -> f32 {
    store(x * sigmoid(x, round), round)
}

/// SwiGLU's middle, `silu(gate) * up`, for arrays of one shape and type.
/// None when they differ.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Option<Array>> {
    let Some(round) = rounded(gate.dtype()).filter(|_| up.dtype() == gate.dtype()) else {
        return Ok(None);
    };
    if gate.shape() != up.shape() {
        return Ok(None);
    }
    let mut values = host_f32(up)?;
    zip_with_sigmoid(&mut values, &host_f32(gate)?, round, |u, g, s| {
        store(store(g * s, round) * u, round)
    });
    Ok(Some(from_f32(&values, gate.shape(), gate.dtype())?))
}

/// `a[i] = f(a[i], b[i])`. MLX's exp multiplies and adds fused
/// (`std::fma`); without the FMA instructions enabled Rust calls a library
/// routine for each, so on x86-64 machines that have them the loop is
/// compiled with them (the same correctly rounded result, several times
/// faster). A verify's rows (from [`ZIP_PARALLEL_FROM`] values) are split
/// over the pool's threads: each value is computed alone, so the split
/// changes no bit, and SwiGLU's gate over 16 rows took a tenth of a
/// verify on one thread while the other waited.
pub fn zip_with(a: &mut [f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    assert_eq!(a.len(), b.len());
    let threads = pool::threads();
    if a.len() < ZIP_PARALLEL_FROM || threads == 1 {
        zip_with_here(a, b, &f);
        return;
    }
    let chunk = a.len().div_ceil(threads);
    let jobs: Vec<_> = a.chunks_mut(chunk).zip(b.chunks(chunk)).collect();
    pool::each(jobs, |(a, b)| zip_with_here(a, b, &f));
}

/// Values from which [`zip_with`] splits its work over threads.
pub const ZIP_PARALLEL_FROM: usize = 4096;

fn zip_with_here(a: &mut [f32], b: &[f32], f: &impl Fn(f32, f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("sse4.1") {
        // SAFETY: the features were just detected.
        unsafe { zip_with_fma(a, b, f) };
        return;
    }
    for (x, &y) in a.iter_mut().zip(b) {
        *x = f(*x, y);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,sse4.1")]
unsafe fn zip_with_fma(a: &mut [f32], b: &[f32], f: &impl Fn(f32, f32) -> f32) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x = f(*x, y);
    }
}
