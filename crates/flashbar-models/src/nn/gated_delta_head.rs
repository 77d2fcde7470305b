//! The middle of a gated-delta layer on the CPU's host path, between its
//! input projections and the recurrence: the causal depthwise conv and its
//! silu, q/k's per-head L2 norm and scale, beta and the decay g, in Rust
//! on the arrays the projections return, bit for bit the MLX ops of
//! `gated_delta.rs` (docs/cpu.md, "Host ops"). With the recurrence and the
//! output gate on the host too, a decode step's gated-delta layer hands
//! nothing to MLX's worker thread.
//!
//! Taken only for bf16 activations and bf16 conv weights, whose products
//! are exact in f32, so the conv's sum (MLX runs a BLAS gemm per channel)
//! is the same in any association of its K exact terms only up to
//! rounding: it is summed here in tap order, as OpenBLAS's kernel does,
//! and a unit test holds it against MLX's conv.

use crate::error::Result;
use crate::nn::gated_delta::{GdnState, GdnTape};
use crate::nn::gated_delta_host::{self, Dims, Inputs, Layout};
use crate::nn::host::{self, host_f32, round_bf16, HostVector};
use mlx_rs::{Array, Dtype};

/// The layer's fixed parts, as the host computes with them.
pub struct HostHead {
    /// `[K, C]`, the conv's taps by rows ([`taps_by_rows`]).
    conv_taps: Vec<f32>,
    /// `exp(A_log)` per value head (f32, as MLX computes it each step).
    decay: Vec<f32>,
    dt_bias: Vec<f32>,
    /// Whether `a + dt_bias` and its softplus are bf16 (else f32).
    dt_bf16: bool,
    kernel: usize,
}

/// What the head gives the recurrence (and the tape): row-major f32 values
/// of bf16 ones, except `g` (f32).
pub struct Head {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
    /// The conv's input rows (previous state, then the new rows), `[K-1+T, C]`.
    pub conv_input: Vec<f32>,
}

impl HostHead {
    /// None when the layer's types are not ones this path computes as MLX
    /// does (MLX's ops run then).
    pub fn new(conv_weight: &Array, a_log: &Array, dt_bias: &Array) -> Result<Option<Self>> {
        let dt_bf16 = match dt_bias.dtype() {
            Dtype::Bfloat16 => true,
            Dtype::Float32 => false,
            _ => return Ok(None),
        };
        if conv_weight.dtype() != Dtype::Bfloat16 || !host::takes(a_log.dtype()) {
            return Ok(None);
        }
        Ok(Some(HostHead {
            conv_taps: taps_by_rows(&host_f32(conv_weight)?, conv_weight.shape()[1] as usize),
            decay: host_f32(a_log)?.iter().map(|&a| host::mlx_exp(a)).collect(),
            dt_bias: host_f32(dt_bias)?,
            dt_bf16,
            kernel: conv_weight.shape()[1] as usize,
        }))
    }

    /// The head for `t` new rows: `qkv` `[T, C]`, `b`, `a` `[T, Hv]` (bf16
    /// values), after `state` `[K-1, C]`; `d` gives the split of C.
    pub fn run(&self, qkv: &[f32], b: &[f32], a: &[f32], state: &[f32], d: Dims) -> Head {
        let c = self.conv_taps.len() / self.kernel;
        let mut conv_input = Vec::with_capacity(state.len() + qkv.len());
        conv_input.extend_from_slice(state);
        conv_input.extend_from_slice(qkv);
        let mixed = conv_silu(&conv_input, &self.conv_taps, c);
        let key_dim = d.hk * d.dk;
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for row in mixed.chunks_exact(c) {
            q.extend_from_slice(&row[..key_dim]);
            k.extend_from_slice(&row[key_dim..2 * key_dim]);
            v.extend_from_slice(&row[2 * key_dim..]);
        }
        let inv_scale = (d.dk as f32).powf(-0.5);
        let eps = crate::nn::gated_delta::QK_EPS * inv_scale * inv_scale;
        l2_scale(&mut q, d.dk, eps, round_bf16(inv_scale * inv_scale));
        l2_scale(&mut k, d.dk, eps, round_bf16(inv_scale));
        let beta = b.iter().map(|&x| host::sigmoid(x, true)).collect();
        let g = a
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let h = i % d.hv;
                let store = |v: f32| if self.dt_bf16 { round_bf16(v) } else { v };
                let sp = softplus(store(x + self.dt_bias[h]), self.dt_bf16);
                host::mlx_exp(-(self.decay[h] * sp))
            })
            .collect();
        Head {
            q,
            k,
            v,
            g,
            beta,
            conv_input,
        }
    }
}

/// The conv's taps by rows, `[K, C]`, from its weight `[C, K]`: made once
/// per layer, so that [`conv_silu`]'s adds run across channels.
fn taps_by_rows(w: &[f32], kernel: usize) -> Vec<f32> {
    let c = w.len() / kernel;
    let mut taps = vec![0f32; kernel * c];
    for (ch, row) in w.chunks_exact(kernel).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            taps[j * c + ch] = v;
        }
    }
    taps
}

/// The causal depthwise conv over `input` `[K-1+T, C]` by `taps` `[K, C]`
/// ([`taps_by_rows`]), each output the taps' products summed in order from
/// zero and rounded to bf16, then mlx-rs's silu in bf16: `[T, C]`. A
/// verify's rows (from [`host::ZIP_PARALLEL_FROM`] outputs) are split over
/// the host's threads; each row is computed alike whichever thread runs it.
pub fn conv_silu(input: &[f32], taps: &[f32], c: usize) -> Vec<f32> {
    let kernel = taps.len() / c;
    let t = input.len() / c + 1 - kernel;
    let mut out = vec![0f32; t * c];
    let threads = host::pool::threads();
    if t * c < host::ZIP_PARALLEL_FROM || threads == 1 || t < 2 {
        conv_silu_rows(input, taps, c, &mut out);
        return out;
    }
    let rows = t.div_ceil(threads);
    let parts: Vec<_> = out.chunks_mut(rows * c).enumerate().collect();
    host::pool::each(parts, |(part, out)| {
        conv_silu_rows(&input[part * rows * c..], taps, c, out)
    });
    out
}

host::vectorized! {
    /// [`conv_silu`] for the rows of `out`, whose first output reads
    /// `input`'s first row. The adds run across channels in vector
    /// registers, each channel's sum in the same order.
    fn conv_silu_rows(input: &[f32], taps: &[f32], c: usize, out: &mut [f32]) {
        for (i, row) in out.chunks_exact_mut(c).enumerate() {
            for (j, tap) in taps.chunks_exact(c).enumerate() {
                let inputs = &input[(i + j) * c..(i + j + 1) * c];
                for ((o, &x), &wv) in row.iter_mut().zip(inputs).zip(tap) {
                    *o += x * wv;
                }
            }
            for o in row.iter_mut() {
                *o = round_bf16(*o);
            }
        }
        let inputs = out.to_vec();
        host::zip_with_sigmoid(out, &inputs, true, |_, x, s| round_bf16(x * s));
    }
}

/// mlx-lm's q/k norm in bf16: per `dk`-wide row, MLX's RMS norm without a
/// weight (eps on the mean square), rounded, times `scale`, rounded.
fn l2_scale(values: &mut [f32], dk: usize, eps: f32, scale: f32) {
    let ones = HostVector {
        values: vec![1.0; dk],
        dtype: Dtype::Bfloat16,
    };
    host::norm_rows(values, &ones, eps, true);
    for v in values.iter_mut() {
        *v = round_bf16(*v * scale);
    }
}

/// mlx-rs's softplus, MLX's `logaddexp(x, 0)` in bf16 (every op rounded)
/// or f32: `max + log1p(exp(min - max))`, `max` itself at infinities.
fn softplus(x: f32, bf16: bool) -> f32 {
    let store = |v: f32| if bf16 { round_bf16(v) } else { v };
    if x.is_nan() {
        return x;
    }
    let (max, min) = (x.max(0.0), x.min(0.0));
    if min == f32::NEG_INFINITY || max == f32::INFINITY {
        return max;
    }
    let e = store(host::mlx_exp(store(min - max)));
    store(max + store(e.ln_1p()))
}

impl HostHead {
    /// The layer from its projections (`qkv`, `b`, `a`: `[1, T, ..]`, bf16)
    /// to the recurrence's output y (`[1, T, Hv, Dv]`, f32), advancing
    /// `state`; the tape when `record`.
    pub fn forward(
        &self,
        qkv: &Array,
        b: &Array,
        a: &Array,
        state: &mut GdnState,
        d: Dims,
        record: bool,
    ) -> Result<(Array, Option<GdnTape>)> {
        let c = self.conv_taps.len() / self.kernel;
        let keep = self.kernel - 1;
        let (qkv, b, a) = (host_f32(qkv)?, host_f32(b)?, host_f32(a)?);
        let mut held = match state.host.take() {
            Some(held) => held,
            None => HostState::of(state.conv.as_ref(), state.ssm.as_ref(), keep * c, d)?,
        };
        state.conv = None;
        state.ssm = None;
        let head = self.run(&qkv, &b, &a, &held.conv, d);
        let total = head.conv_input.len() / c;
        held.conv
            .copy_from_slice(&head.conv_input[(total - keep) * c..]);
        let ssm_before = record.then(|| held.ssm.clone());
        let inputs = Inputs {
            q: &head.q,
            k: &head.k,
            v: &head.v,
            g: &head.g,
            beta: &head.beta,
        };
        let (y, delta) =
            gated_delta_host::record_in(inputs, &mut held.ssm, Layout::Columns, d, record);
        state.host = Some(held);
        let tape = match (delta, ssm_before) {
            (Some(delta), Some(ssm_before)) => Some(GdnTape::host(HostTape {
                conv_input: head.conv_input,
                ssm_before,
                k: head.k,
                g: head.g,
                delta,
                d,
            })),
            _ => None,
        };
        let per_value = [1, d.steps as i32, d.hv as i32, d.dv as i32];
        Ok((Array::from_slice(&y, &per_value), tape))
    }
}

/// A gated-delta layer's cache on the host path: what `GdnState`'s arrays
/// hold, kept in host memory between steps so that no step copies it out
/// of an array and back (docs/cpu.md, "Host caches").
#[derive(Clone)]
pub struct HostState {
    /// The last K-1 conv inputs `[K-1, C]` (bf16 values).
    conv: Vec<f32>,
    /// The recurrent state by columns, `[Hv, Dk, Dv]` (f32), the layout the
    /// recurrence works in (`gated_delta_host::Layout`).
    ssm: Vec<f32>,
    d: Dims,
}

impl HostState {
    /// From the arrays a state held (zeros where none yet): `conv` `[1,
    /// K-1, C]` of `conv_len` values, `ssm` `[1, Hv, Dv, Dk]`.
    pub fn of(conv: Option<&Array>, ssm: Option<&Array>, conv_len: usize, d: Dims) -> Result<Self> {
        Ok(HostState {
            conv: match conv {
                Some(rows) => host_f32(rows)?,
                None => vec![0f32; conv_len],
            },
            ssm: match ssm {
                Some(s) => gated_delta_host::relaid(&host_f32(s)?, d, Layout::Columns),
                None => vec![0f32; d.hv * d.dv * d.dk],
            },
            d,
        })
    }

    /// The conv rows `[1, K-1, C]` (bf16) and the state `[1, Hv, Dv, Dk]`
    /// (f32) as MLX arrays, as the MLX path holds them.
    pub fn arrays(&self) -> Result<(Array, Array)> {
        let c = self.d.conv_channels();
        let rows = (self.conv.len() / c) as i32;
        let conv = host::from_f32(&self.conv, &[1, rows, c as i32], Dtype::Bfloat16)?;
        let d = self.d;
        let rows = gated_delta_host::relaid(&self.ssm, d, Layout::Rows);
        let ssm = Array::from_slice(&rows, &[1, d.hv as i32, d.dv as i32, d.dk as i32]);
        Ok((conv, ssm))
    }
}

/// A verify's tape on the host path (the values `GdnTape`'s arrays hold
/// on the other paths): the conv's input rows `[K-1+T, C]`, the state
/// before (by columns, as `HostState` holds it), normalized keys `[T, Hk, Dk]`, decays `[T, Hv]` and updates
/// `[T, Hv, Dv]`.
#[derive(Clone)]
pub struct HostTape {
    conv_input: Vec<f32>,
    ssm_before: Vec<f32>,
    k: Vec<f32>,
    g: Vec<f32>,
    delta: Vec<f32>,
    d: Dims,
}

impl HostTape {
    /// The state after the first `accepted` of the recorded tokens, as
    /// [`gated_delta_host::replay_arrays`] gives it from the same values
    /// (by columns: [`gated_delta_host::replay_columns`]).
    pub fn rollback(&self, accepted: usize) -> HostState {
        let c = self.d.conv_channels();
        let keep = self.conv_input.len() / c - self.d.steps;
        let mut ssm = self.ssm_before.clone();
        gated_delta_host::replay_columns(&mut ssm, &self.k, &self.g, &self.delta, self.d, accepted);
        HostState {
            conv: self.conv_input[accepted * c..(accepted + keep) * c].to_vec(),
            ssm,
            d: self.d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::test_values::bf16_values;
    use mlx_rs::ops::conv1d;

    fn bits(a: &Array) -> Vec<u32> {
        host_f32(a).unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The conv and silu, the q/k norm, beta and g are MLX's ops bit for bit.
    #[test]
    fn the_head_is_mlx_s_ops() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let (k, c) = (4usize, 256usize);
        // A decode step's row, a few rows, a verify's 16 (split over the
        // host's threads from 4,096 outputs).
        for (t, scale) in [(1usize, 1.0f32), (3, 8.0), (16, 0.1), (16, 1.0), (16, 8.0)] {
            let rows = bf16_values((t + k - 1) * c, 0.4, scale);
            let w = bf16_values(c * k, 9.1, 1.0);
            let to16 = |v: &[f32], shape: &[i32]| {
                Array::from_slice(v, shape)
                    .as_dtype(Dtype::Bfloat16)
                    .unwrap()
            };
            let input = to16(&rows, &[1, (t + k - 1) as i32, c as i32]);
            let weight = to16(&w, &[c as i32, k as i32, 1]);
            let conv = conv1d(&input, &weight, 1, 0, 1, c as i32).unwrap();
            let expected = mlx_rs::nn::silu(conv).unwrap();
            let ours = conv_silu(&rows, &taps_by_rows(&w, k), c);
            let ours: Vec<u32> = ours.iter().map(|v| v.to_bits()).collect();
            assert_eq!(ours, bits(&expected), "conv x{scale}");

            let (hk, dk) = (2i32, 48i32);
            let q = to16(&bf16_values(t * 96, 1.7, scale), &[1, t as i32, hk, dk]);
            let (nq, nk) = crate::nn::gated_delta::normalize_qk(&q, &q, dk).unwrap();
            let mut ours = host_f32(&q).unwrap();
            let inv = (dk as f32).powf(-0.5);
            let eps = crate::nn::gated_delta::QK_EPS * inv * inv;
            let mut ours_k = ours.clone();
            l2_scale(&mut ours, dk as usize, eps, round_bf16(inv * inv));
            l2_scale(&mut ours_k, dk as usize, eps, round_bf16(inv));
            let ours: Vec<u32> = ours.iter().map(|v| v.to_bits()).collect();
            let ours_k: Vec<u32> = ours_k.iter().map(|v| v.to_bits()).collect();
            assert_eq!(ours, bits(&nq), "q norm x{scale}");
            assert_eq!(ours_k, bits(&nk), "k norm x{scale}");

            let hv = 8usize;
            let a = to16(
                &bf16_values(t * hv, 3.3, scale * 4.0),
                &[1, t as i32, hv as i32],
            );
            for dt_type in [Dtype::Bfloat16, Dtype::Float32] {
                let dt = Array::from_slice(&bf16_values(hv, 0.9, 2.0), &[hv as i32])
                    .as_dtype(dt_type)
                    .unwrap();
                let a_log = Array::from_slice(&bf16_values(hv, 5.0, 1.5), &[hv as i32]);
                let decay = a_log.as_dtype(Dtype::Float32).unwrap().exp().unwrap();
                let g = decay
                    .multiply(mlx_rs::nn::softplus(a.add(&dt).unwrap()).unwrap())
                    .unwrap()
                    .negative()
                    .unwrap()
                    .exp()
                    .unwrap();
                let w16 = to16(&w, &[c as i32, k as i32, 1]);
                let head = HostHead::new(&w16, &a_log, &dt).unwrap().unwrap();
                let d = Dims {
                    steps: t,
                    hk: 1,
                    hv,
                    dk: 32,
                    dv: 32,
                };
                let zeros = vec![0f32; (t + k - 1) * c];
                let ah = host_f32(&a).unwrap();
                let out = head.run(&zeros[..t * c], &ah, &ah, &zeros[..(k - 1) * c], d);
                let ours: Vec<u32> = out.g.iter().map(|v| v.to_bits()).collect();
                assert_eq!(ours, bits(&g), "g x{scale} {dt_type:?}");
                let beta = mlx_rs::ops::sigmoid(&a).unwrap();
                let ours: Vec<u32> = out.beta.iter().map(|v| v.to_bits()).collect();
                assert_eq!(ours, bits(&beta), "beta x{scale}");
            }
        }
    }
}
