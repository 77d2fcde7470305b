//! CPU kernels in Rust over evaluated arrays, for the products a verify and
//! a decode step must compute alike: every output row comes from the same
//! fixed-order sums whatever the number of rows, so row i of a 16-token
//! verify is bit for bit the 1-token step of that token (docs/cpu.md, "Row
//! invariance"). BLAS does not promise that: OpenBLAS sums edge rows in
//! another order, and MLX's CPU attention multiplies through it.
//!
//! - [`rows`]: row-major weights (f32 checkpoints), each output a dot of 16
//!   lanes of separate multiplies and adds folded in a fixed tree (Rust
//!   never fuses them), so the rounding is the same with SSE, AVX2 or NEON;
//! - [`columns`]: bf16 weights in column panels, each output summed in k
//!   order in either [`Arithmetic`] (docs/cpu.md, "Parity with mlx-lm");
//! - [`attention`]: causal attention per query, f32 or MLX's bf16 fallback;
//! - here: the weights as loaded ([`HostMatrix`]), the linear maps and
//!   attention over MLX arrays, and the process's [`Arithmetic`].
//!
//! Rows are spread over threads ([`pool`]), which never changes what any
//! one row computes.

use crate::error::Result;
use half::bf16;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

/// `fn $name` whose body is compiled twice, for the baseline (SSE2) and
/// with AVX2 and FMA, the second taken where the CPU has them: the loops
/// of the host ops, the recurrence and attention then run on 8-lane
/// registers, and `mul_add` is one instruction instead of a library call.
/// Rust never fuses a multiply and an add on its own and the loops are
/// elementwise or summed in a fixed order, so both give the same bits
/// (docs/cpu.md, "Host ops").
macro_rules! vectorized {
    ($(#[$meta:meta])* $vis:vis fn $name:ident $(<$($g:ident: $bound:path),*>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name $(<$($g: $bound),*>)? ($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body $(<$($g: $bound),*>)? ($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn wide $(<$($g: $bound),*>)? ($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if $crate::nn::host::avx2_fma() {
                    // SAFETY: the CPU has AVX2 and FMA (checked just above).
                    return unsafe { wide($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use vectorized;

/// Whether this CPU runs [`vectorized`] bodies with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_fma() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

mod attention;
mod columns;
#[cfg(target_arch = "x86_64")]
mod columns_pairs;
#[cfg(test)]
mod columns_tests;
#[cfg(target_arch = "x86_64")]
mod columns_x86;
mod gates;
mod join;
mod kv;
mod ops;
pub mod pool;
mod rows;
#[cfg(target_arch = "x86_64")]
mod rows_x86;
#[cfg(target_arch = "x86_64")]
mod sigmoid_x86;
#[cfg(test)]
mod tests;

pub use attention::*;
pub use columns::*;
pub use gates::{attention_gate, gated_norm};
pub use join::{concatenate_ready, ids_ready, prefix_ready};
pub use kv::HostKv;
pub use ops::{
    add, norm_rows, rms_norm, sigmoid, sigmoids, silu, swiglu, takes, zip_with, zip_with_sigmoid,
    HostVector, ZIP_PARALLEL_FROM,
};
pub use rows::*;

/// Which arithmetic the host kernels use for bf16 checkpoints
/// (docs/cpu.md, "Parity with mlx-lm"): f32 sums by fused multiply-adds
/// ([`ColumnSum::Fused`]; the default: more precise, faster, and close to
/// MLX's GPU kernels, whose greedy continuations the drafters are trained
/// on), or MLX's CPU kernels bit for bit, whose
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

/// An array's values as f32, row-major (evaluated first). A row-major
/// bf16 or f32 array is read as it is (bf16 widens exactly); others are
/// cast and copied by MLX.
pub fn host_f32(array: &Array) -> Result<Vec<f32>> {
    match array.dtype() {
        Dtype::Bfloat16 => {
            if let Ok(values) = array.try_as_slice::<bf16>() {
                return Ok(widen_all(values));
            }
        }
        Dtype::Float32 => {
            if let Ok(values) = array.try_as_slice::<f32>() {
                return Ok(values.to_vec());
            }
        }
        _ => {}
    }
    let array = array.as_dtype(Dtype::Float32)?.contiguous()?;
    array.eval()?;
    Ok(array.as_slice::<f32>().to_vec())
}

/// `values` as an evaluated array of `dtype` and `shape`: rounded to bf16
/// here as MLX's cast rounds ([`round_bf16`]), so no MLX op is left to run;
/// other types through MLX's cast.
pub fn from_f32(values: &[f32], shape: &[i32], dtype: Dtype) -> Result<Array> {
    Ok(match dtype {
        Dtype::Float32 => Array::from_slice(values, shape),
        Dtype::Bfloat16 => Array::from_slice(&round_all(values), shape),
        _ => Array::from_slice(values, shape).as_dtype(dtype)?,
    })
}

vectorized! {
    /// bf16 values widened to f32 (exactly).
    fn widen_all(values: &[bf16]) -> Vec<f32> {
        values.iter().map(|v| v.widen()).collect()
    }
}

vectorized! {
    /// f32 values rounded to bf16 as MLX's cast rounds ([`round_bf16`]).
    fn round_all(values: &[f32]) -> Vec<bf16> {
        values
            .iter()
            .map(|&v| bf16::from_bits((round_bf16(v).to_bits() >> 16) as u16))
            .collect()
    }
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
    /// Column weights whose values the pair products take
    /// ([`bf16_in_pair_range`]; checked only where they can run).
    pub pair_range: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[n, k]` f32 or bf16, by [`matmul_nt`] (f32 checkpoints).
    Rows,
    /// bf16 panels ([`to_panels`]), by [`matmul_columns`]: bf16
    /// checkpoints, summed as the arithmetic says ([`ColumnSum`]). Inputs
    /// of another type than bf16 take [`ColumnSum::F32`] for
    /// [`ColumnSum::Bf16`].
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
            pair_range: false,
        })
    }

    /// `values` `[n, k]` (bf16 values) stored as bf16 panels, summed as `sum` says.
    pub fn columns(values: &Array, sum: ColumnSum) -> Result<Self> {
        let weight = to_panels(values)?;
        let pair_range = pairs_may_run(sum) && bf16_in_pair_range(weight.as_slice::<bf16>());
        Ok(HostMatrix {
            n: values.shape()[0] as usize,
            k: values.shape()[1] as usize,
            weight,
            layout: Layout::Columns(sum),
            pair_range,
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
                // MLX's roundings to bf16 are those of bf16 inputs.
                let sum = if sum == ColumnSum::Bf16 && dtype != Dtype::Bfloat16 {
                    ColumnSum::F32
                } else {
                    sum
                };
                let w = self.weight.as_slice::<bf16>();
                matmul_columns(xs, w, (k, n), sum, self.pair_range, &mut out)
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
    from_f32(&out, &out_shape, x.dtype())
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
            let mut part = Vec::with_capacity(out.len() / all * n);
            for row in out.chunks_exact(all) {
                part.extend_from_slice(&row[first..first + n]);
            }
            first += n;
            let mut part_shape = shape.clone();
            *part_shape.last_mut().unwrap() = n as i32;
            from_f32(&part, &part_shape, x.dtype())
        })
        .collect()
}

/// `residual + x W^T` in `x`'s type: the product rounded to the type and
/// added as [`add`] adds (the f32 sum rounded), the bits of [`linear`] then
/// [`add`] without the array between them (a verify's rows made that
/// array, then read it back, on one thread). None where [`add`] would not
/// take the two (other types or shapes).
pub fn linear_add(x: &Array, weight: &HostMatrix, residual: &Array) -> Result<Option<Array>> {
    let (_, cols) = weight.dims();
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap() = cols as i32;
    let Some(round) = ops::rounded(x.dtype()) else {
        return Ok(None);
    };
    if residual.dtype() != x.dtype() || residual.shape() != shape.as_slice() {
        return Ok(None);
    }
    let mut out = weight.product(&host_f32(x)?, x.dtype());
    let residual = host_f32(residual)?;
    ops::zip_with(&mut out, &residual, |p, r| {
        ops::store(r + ops::store(p, round), round)
    });
    Ok(Some(from_f32(&out, &shape, x.dtype())?))
}

/// SwiGLU's middle, `silu(gate) * up`, from one product of the stacked
/// `[gate | up]` maps (`half` outputs each): each half rounded to `x`'s
/// type as [`linear_split`] gives it, then [`swiglu`]'s own arithmetic, so
/// the same bits without the two arrays between. None for types
/// [`swiglu`] does not take.
pub fn linear_swiglu(x: &Array, weight: &HostMatrix, half: usize) -> Result<Option<Array>> {
    let (_, cols) = weight.dims();
    let Some(round) = ops::rounded(x.dtype()) else {
        return Ok(None);
    };
    if cols != 2 * half {
        return Ok(None);
    }
    let out = weight.product(&host_f32(x)?, x.dtype());
    let rows = out.len() / cols;
    let (mut gate, mut up) = (
        Vec::with_capacity(rows * half),
        Vec::with_capacity(rows * half),
    );
    for row in out.chunks_exact(cols) {
        gate.extend(row[..half].iter().map(|&v| ops::store(v, round)));
        up.extend(row[half..].iter().map(|&v| ops::store(v, round)));
    }
    ops::zip_with_sigmoid(&mut up, &gate, round, |u, g, s| {
        ops::store(ops::store(g * s, round) * u, round)
    });
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap() = half as i32;
    Ok(Some(from_f32(&up, &shape, x.dtype())?))
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
    let bf16 = [q, k, v].iter().all(|a| a.dtype() == Dtype::Bfloat16);
    let out = cached_attention(
        &qh,
        KvRows::packed(&kh, &vh, dims.3),
        dims,
        scale,
        arithmetic,
        bf16,
    );
    from_f32(&out, qs, q.dtype())
}

/// [`causal_attention`] of host queries `q` `[heads, len, d]` over `kv`
/// (a [`HostKv`]'s rows, or packed ones), `bf16` when the model computes
/// in bf16 (then [`Arithmetic::Mlx`] takes [`attention_bf16`]); returns
/// `[heads, len, d]` unrounded.
pub fn cached_attention<K: HostWeight>(
    q: &[f32],
    kv: KvRows<'_, K>,
    dims: (usize, usize, usize, usize, usize),
    scale: f32,
    arithmetic: Arithmetic,
    bf16: bool,
) -> Vec<f32> {
    let mut out = vec![0f32; q.len()];
    if arithmetic == Arithmetic::Mlx && bf16 {
        attention_bf16(q, kv, dims, scale, &mut out);
    } else {
        attention(q, kv, dims, scale, &mut out);
    }
    out
}
