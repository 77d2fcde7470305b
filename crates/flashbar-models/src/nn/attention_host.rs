//! Gated attention's head on the CPU's host path: the q/k RMS norms, RoPE
//! and the KV cache's growth, in Rust on the arrays the q/k/v product
//! returns, bit for bit the MLX ops of `attention.rs` (docs/cpu.md, "Host
//! ops"), so a decode step's attention layer hands nothing to MLX either.
//!
//! MLX's CPU RoPE is a fallback of ops: positions `(t + offset) * scale`,
//! inverse frequencies `exp(-i * ln(base) / (dims / 2))` (MLX's exp), the
//! angles' cos and sin by MLX's own polynomial ([`mlx_sin_cos`]) rounded to
//! the activations' type, then `x1 c - x2 s` and `x1 s + x2 c` with every
//! product and sum rounded to it. Taken for bf16 activations and norms and
//! unscaled or linearly scaled RoPE; others keep MLX's ops.

use crate::config::{Rope, Scaling};
use crate::error::Result;
use crate::nn::host::{self, host_f32, round_bf16, HostVector};
use mlx_rs::{Array, Dtype};

pub struct HostAttention {
    q_norm: HostVector,
    k_norm: HostVector,
    /// The inverse frequency of each rotated pair (half the rotated dims).
    inv_freqs: Vec<f32>,
    scale: f32,
    eps: f32,
}

/// Queries `[H, L, d]`, keys and values `[kvH, L, d]` after the norms
/// and RoPE, on the host (bf16 values).
pub type Projected = (Vec<f32>, Vec<f32>, Vec<f32>);

impl HostAttention {
    pub fn new(q_norm: &Array, k_norm: &Array, rope: Rope, eps: f32) -> Result<Option<Self>> {
        let Scaling::Linear(scale) = rope.scaling else {
            return Ok(None);
        };
        if [q_norm, k_norm]
            .iter()
            .any(|w| w.dtype() != Dtype::Bfloat16)
        {
            return Ok(None);
        }
        let half = rope.dims / 2;
        let step = rope.theta.ln() / half as f32;
        let inv_freqs = (0..half)
            .map(|i| host::mlx_exp(-(i as f32) * step))
            .collect();
        Ok(Some(HostAttention {
            q_norm: HostVector::of(q_norm)?,
            k_norm: HostVector::of(k_norm)?,
            inv_freqs,
            scale,
            eps,
        }))
    }

    /// From the products `q_gate` `[1, L, H * 2d]` (queries and gates side
    /// by side per head), `k`, `v` `[1, L, kvH * d]` (bf16) at positions
    /// `offset..`. None for other types.
    pub fn project(
        &self,
        [q_gate, k, v]: [&Array; 3],
        heads: usize,
        d: usize,
        offset: i32,
    ) -> Result<Option<Projected>> {
        if [q_gate, k, v].iter().any(|a| a.dtype() != Dtype::Bfloat16) {
            return Ok(None);
        }
        let len = q_gate.shape()[1] as usize;
        let kv_heads = k.shape()[2] as usize / d;
        let qg = host_f32(q_gate)?;
        let mut q = vec![0f32; heads * len * d];
        for l in 0..len {
            for h in 0..heads {
                q[(h * len + l) * d..][..d].copy_from_slice(&qg[(l * heads + h) * 2 * d..][..d]);
            }
        }
        let mut keys = by_heads(&host_f32(k)?, len, kv_heads, d);
        let values = by_heads(&host_f32(v)?, len, kv_heads, d);
        self.queries(&mut q, len, d, offset);
        self.keys(&mut keys, len, d, offset);
        Ok(Some((q, keys, values)))
    }

    /// Query rows `[heads, len, d]` (bf16 values) normed and rotated in
    /// place, for positions `offset..`.
    pub fn queries(&self, q: &mut [f32], len: usize, d: usize, offset: i32) {
        host::norm_rows(q, &self.q_norm, self.eps, true);
        self.rotate(q, len, d, offset);
    }

    /// [`Self::queries`] for key rows, by the key norm.
    pub fn keys(&self, k: &mut [f32], len: usize, d: usize, offset: i32) {
        host::norm_rows(k, &self.k_norm, self.eps, true);
        self.rotate(k, len, d, offset);
    }

    /// RoPE in place over rows `[heads, len, d]` at positions `offset..`.
    fn rotate(&self, rows: &mut [f32], len: usize, d: usize, offset: i32) {
        rotate_rows(rows, (len, d), offset, self.scale, &self.inv_freqs);
    }
}

host::vectorized! {
    /// [`HostAttention::rotate`]'s body, compiled with FMA where the CPU has
    /// it: the sine's and cosine's fused multiply-adds are one instruction
    /// each instead of a library call (a tenth of a draft's time went to
    /// them), with the same correctly rounded results.
    fn rotate_rows(rows: &mut [f32], shape: (usize, usize), offset: i32, scale: f32, inv_freqs: &[f32]) {
        let (len, d) = shape;
        let half = inv_freqs.len();
        // Plain loops, not iterator closures: a closure is its own function,
        // compiled without the FMA feature.
        let mut angles = Vec::with_capacity(len * half);
        for l in 0..len {
            let position = (l as f32 + offset as f32) * scale;
            for &f in inv_freqs {
                let (s, c) = mlx_sin_cos(position * f);
                angles.push((round_bf16(s), round_bf16(c)));
            }
        }
        for (r, row) in rows.chunks_exact_mut(d).enumerate() {
            let l = r % len;
            for i in 0..half {
                let (s, c) = angles[l * half + i];
                let (x1, x2) = (row[i], row[half + i]);
                row[i] = round_bf16(round_bf16(x1 * c) - round_bf16(x2 * s));
                row[half + i] = round_bf16(round_bf16(x1 * s) + round_bf16(x2 * c));
            }
        }
    }
}

/// `[L, heads, d]` rows to `[heads, L, d]`.
pub fn by_heads(x: &[f32], len: usize, heads: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for l in 0..len {
        for h in 0..heads {
            out[(h * len + l) * d..][..d].copy_from_slice(&x[(l * heads + h) * d..][..d]);
        }
    }
    out
}

/// MLX's CPU sin and cos of an f32 (its Cephes polynomial with fused
/// multiply-adds; libm's past 2^23, where its reduction fails).
#[allow(clippy::excessive_precision)]
#[inline(always)]
pub fn mlx_sin_cos(x: f32) -> (f32, f32) {
    if x.abs() > 8_388_608.0 {
        return (x.sin(), x.cos());
    }
    let negative = x < 0.0;
    let x = x.abs();
    let y = x * 1.27323954473516f32;
    let mut emm2 = y as u32;
    emm2 = emm2.wrapping_add(1) & !1;
    let y = emm2 as f32;
    let poly = (emm2 & 2) != 0;
    let x = y.mul_add(-0.78515625, x);
    let x = y.mul_add(-2.4187564849853515625e-4, x);
    let x = y.mul_add(-3.77489497744594108e-8, x);
    let sign_sin = negative ^ ((emm2 & 4) != 0);
    let sign_cos = (emm2.wrapping_sub(2) & 4) != 0;
    let z = x * x;
    let y1 = z.mul_add(2.443315711809948e-5, -1.388731625493765e-3);
    let y2 = z.mul_add(-1.9515295891e-4, 8.3321608736e-3);
    let y1 = y1.mul_add(z, 4.166664568298827e-2);
    let y2 = y2.mul_add(z, -1.6666654611e-1);
    let y1 = y1 * z;
    let y2 = y2 * z;
    let y1 = y1 * z;
    let y2 = x.mul_add(y2, x);
    let y1 = z.mul_add(-0.5, y1);
    let y1 = y1 + 1.0;
    let ys = if poly { y1 } else { y2 };
    let yc = if poly { y2 } else { y1 };
    (
        if sign_sin { -ys } else { ys },
        if sign_cos { yc } else { -yc },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::test_values::bf16_values;

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// MLX's sin and cos, and the whole head (norms, RoPE at an offset,
    /// partial rotation), bit for bit.
    #[test]
    fn the_head_is_mlx_s_ops() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let angles: Vec<f32> = (0..20_000).map(|i| (i as f32 - 9_000.0) * 0.0173).collect();
        let a = Array::from_slice(&angles, &[angles.len() as i32]);
        let (s, c): (Vec<f32>, Vec<f32>) = angles.iter().map(|&x| mlx_sin_cos(x)).unzip();
        assert_eq!(
            bits(&s),
            bits(&host_f32(&mlx_rs::ops::sin(&a).unwrap()).unwrap())
        );
        assert_eq!(
            bits(&c),
            bits(&host_f32(&mlx_rs::ops::cos(&a).unwrap()).unwrap())
        );

        let (heads, kv, d, len, offset) = (3usize, 1usize, 64usize, 5usize, 37i32);
        let rope = Rope {
            dims: 16,
            theta: 10_000.0,
            scaling: Scaling::Linear(1.0),
        };
        let to16 = |v: Vec<f32>, shape: &[i32]| {
            Array::from_slice(&v, shape)
                .as_dtype(Dtype::Bfloat16)
                .unwrap()
        };
        let qn = to16(bf16_values(d, 0.3, 1.2), &[d as i32]);
        let kn = to16(bf16_values(d, 1.3, 0.8), &[d as i32]);
        let head = HostAttention::new(&qn, &kn, rope, 1e-6).unwrap().unwrap();
        let q_gate = to16(
            bf16_values(len * heads * 2 * d, 2.0, 3.0),
            &[1, len as i32, (heads * 2 * d) as i32],
        );
        let k = to16(
            bf16_values(len * kv * d, 4.0, 3.0),
            &[1, len as i32, (kv * d) as i32],
        );
        let v = to16(
            bf16_values(len * kv * d, 6.0, 3.0),
            &[1, len as i32, (kv * d) as i32],
        );
        let (q_ours, k_ours, v_ours) = head
            .project([&q_gate, &k, &v], heads, d, offset)
            .unwrap()
            .unwrap();
        let array = |rows: &[f32], h: usize| {
            let shape = [1, h as i32, len as i32, d as i32];
            host::from_f32(rows, &shape, Dtype::Bfloat16).unwrap()
        };
        let (q_ours, k_ours, v_ours) = (
            array(&q_ours, heads),
            array(&k_ours, kv),
            array(&v_ours, kv),
        );
        let both = q_gate.reshape(&[1, len as i32, heads as i32, -1]).unwrap();
        let q = mlx_rs::ops::split_equal(&both, 2, -1).unwrap()[0].clone();
        let norm = |x: &Array, w: &Array| {
            mlx_rs::fast::rms_norm(x, Some(w), 1e-6)
                .unwrap()
                .transpose_axes(&[0, 2, 1, 3])
                .unwrap()
        };
        let rot = |x: &Array| crate::nn::rope::apply(x, 16, 10_000.0, Scaling::Linear(1.0), offset);
        let q = rot(&norm(&q, &qn)).unwrap();
        let k4 = k.reshape(&[1, len as i32, kv as i32, -1]).unwrap();
        let keys = rot(&norm(&k4, &kn)).unwrap();
        let values = v
            .reshape(&[1, len as i32, kv as i32, -1])
            .unwrap()
            .transpose_axes(&[0, 2, 1, 3])
            .unwrap();
        let h = |a: &Array| bits(&host_f32(a).unwrap());
        assert_eq!(h(&q_ours), h(&q), "queries");
        assert_eq!(h(&k_ours), h(&keys), "keys");
        assert_eq!(h(&v_ours), h(&values), "values");
    }
}
