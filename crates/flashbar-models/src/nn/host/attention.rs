//! Causal grouped-head attention per query, in f32 or as MLX's CPU
//! fallback computes it for bf16 (with its rounding and its exp).

use super::*;

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

/// [`mlx_exp`]'s constants as MLX writes them (rounded to f32 alike), not
/// `LOG2_E`: log2 e, then the polynomial's coefficients from the highest
/// power's down to 1 (shared with the vector exp, `sigmoid_x86.rs`).
#[allow(clippy::approx_constant, clippy::excessive_precision)]
pub(super) const EXP_LOG2_E: f32 = 1.442695;
#[allow(clippy::excessive_precision)]
pub(super) const EXP_POLYNOMIAL: [f32; 7] = [
    1.535336188319500e-4,
    1.339887440266574e-3,
    9.618437357674640e-3,
    5.550332471162809e-2,
    2.402264791363012e-1,
    6.931472028550421e-1,
    1.0,
];

/// MLX's CPU `exp` (its `simd::exp`, also what its softmax runs): 2^(x
/// log2 e) as a power of two times a degree-6 polynomial of the fraction,
/// with fused multiply-adds; 0 below -88 and infinity above 88. Not libm's
/// exp: the two differ in the last bits.
#[inline(always)]
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
    let y = x * EXP_LOG2_E;
    // MLX adds the 0.5 as a double: in f32 the sum could round up to the
    // next integer.
    let ipart = (y as f64 + 0.5).floor() as f32;
    let fpart = y - ipart;
    let mut p = EXP_POLYNOMIAL[0];
    for c in &EXP_POLYNOMIAL[1..] {
        p = p.mul_add(fpart, *c);
    }
    let two_to_i = f32::from_bits(((ipart as i32).wrapping_add(127) as u32).wrapping_shl(23));
    two_to_i * p
}

/// Keys and values `[kv_heads, stride, d]`, of which each head's first
/// `total` positions are read (`total` from the kernel's dims): a cache
/// with room to grow ([`HostKv`]), or packed rows (`stride == total`).
/// f32 or bf16 (which widens exactly: the same sums either way).
pub struct KvRows<'a, K> {
    pub keys: &'a [K],
    pub values: &'a [K],
    pub stride: usize,
}

impl<K> Clone for KvRows<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for KvRows<'_, K> {}

impl<'a, K> KvRows<'a, K> {
    /// Rows `[kv_heads, total, d]` with no room between the heads.
    pub fn packed(keys: &'a [K], values: &'a [K], total: usize) -> Self {
        KvRows {
            keys,
            values,
            stride: total,
        }
    }

    /// Head `kv`'s keys and values from its first position on.
    fn head(&self, kv: usize, d: usize) -> (&'a [K], &'a [K]) {
        let at = kv * self.stride * d;
        (&self.keys[at..], &self.values[at..])
    }
}

/// Causal attention for bf16 inputs as MLX's CPU
/// `scaled_dot_product_attention` computes it (docs/cpu.md, "Parity with
/// mlx-lm"), per query: q times the scale (both bf16) rounded to bf16; each
/// score an f32 [`sequential_dot`] rounded to bf16; a precise softmax (f32
/// max, [`mlx_exp`], an f32 sum in position order, one reciprocal, each
/// weight rounded to bf16); each output an f32 sum of weight times value in
/// position order, rounded to bf16. Masked positions weigh exactly 0 there,
/// so leaving them out changes no bit. Shapes as in [`attention`].
pub fn attention_bf16<K: HostWeight>(
    q: &[f32],
    kv: KvRows<'_, K>,
    (heads, kv_heads, len, total, d): (usize, usize, usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let dims = (heads, kv_heads, len, total, d);
    let scale = round_bf16(scale);
    each_query(out, d, heads * len * total * d, |index, row| {
        query_bf16(q, kv, dims, scale, index, row)
    });
}

vectorized! {
    /// Query `index` of [`attention_bf16`] into `out` (`d` wide); `scale`
    /// already rounded to bf16.
    fn query_bf16<K: HostWeight>(
        q: &[f32],
        kv: KvRows<'_, K>,
        dims: (usize, usize, usize, usize, usize),
        scale: f32,
        index: usize,
        out: &mut [f32],
    ) {
        let (heads, kv_heads, len, total, d) = dims;
        let (h, l) = (index / len, index % len);
        let query: Vec<f32> = q[index * d..(index + 1) * d]
            .iter()
            .map(|x| round_bf16(x * scale))
            .collect();
        let visible = total - len + l + 1;
        let (keys, values) = kv.head(h / (heads / kv_heads), d);
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
                *o += weight * value.widen();
            }
        }
        for o in out.iter_mut() {
            *o = round_bf16(*o);
        }
    }
}

/// Causal attention of `q` `[heads, len, d]` over `kv`'s first `total`
/// positions (the last `len` of them are the queries'), grouped heads
/// (head h reads kv head h / (heads / kv_heads)).
/// Per query: scores `scale * q.k` by [`dot`], softmax with the max
/// subtracted, and the weighted sum of values in position order: what one
/// query computes does not depend on how many came with it.
pub fn attention<K: HostWeight>(
    q: &[f32],
    kv: KvRows<'_, K>,
    (heads, kv_heads, len, total, d): (usize, usize, usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let dims = (heads, kv_heads, len, total, d);
    each_query(out, d, heads * len * total * d, |index, row| {
        query_f32(q, kv, dims, scale, (index, true), row)
    });
}

/// [`attention`] without a mask: every query sees all `total` keys (the
/// DFlash drafter's block, which attends to its context and to the whole
/// block, docs/dflash.md).
pub fn full_attention<K: HostWeight>(
    q: &[f32],
    kv: KvRows<'_, K>,
    (heads, kv_heads, len, total, d): (usize, usize, usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let dims = (heads, kv_heads, len, total, d);
    each_query(out, d, heads * len * total * d, |index, row| {
        query_f32(q, kv, dims, scale, (index, false), row)
    });
}

vectorized! {
    /// Query `at.0` of [`attention`] (or of [`full_attention`]: `at.1`,
    /// causal, false) into `out` (`d` wide). Its scores four keys at a
    /// time ([`dot4`]: each its own [`dot`]'s bits, the products
    /// commuting), so a query's keys share the loop.
    fn query_f32<K: HostWeight>(
        q: &[f32],
        kv: KvRows<'_, K>,
        dims: (usize, usize, usize, usize, usize),
        scale: f32,
        at: (usize, bool),
        out: &mut [f32],
    ) {
        let ((heads, kv_heads, len, total, d), (index, causal)) = (dims, at);
        let (h, l) = (index / len, index % len);
        let query = &q[index * d..(index + 1) * d];
        let visible = if causal { total - len + l + 1 } else { total };
        let (keys, values) = kv.head(h / (heads / kv_heads), d);
        let key = |s: usize| &keys[s * d..(s + 1) * d];
        let mut scores = vec![0f32; visible];
        let mut s = 0;
        while s + 4 <= visible {
            let four = dot4([key(s), key(s + 1), key(s + 2), key(s + 3)], query);
            for (score, dot) in scores[s..s + 4].iter_mut().zip(four) {
                *score = dot * scale;
            }
            s += 4;
        }
        for (score, s) in scores[s..].iter_mut().zip(s..) {
            *score = dot(query, key(s)) * scale;
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // MLX's exp, not libm's: the same bits on every machine (glibc
        // picks its expf by the CPU's features), and a loop of its own
        // that runs on vector registers.
        for score in &mut scores {
            *score = mlx_exp(*score - max);
        }
        let mut sum = 0f32;
        for score in &scores {
            sum += score;
        }
        // Each output summed over the positions in order; 64 outputs at a
        // time (then 16) held in registers through all the positions, so
        // eight chains of additions run side by side instead of two.
        let mut c = 0;
        while c + 64 <= d {
            weighted_sum::<64, K>(&scores, values, d, c, &mut out[c..c + 64]);
            c += 64;
        }
        while c + 16 <= d {
            weighted_sum::<16, K>(&scores, values, d, c, &mut out[c..c + 16]);
            c += 16;
        }
        out[c..].fill(0.0);
        for (s, weight) in scores.iter().enumerate() {
            for (o, value) in out[c..].iter_mut().zip(&values[s * d + c..(s + 1) * d]) {
                *o += weight * value.widen();
            }
        }
        for o in out.iter_mut() {
            *o /= sum;
        }
    }
}

/// `out[l] = sum_s weights[s] * values[s * d + c + l]` for `W` outputs,
/// summed in position order from zero (each output as one loop over the
/// positions would sum it).
#[inline(always)]
fn weighted_sum<const W: usize, K: Weight>(
    weights: &[f32],
    values: &[K],
    d: usize,
    c: usize,
    out: &mut [f32],
) {
    let mut acc = [0f32; W];
    for (s, weight) in weights.iter().enumerate() {
        let value: &[K; W] = values[s * d + c..s * d + c + W]
            .try_into()
            .expect("W values");
        for l in 0..W {
            acc[l] += weight * value[l].widen();
        }
    }
    out.copy_from_slice(&acc);
}

/// `one(index, row)` for each `d`-wide output row: on this thread when the
/// work (multiply-adds) is small, spread over threads otherwise; a row
/// computes the same either way.
fn each_query(out: &mut [f32], d: usize, work: usize, one: impl Fn(usize, &mut [f32]) + Sync) {
    if work < PARALLEL_FROM {
        for (index, row) in out.chunks_exact_mut(d).enumerate() {
            one(index, row);
        }
    } else {
        let rows: Vec<_> = out.chunks_exact_mut(d).enumerate().collect();
        pool::each(rows, |(index, row)| one(index, row));
    }
}
