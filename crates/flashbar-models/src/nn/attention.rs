//! Gated full attention: q/k RMS norms, partial RoPE, grouped KV heads, and
//! an output gate (`q_proj` yields queries and gate side by side per head).

use crate::config::{Rope, Scaling, TextConfig};
use crate::error::Result;
use crate::nn::attention_host::HostAttention;
use crate::nn::host::HostKv;
use crate::nn::linear::{row_kernels, Fused, Linear, Onto, Weights};
use crate::nn::{fused, host};
use flashbar_mlx::row_invariant;
use mlx_rs::fast::{rms_norm, scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::{IndexOp, TryIndexUpdateOp, UpdateMode};
use mlx_rs::ops::{concatenate, split_equal, zeros_dtype};
use mlx_rs::Array;

/// Keys and values of the tokens seen so far: MLX arrays `[B, kv_heads,
/// T, head_dim]`, or on the CPU's host path a [`HostKv`] read in place
/// (docs/cpu.md, "Host caches"). One of the two holds the cache; a forward
/// that takes the other path moves it over first.
#[derive(Clone, Default)]
pub struct KvCache {
    pub(crate) keys: Option<Array>,
    pub(crate) values: Option<Array>,
    pub(crate) host: Option<HostKv>,
    /// Where `keys` and `values` are buffers with room (`[B, kv_heads,
    /// capacity, head_dim]`, [`KvCache::append_in_place`]): how many of
    /// their positions are the cache. None: they are exactly the cache.
    filled: Option<i32>,
}

/// Positions a buffer with room grows by (docs/gpu.md, "A KV cache with room").
const ROOM_STEP: i32 = 256;

/// The target's KV cache on CUDA's row kernels is kept in buffers with room,
/// written in place, instead of joined anew each forward; `0` joins it, for
/// benchmarks (docs/gpu.md, "A KV cache with room").
pub const KV_IN_PLACE_ENV: &str = "FLASHBAR_KV_IN_PLACE";

fn kv_in_place() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(KV_IN_PLACE_ENV).as_deref() != Ok("0"))
}

/// The attention's merge applies the output gate (`out * sigmoid(gate)`,
/// MLX's rounding) in place of three ops a layer, on CUDA's row kernels;
/// `0` leaves it to the ops, for benchmarks (docs/gpu.md, "The attention's
/// gate in its merge").
pub const GATE_IN_MERGE_ENV: &str = "FLASHBAR_ATTN_GATE_IN_MERGE";

fn gate_in_merge() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(GATE_IN_MERGE_ENV).as_deref() != Ok("0"))
}

/// The layer's head (the q/k norms, RoPE, the heads' layout) runs as one
/// kernel on CUDA's row kernels, in place of six kernels and some ten graph
/// nodes; `0` runs the ops, for benchmarks (docs/gpu.md, "The attention's
/// head in one kernel").
pub const HEAD_KERNEL_ENV: &str = "FLASHBAR_ATTN_HEAD_KERNEL";

fn head_kernel() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(HEAD_KERNEL_ENV).as_deref() != Ok("0"))
}

impl KvCache {
    /// Tokens cached so far (the RoPE offset of the next one).
    pub fn len(&self) -> i32 {
        match (&self.host, self.filled) {
            (Some(host), _) => host.len() as i32,
            (None, Some(filled)) => filled,
            (None, None) => self.keys.as_ref().map_or(0, |k| k.shape()[2]),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the last `count` positions (a rejected part of a verified block).
    pub fn trim(&mut self, count: i32) {
        let keep = (self.len() - count).max(0);
        if let Some(host) = &mut self.host {
            host.truncate(keep as usize);
        }
        if self.filled.is_some() {
            // The positions past `keep` are written over by the next append.
            self.filled = Some(keep);
            return;
        }
        let cut = |a: &Array| a.index((.., .., ..keep, ..));
        self.keys = self.keys.as_ref().map(cut);
        self.values = self.values.as_ref().map(cut);
    }

    /// The MLX arrays it holds (none on the host path): what evaluating
    /// the cache must evaluate.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    /// Keys and values `[1, kv_heads, T, head_dim]` whichever path holds
    /// them (None when empty).
    pub fn keys_values(&self) -> Result<Option<(Array, Array)>> {
        Ok(match (&self.host, &self.keys, &self.values) {
            (Some(host), ..) => Some(host.arrays()?),
            (None, Some(k), Some(v)) => match self.filled {
                Some(n) => Some((
                    k.index((.., .., ..n, ..)).contiguous()?,
                    v.index((.., .., ..n, ..)).contiguous()?,
                )),
                None => Some((k.clone(), v.clone())),
            },
            _ => None,
        })
    }

    /// The arrays exactly the cache again, where they were buffers with room.
    fn exact(&mut self) {
        if let (Some(n), Some(k), Some(v)) = (self.filled.take(), &self.keys, &self.values) {
            self.keys = Some(k.index((.., .., ..n, ..)));
            self.values = Some(v.index((.., .., ..n, ..)));
        }
    }

    /// The host cache, made from the arrays if they held it.
    pub(crate) fn host(&mut self, kv_heads: usize, d: usize) -> Result<&mut HostKv> {
        self.exact();
        if self.host.is_none() {
            let kv = match (self.keys.take(), self.values.take()) {
                (Some(k), Some(v)) => HostKv::of(&k, &v)?,
                _ => HostKv::new(kv_heads, d),
            };
            self.host = Some(kv);
        }
        Ok(self.host.as_mut().expect("set just above"))
    }

    /// The rows as MLX arrays again (for MLX's ops), if a host cache held
    /// them.
    pub(crate) fn move_to_arrays(&mut self) -> Result<()> {
        if let Some(host) = self.host.take() {
            if !host.is_empty() {
                let (k, v) = host.arrays()?;
                self.keys = Some(k);
                self.values = Some(v);
            }
        }
        Ok(())
    }

    /// Keeps the latest `rows` positions (drops the oldest).
    pub(crate) fn keep_last(&mut self, rows: usize) {
        self.exact();
        if let Some(host) = &mut self.host {
            host.keep_last(rows);
        }
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let len = k.shape()[2];
            if len as usize > rows {
                let from = len - rows as i32;
                self.keys = Some(k.index((.., .., from..)));
                self.values = Some(v.index((.., .., from..)));
            }
        }
    }

    /// `keys`, `values` appended along the positions by MLX's concatenate.
    fn append(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        self.move_to_arrays()?;
        self.exact();
        let (keys, values) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (concatenate(&[k, &keys], 2)?, concatenate(&[v, &values], 2)?),
            _ => (keys, values),
        };
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        Ok((keys, values))
    }

    /// `keys`, `values` (`[B, kv_heads, L, head_dim]`) written in place
    /// after the cache's positions, in buffers with room (grown by
    /// [`ROOM_STEP`] positions when full): one slice update per array, where
    /// joining copies the whole cache and the new rows each forward. Returns
    /// the buffers and the positions they now hold.
    fn append_in_place(&mut self, keys: Array, values: Array) -> Result<(Array, Array, i32)> {
        self.move_to_arrays()?;
        let (start, l) = (self.len(), keys.shape()[2]);
        let end = start + l;
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        let room = |have: Option<&Array>, new: &Array| -> Result<Array> {
            let s = new.shape();
            let want = (end + ROOM_STEP - 1) / ROOM_STEP * ROOM_STEP;
            let kept = have.map(|a| a.index((.., .., ..start, ..)));
            let blank = zeros_dtype(&[s[0], s[1], want - start, s[3]], new.dtype())?;
            Ok(match kept {
                Some(kept) if start > 0 => concatenate(&[kept, blank], 2)?,
                _ => blank,
            })
        };
        if self.keys.is_none() || self.filled.is_none() || end > capacity {
            self.keys = Some(room(self.keys.as_ref(), &keys)?);
            self.values = Some(room(self.values.as_ref(), &values)?);
        }
        let put = |buffer: &Array, rows: &Array| -> Result<Array> {
            buffer
                .try_index_update((.., .., start..end, ..), rows, UpdateMode::Replace)
                .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()).into())
        };
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (put(k, &keys)?, put(v, &values)?),
            _ => unreachable!("both buffers were made above"),
        };
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        self.filled = Some(end);
        Ok((k, v, end))
    }
}

pub struct Attention {
    /// `q_proj`, `k_proj`, `v_proj`.
    qkv: Fused,
    o_proj: Linear,
    q_norm: Array,
    k_norm: Array,
    num_heads: i32,
    num_kv_heads: i32,
    head_dim: i32,
    eps: f32,
    rope: Rope,
    /// Scores and weighted sums by the host kernels (the CPU path), whose
    /// rows do not depend on how many queries come together.
    host: bool,
    /// The host kernels' arithmetic, fixed at load like the linear maps'.
    arithmetic: host::Arithmetic,
    /// The q/k norms, RoPE and the cache's growth on the host (the CPU
    /// path, bf16).
    host_head: Option<HostAttention>,
    /// Decode steps and verified blocks on the row-invariant CUDA kernel
    /// (`linear::row_kernels`), for the same reason.
    row_kernel: bool,
    /// The head kernel's parameters (`row_invariant::head_params`), where
    /// it runs: CUDA's row kernels with a linear RoPE.
    head_params: Option<Array>,
}

impl Attention {
    pub fn load(
        weights: &mut Weights,
        path: &str,
        config: &TextConfig,
        rope: Rope,
    ) -> Result<Self> {
        let mut attention = Attention {
            qkv: Fused::load(
                weights,
                &["q", "k", "v"].map(|part| format!("{path}.{part}_proj")),
            )?,
            o_proj: Linear::load(weights, &format!("{path}.o_proj"))?,
            q_norm: weights.take(&format!("{path}.q_norm.weight"))?,
            k_norm: weights.take(&format!("{path}.k_norm.weight"))?,
            num_heads: config.num_attention_heads as i32,
            num_kv_heads: config.num_key_value_heads as i32,
            head_dim: config.head_dim() as i32,
            eps: config.rms_norm_eps,
            rope,
            host: weights.host_kernels(),
            arithmetic: host::arithmetic(),
            host_head: None,
            row_kernel: row_kernels(),
            head_params: None,
        };
        if let (true, Scaling::Linear(scale)) =
            (attention.row_kernel && head_kernel(), rope.scaling)
        {
            let params = row_invariant::head_params(rope.theta, scale, attention.eps);
            attention.head_params = Some(params);
        }
        if attention.host {
            let (q, k) = (&attention.q_norm, &attention.k_norm);
            attention.host_head = HostAttention::new(q, k, rope, attention.eps)?;
        }
        Ok(attention)
    }

    /// `x`: `[B, L, hidden]`; appends L positions to `cache`.
    pub fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        match self.forward_onto(x, cache, None)? {
            Onto::Apart(out) | Onto::Added(out) => Ok(out),
        }
    }

    /// [`Self::forward`] onto the residual stream `residual` when given.
    pub fn forward_onto(
        &self,
        x: &Array,
        cache: &mut KvCache,
        residual: Option<&Array>,
    ) -> Result<Onto> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let qkv = self.qkv.forward(x)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        if let Some(head) = self.host_head.as_ref().filter(|_| b == 1) {
            let d = self.head_dim as usize;
            let parts = [&qkv[0], &qkv[1], &qkv[2]];
            let heads = self.num_heads as usize;
            if let Some((q, k, v)) = head.project(parts, heads, d, cache.len())? {
                let kv_heads = self.num_kv_heads as usize;
                let kv = cache.host(kv_heads, d)?;
                kv.append(&k, &v);
                let dims = (heads, kv_heads, l as usize, kv.len(), d);
                let out = host::cached_attention(&q, kv.rows(), dims, scale, self.arithmetic, true);
                let shape = [1, self.num_heads, l, self.head_dim];
                let out = host::from_f32(&out, &shape, mlx_rs::Dtype::Bfloat16)?;
                return self.gate_and_project(&out, &qkv[0], residual);
            }
        }
        let offset = cache.len();
        let (queries, keys, values) = self.head(&qkv, offset)?;
        let gate = || -> Result<Array> {
            let both = qkv[0].reshape(&[b, l, self.num_heads, -1])?;
            Ok(split_equal(&both, 2, -1)?[1].reshape(&[b, l, -1])?)
        };
        let (keys, values) = if self.row_kernel && !self.host && kv_in_place() {
            let (keys, values, filled) = cache.append_in_place(keys, values)?;
            if row_invariant::takes_attention(&queries, &keys) {
                // `[B, L, heads * D]` as the kernel writes it: no view nodes.
                let merged =
                    gate_in_merge() && row_invariant::takes_attention_gate(&queries, &qkv[0]);
                let out = row_invariant::causal_attention_in_tokens(
                    &queries,
                    &keys,
                    &values,
                    filled,
                    scale,
                    merged.then_some(&qkv[0]),
                )?;
                if merged {
                    return self.project(&out, residual);
                }
                return self.project(&fused::sigmoid_gate(&out, &gate()?)?, residual);
            }
            cache.exact();
            match cache.keys_values()? {
                Some(kv) => kv,
                None => unreachable!("appended just above"),
            }
        } else {
            cache.append(keys, values)?
        };

        // `[B, L, heads * D]` as o_proj reads it (the kernel writes it so).
        let out = if self.host && b == 1 {
            let out = host::causal_attention(&queries, &keys, &values, scale, self.arithmetic)?;
            return self.gate_and_project(&out, &qkv[0], residual);
        } else if self.row_kernel && row_invariant::takes_attention(&queries, &keys) {
            row_invariant::causal_attention_tokens(&queries, &keys, &values, scale)?
        } else {
            let mask = (l > 1).then_some(ScaledDotProductAttentionMask::Causal);
            scaled_dot_product_attention(&queries, &keys, &values, scale, mask, None)?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[b, l, -1])?
        };
        self.project(&fused::sigmoid_gate(&out, &gate()?)?, residual)
    }

    /// The queries `[B, heads, L, D]`, keys and values `[B, kv_heads, L,
    /// D]` of the products `qkv` for positions `offset..`: normed, rotated
    /// and laid out by heads, in one kernel where it runs, else by MLX's ops.
    fn head(&self, qkv: &[Array], offset: i32) -> Result<(Array, Array, Array)> {
        let (b, l) = (qkv[0].shape()[0], qkv[0].shape()[1]);
        let shape = row_invariant::HeadShape {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            rope_dims: self.rope.dims as i32,
            gated: true,
        };
        let norms = [&self.q_norm, &self.k_norm];
        if let Some(params) = &self.head_params {
            if row_invariant::takes_attention_head(&qkv[0], &qkv[1], &qkv[2], norms, shape) {
                let [q, k, v] = row_invariant::attention_head(
                    &qkv[0],
                    &qkv[1],
                    &qkv[2],
                    &self.q_norm,
                    &self.k_norm,
                    params,
                    offset,
                    shape,
                )?;
                return Ok((q, k, v));
            }
        }
        let both = qkv[0].reshape(&[b, l, self.num_heads, -1])?;
        let queries = &split_equal(&both, 2, -1)?[0];
        let queries =
            rms_norm(queries, Some(&self.q_norm), self.eps)?.transpose_axes(&[0, 2, 1, 3])?;
        let keys = qkv[1].reshape(&[b, l, self.num_kv_heads, -1])?;
        let keys = rms_norm(&keys, Some(&self.k_norm), self.eps)?.transpose_axes(&[0, 2, 1, 3])?;
        let values = qkv[2]
            .reshape(&[b, l, self.num_kv_heads, -1])?
            .transpose_axes(&[0, 2, 1, 3])?;
        Ok((
            self.rotate(&queries, offset)?,
            self.rotate(&keys, offset)?,
            values,
        ))
    }

    /// `o_proj`, onto `residual` when given.
    fn project(&self, x: &Array, residual: Option<&Array>) -> Result<Onto> {
        match residual {
            Some(residual) => self.o_proj.forward_onto(x, residual),
            None => Ok(Onto::Apart(self.o_proj.forward(x)?)),
        }
    }

    /// The host attention's `out` `[1, H, L, d]` times the sigmoid of its
    /// gate (from `q_gate`, the query product), then `o_proj`.
    fn gate_and_project(
        &self,
        out: &Array,
        q_gate: &Array,
        residual: Option<&Array>,
    ) -> Result<Onto> {
        if let Some(gated) = host::attention_gate(out, q_gate)? {
            return self.project(&gated, residual);
        }
        let l = out.shape()[2];
        let both = q_gate.reshape(&[1, l, self.num_heads, -1])?;
        let gate = split_equal(&both, 2, -1)?[1].reshape(&[1, l, -1])?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, l, -1])?;
        self.project(&fused::sigmoid_gate(&out, &gate)?, residual)
    }

    fn rotate(&self, x: &Array, offset: i32) -> Result<Array> {
        crate::nn::rope::apply(
            x,
            self.rope.dims as i32,
            self.rope.theta,
            self.rope.scaling,
            offset,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::Dtype;

    fn rows(seed: i32, len: i32) -> Array {
        let count = (2 * len * 4) as usize;
        let v: Vec<f32> = (0..count)
            .map(|i| ((i as f32 + 1.0) * 0.37 + seed as f32).sin())
            .collect();
        Array::from_slice(&v, &[1, 2, len, 4])
            .as_dtype(Dtype::Bfloat16)
            .unwrap()
    }

    /// A cache in buffers with room holds what joining holds, through
    /// appends of a prompt, single steps, blocks, trims (a rollback) and
    /// growth past a buffer's room; the positions it returns are its length.
    #[test]
    fn a_cache_written_in_place_holds_what_joining_holds() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let (mut joined, mut in_place) = (KvCache::default(), KvCache::default());
        let script = [(5, 0), (1, 0), (16, 10), (1, 0), (300, 0), (16, 15), (3, 0)];
        for (seed, (add, trim)) in script.into_iter().enumerate() {
            let (k, v) = (rows(seed as i32, add), rows(100 + seed as i32, add));
            joined.append(k.clone(), v.clone()).unwrap();
            let (kb, _, filled) = in_place.append_in_place(k, v).unwrap();
            assert_eq!(filled, joined.len());
            assert!(kb.shape()[2] >= filled && kb.shape()[2] % ROOM_STEP == 0);
            joined.trim(trim);
            in_place.trim(trim);
            assert_eq!(in_place.len(), joined.len());
            let (a, b) = (
                joined.keys_values().unwrap().unwrap(),
                in_place.keys_values().unwrap().unwrap(),
            );
            for (x, y) in [(&a.0, &b.0), (&a.1, &b.1)] {
                assert_eq!(x.shape(), y.shape());
                let x = x.as_dtype(Dtype::Float32).unwrap();
                let y = y.as_dtype(Dtype::Float32).unwrap();
                assert_eq!(x.as_slice::<f32>(), y.as_slice::<f32>(), "step {seed}");
            }
        }
        // Made exact again (as the drafter's window or the host path needs).
        in_place.keep_last(8);
        joined.keep_last(8);
        let (a, b) = (
            joined.keys_values().unwrap().unwrap(),
            in_place.keys_values().unwrap().unwrap(),
        );
        assert_eq!(a.0.shape(), b.0.shape());
        let (x, y) = (
            a.0.as_dtype(Dtype::Float32).unwrap(),
            b.0.as_dtype(Dtype::Float32).unwrap(),
        );
        assert_eq!(x.as_slice::<f32>(), y.as_slice::<f32>());
    }
}
