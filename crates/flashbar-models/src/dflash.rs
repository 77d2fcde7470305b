//! The DFlash drafter (z-lab `DFlashDraftModel`): a few pre-norm decoder
//! layers that propose a whole block of tokens in one forward.
//!
//! - Context: the target's tap hidden states, fused by `fc` + `hidden_norm`
//!   into `h_ctx`, which every layer projects with its own `k_proj`/`v_proj`
//!   (k_norm, RoPE at absolute positions) into a per-layer context cache.
//!   The cache only ever receives committed positions.
//! - Block: `[last token, mask x (bs-1)]`, embedded with the target's
//!   embedding; its queries attend to the context and to the whole block
//!   (bidirectional, or causal in sliding layers unless `is_causal` says
//!   otherwise). Block keys are not cached.
//! - Logits of positions 1.. through the target's lm_head.

use crate::checkpoint::Checkpoint;
use crate::config::{ModelConfig, Scaling};
use crate::dflash_config::DrafterConfig;
mod host;
use crate::error::{ModelError, Result};
use crate::nn::attention::KvCache;
use crate::nn::linear::{row_kernels, Fused, Linear, MatmulPath, Weights};
use crate::nn::mlp::Mlp;
use crate::Model;
use flashbar_mlx::row_invariant;
use host::HostDraft;
use mlx_rs::fast::{rms_norm, scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, tanh};
use mlx_rs::Array;
use std::path::Path;

pub struct Drafter {
    config: DrafterConfig,
    pub(crate) fc: Linear,
    pub(crate) hidden_norm: Array,
    pub(crate) layers: Vec<DraftLayer>,
    pub(crate) norm: Array,
    /// The forward's small ops and attention on the host (the CPU path,
    /// `dflash/host.rs`), when the drafter is one it takes.
    host: Option<HostDraft>,
}

pub(crate) struct DraftLayer {
    pub(crate) attention: DraftAttention,
    pub(crate) mlp: Mlp,
    pub(crate) input_layernorm: Array,
    pub(crate) post_attention_layernorm: Array,
}

pub(crate) struct DraftAttention {
    /// `q_proj`, `k_proj`, `v_proj`.
    pub(crate) qkv: Fused,
    pub(crate) o_proj: Linear,
    pub(crate) q_norm: Array,
    pub(crate) k_norm: Array,
    pub(crate) heads: i32,
    pub(crate) kv_heads: i32,
    pub(crate) head_dim: i32,
    pub(crate) window: Option<i32>,
    pub(crate) causal: bool,
    /// Unmasked blocks through our CUDA attention kernel: MLX's block
    /// attention builds a cuDNN plan for every new context length, and each
    /// round's is new (docs/gpu.md).
    row_kernel: bool,
    /// The head kernel's parameters where it runs the q/k norms, RoPE and
    /// the heads' layout in one launch ([`HEAD_KERNEL_ENV`]).
    head_params: Option<Array>,
}

/// `1` runs a CUDA drafter layer's q/k norms, RoPE and heads' layout in
/// the attention head kernel (ungated), where MLX's ops take some ten graph
/// nodes a layer (docs/gpu.md, "The drafter's head in one kernel"). Opt-in
/// until a GPU run has checked the acceptance with it: the norms' sums go in
/// another order than MLX's, so a draft may differ in a last bit.
pub const HEAD_KERNEL_ENV: &str = "FLASHBAR_DRAFT_HEAD_KERNEL";

fn head_kernel() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(HEAD_KERNEL_ENV).as_deref() == Ok("1"))
}

/// The drafter's context cache: what it has seen of the committed sequence.
#[derive(Clone, Default)]
pub struct DraftCache {
    /// Per layer, the context's keys and values `[B, kv_heads, rows,
    /// head_dim]`: the most recent context positions (all of them, a
    /// window's tail, or the config's `context_window`).
    pub(crate) layers: Vec<KvCache>,
    /// Committed positions fed so far (the absolute position of the next one).
    pub(crate) positions: i32,
}

impl DraftCache {
    pub fn positions(&self) -> usize {
        self.positions as usize
    }
}

impl Drafter {
    /// Loads a drafter folder and checks it fits `target`.
    pub fn load(dir: &Path, target: &Model) -> Result<Self> {
        Self::load_on(dir, target, None)
    }

    /// [`Self::load`] with MLX's matmul path whatever the device: the
    /// GPU's dense products and forward, run on the CPU (the tests compare
    /// it with the host path).
    #[cfg(test)]
    pub(crate) fn load_on_mlx_path(dir: &Path, target: &Model) -> Result<Self> {
        Self::load_on(dir, target, Some(MatmulPath::Mlx))
    }

    fn load_on(dir: &Path, target: &Model, path: Option<MatmulPath>) -> Result<Self> {
        let (config, checkpoint) = Self::check(dir, target.config())?;
        let arrays = checkpoint.load()?;
        let mut weights = Weights::new(arrays, config.quantization.clone());
        if let Some(path) = path {
            weights.set_matmul_path(path);
        }
        let host_maps = weights.matmul_path() == MatmulPath::Host;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("layers.{i}");
            let a = format!("{p}.self_attn");
            layers.push(DraftLayer {
                attention: DraftAttention {
                    qkv: Fused::load_stacking_dense(
                        &mut weights,
                        &["q", "k", "v"].map(|part| format!("{a}.{part}_proj")),
                    )?,
                    o_proj: Linear::load(&mut weights, &format!("{a}.o_proj"))?,
                    q_norm: weights.take(&format!("{a}.q_norm.weight"))?,
                    k_norm: weights.take(&format!("{a}.k_norm.weight"))?,
                    heads: config.num_attention_heads as i32,
                    kv_heads: config.num_key_value_heads as i32,
                    head_dim: config.head_dim as i32,
                    window: config.window(i).map(|w| w as i32),
                    causal: config.causal(i),
                    row_kernel: row_kernels(),
                    head_params: match config.rope_scaling {
                        Scaling::Linear(scale) if row_kernels() && head_kernel() => {
                            Some(row_invariant::head_params(
                                config.rope_theta,
                                scale,
                                config.rms_norm_eps,
                            ))
                        }
                        _ => None,
                    },
                },
                mlp: Mlp::load_stacking_dense(&mut weights, &format!("{p}.mlp"))?,
                input_layernorm: weights.take(&format!("{p}.input_layernorm.weight"))?,
                post_attention_layernorm: weights
                    .take(&format!("{p}.post_attention_layernorm.weight"))?,
            });
        }
        let mut drafter = Drafter {
            fc: Linear::load(&mut weights, "fc")?,
            hidden_norm: weights.take("hidden_norm.weight")?,
            norm: weights.take("norm.weight")?,
            layers,
            config,
            host: None,
        };
        if let Some(extra) = weights.leftover() {
            return Err(ModelError::UnexpectedTensor(extra.clone()));
        }
        drafter.host = HostDraft::new(&drafter, host_maps)?;
        Ok(drafter)
    }

    /// The config and checkpoint headers, if they parse and fit `target`
    /// (no tensor data is read).
    pub fn check(dir: &Path, target: &ModelConfig) -> Result<(DrafterConfig, Checkpoint)> {
        let config = DrafterConfig::load(dir)?;
        let incompatible = |reason: String| ModelError::Incompatible {
            dir: dir.to_owned(),
            reason,
        };
        config.check_target(target).map_err(incompatible)?;
        let checkpoint = Checkpoint::open(dir)?;
        let fc = checkpoint
            .tensors
            .get("fc.weight")
            .ok_or_else(|| ModelError::MissingTensor("fc.weight".into()))?;
        // Packed quantized rows hold 32/bits values per u32.
        let per_element = match config.quant_of("fc") {
            Some(q) if checkpoint.tensors.contains_key("fc.scales") => 32 / q.bits,
            _ => 1,
        };
        let width = fc.shape.get(1).copied().unwrap_or(0) * per_element;
        let expected = config.target_layer_ids.len() * target.text.hidden_size;
        if fc.shape.first() != Some(&config.hidden_size) || width != expected {
            return Err(incompatible(format!(
                "fc.weight takes {width} inputs, but {} taps of the target's hidden size make {expected}",
                config.target_layer_ids.len()
            )));
        }
        Ok((config, checkpoint))
    }

    pub fn config(&self) -> &DrafterConfig {
        &self.config
    }

    pub fn new_cache(&self) -> DraftCache {
        DraftCache {
            layers: vec![KvCache::default(); self.layers.len()],
            positions: 0,
        }
    }

    /// Draft logits `[B, bs-1, vocab]` for `block` `[B, bs]`, after appending
    /// `taps` `[B, S, n_taps*hidden]` (the next S committed positions) to the
    /// context. `target` lends its embedding and lm_head.
    pub fn forward(
        &self,
        target: &Model,
        block: &Array,
        taps: &Array,
        cache: &mut DraftCache,
    ) -> Result<Array> {
        let Some(window) = self.config.context_window else {
            return self.forward_seeing_all(target, block, taps, cache);
        };
        // The block sees the latest `window` committed rows: the cache keeps
        // room for the new ones, and new rows older than the window are
        // skipped, their positions counted (RoPE keeps absolute positions).
        let (rows, window) = (taps.shape()[1], window as i32);
        for kv in &mut cache.layers {
            kv.keep_last((window - rows.min(window)) as usize);
        }
        let taps = if rows > window {
            cache.positions += rows - window;
            &taps.index((.., (rows - window)..))
        } else {
            taps
        };
        self.forward_seeing_all(target, block, taps, cache)
    }

    /// [`Self::forward`] over the whole context the cache holds.
    fn forward_seeing_all(
        &self,
        target: &Model,
        block: &Array,
        taps: &Array,
        cache: &mut DraftCache,
    ) -> Result<Array> {
        if let Some(host) = &self.host {
            if let Some(logits) = host.forward(self, target, block, taps, cache)? {
                return self.scale_logits(logits);
            }
        }
        let c = &self.config;
        let mut h = target.embed(block)?;
        if c.input_embedding_scale != 1.0 {
            h = h.multiply(Array::from_f32(c.input_embedding_scale).as_dtype(h.dtype())?)?;
        }
        let context = rms_norm(
            &self.fc.forward(taps)?,
            Some(&self.hidden_norm),
            c.rms_norm_eps,
        )?;
        let start = cache.positions;
        for (layer, kv) in self.layers.iter().zip(cache.layers.iter_mut()) {
            let x = rms_norm(&h, Some(&layer.input_layernorm), c.rms_norm_eps)?;
            h = h.add(layer.attention.forward(&x, &context, start, kv, c)?)?;
            let x = rms_norm(&h, Some(&layer.post_attention_layernorm), c.rms_norm_eps)?;
            let ff = layer.mlp.forward_onto(&x, Some(&h))?;
            h = ff.or_add(|out| Ok(h.add(out)?))?;
        }
        cache.positions += taps.shape()[1];
        let h = rms_norm(h.index((.., 1..)), Some(&self.norm), c.rms_norm_eps)?;
        self.scale_logits(target.lm_head(&h)?)
    }

    /// q/k/v as three products again, and gate and up as two, where they
    /// are one dense product (the tests compare the two).
    #[cfg(test)]
    pub(crate) fn with_maps_apart(mut self) -> Self {
        self.layers = std::mem::take(&mut self.layers)
            .into_iter()
            .map(|mut layer| {
                layer.attention.qkv = layer.attention.qkv.unstacked().unwrap();
                layer.mlp = layer.mlp.unstacked().unwrap();
                layer
            })
            .collect();
        self
    }

    /// Whether the forward runs on the host path (`dflash/host.rs`).
    pub fn is_host(&self) -> bool {
        self.host.is_some()
    }

    /// The forward on MLX's ops alone, as before the host path (the tests
    /// compare the two).
    #[cfg(test)]
    pub(crate) fn without_host(mut self) -> Self {
        self.host = None;
        self
    }

    /// The config's output multiplier and soft cap on the lm_head's logits.
    fn scale_logits(&self, mut logits: Array) -> Result<Array> {
        let c = &self.config;
        if c.output_multiplier != 1.0 {
            logits =
                logits.multiply(Array::from_f32(c.output_multiplier).as_dtype(logits.dtype())?)?;
        }
        if let Some(cap) = c.final_logit_softcapping {
            let cap = Array::from_f32(cap).as_dtype(logits.dtype())?;
            logits = tanh(logits.divide(&cap)?)?.multiply(&cap)?;
        }
        Ok(logits)
    }
}

impl DraftAttention {
    /// `x`: the block `[B, L, hidden]`; `context`: S new committed positions
    /// starting at absolute position `start`.
    fn forward(
        &self,
        x: &Array,
        context: &Array,
        start: i32,
        kv: &mut KvCache,
        config: &DrafterConfig,
    ) -> Result<Array> {
        kv.move_to_arrays()?;
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let mut context = context.clone();
        let mut context_start = start;
        let s_all = context.shape()[1];
        // A window only ever needs its last `window - 1` context rows.
        if let Some(window) = self.window {
            if s_all > window - 1 {
                let skip = s_all - (window - 1);
                context = context.index((.., skip..));
                context_start += skip;
            }
        }
        let s = context.shape()[1];
        let block_start = start + s_all;
        let eps = config.rms_norm_eps;
        let heads = |t: &Array, n: i32, rows: i32| t.reshape(&[b, rows, n, -1]);
        let project_keys = |t: &Array, rows: i32| -> Result<Array> {
            Ok(
                rms_norm(&heads(t, self.kv_heads, rows)?, Some(&self.k_norm), eps)?
                    .transpose_axes(&[0, 2, 1, 3])?,
            )
        };
        let project_values = |t: &Array, rows: i32| -> Result<Array> {
            Ok(heads(t, self.kv_heads, rows)?.transpose_axes(&[0, 2, 1, 3])?)
        };
        let rotate = |t: &Array, offset: i32| -> Result<Array> {
            crate::nn::rope::apply(
                t,
                self.head_dim,
                config.rope_theta,
                config.rope_scaling,
                offset,
            )
        };
        // q of the block; keys and values of the new context rows then the
        // block's, `[B, kv_heads, s + l, head_dim]`. The two sets of rows
        // hold consecutive positions (context_start + s == block_start), so
        // where the maps are one product the rows go through it together
        // (context first; its q is not used) and their keys are normed and
        // rotated in one call each: row by row the same values as apart,
        // three calls fewer (docs/gpu.md, "The drafter's forward on the GPU").
        debug_assert_eq!(context_start + s, block_start);
        if let Some(heads) = self.head_in_one_kernel(x, &context, s, context_start)? {
            let (queries, new_keys, new_values) = heads;
            return self.attend(queries, new_keys, new_values, l, kv);
        }
        let (q_x, new_keys, new_values) =
            if self.qkv.is_stacked() && s > 0 && context.dtype() == x.dtype() {
                let [q, k, v] = three(self.qkv.forward(&concatenate(&[&context, x], 1)?)?)?;
                (
                    q.index((.., s..)),
                    rotate(&project_keys(&k, s + l)?, context_start)?,
                    project_values(&v, s + l)?,
                )
            } else {
                let [q, k, v] = three(self.qkv.forward(x)?)?;
                let block_keys = rotate(&project_keys(&k, l)?, block_start)?;
                let block_values = project_values(&v, l)?;
                if s > 0 {
                    let of = |i: usize| self.qkv.forward_one(i, &context);
                    let keys = rotate(&project_keys(&of(1)?, s)?, context_start)?;
                    let values = project_values(&of(2)?, s)?;
                    (
                        q,
                        concatenate(&[&keys, &block_keys], 2)?,
                        concatenate(&[&values, &block_values], 2)?,
                    )
                } else {
                    (q, block_keys, block_values)
                }
            };
        let queries = rms_norm(&heads(&q_x, self.heads, l)?, Some(&self.q_norm), eps)?
            .transpose_axes(&[0, 2, 1, 3])?;
        let queries = rotate(&queries, block_start)?;
        self.attend(queries, new_keys, new_values, l, kv)
    }

    /// The block's queries `[B, heads, l, D]` and the new rows' and the
    /// block's keys and values `[B, kv_heads, s + l, D]` from the head
    /// kernel, where it runs: the context's and the block's rows through
    /// the stacked q/k/v product together, then normed, rotated from
    /// `context_start` and laid out in one launch. None: MLX's ops.
    fn head_in_one_kernel(
        &self,
        x: &Array,
        context: &Array,
        s: i32,
        context_start: i32,
    ) -> Result<Option<(Array, Array, Array)>> {
        let Some(params) = &self.head_params else {
            return Ok(None);
        };
        if !self.qkv.is_stacked() || (s > 0 && context.dtype() != x.dtype()) {
            return Ok(None);
        }
        let shape = row_invariant::HeadShape {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            rope_dims: self.head_dim,
            gated: false,
        };
        let rows = if s > 0 {
            concatenate(&[context, x], 1)?
        } else {
            x.clone()
        };
        let [q, k, v] = three(self.qkv.forward(&rows)?)?;
        let norms = [&self.q_norm, &self.k_norm];
        if !row_invariant::takes_attention_head(&q, &k, &v, norms, shape) {
            return Ok(None);
        }
        let [q, k, v] = row_invariant::attention_head(
            &q,
            &k,
            &v,
            &self.q_norm,
            &self.k_norm,
            params,
            context_start,
            shape,
        )?;
        Ok(Some((q.index((.., .., s.., ..)), k, v)))
    }

    /// Attention of the block's `queries` over the cached context and the
    /// new rows and block (`new_keys`, `new_values`), the cache then keeping
    /// what the next round can still see; the output projected.
    fn attend(
        &self,
        queries: Array,
        new_keys: Array,
        new_values: Array,
        l: i32,
        kv: &mut KvCache,
    ) -> Result<Array> {
        let b = queries.shape()[0];
        // The cached context, then the new rows and the block.
        let (keys, values) = match (&kv.keys, &kv.values) {
            (Some(k), Some(v)) => (
                concatenate(&[k, &new_keys], 2)?,
                concatenate(&[v, &new_values], 2)?,
            ),
            _ => (new_keys, new_values),
        };
        let ctx_len = keys.shape()[2] - l;
        let mask = self.mask(l, ctx_len)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        let out =
            if mask.is_none() && self.row_kernel && row_invariant::takes_attention(&queries, &keys)
            {
                // `[B, L, heads * D]` as o_proj reads it: the kernel writes it so.
                row_invariant::full_attention_tokens(&queries, &keys, &values, scale)?
            } else {
                scaled_dot_product_attention(
                    &queries,
                    &keys,
                    &values,
                    scale,
                    mask.as_ref().map(ScaledDotProductAttentionMask::Array),
                    None,
                )?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[b, l, -1])?
            };
        // Keep what the next round can still see.
        let keep = self.window.map_or(ctx_len, |w| ctx_len.min(w - 1));
        kv.keys = Some(keys.index((.., .., (ctx_len - keep)..ctx_len)));
        kv.values = Some(values.index((.., .., (ctx_len - keep)..ctx_len)));
        self.o_proj.forward(&out)
    }

    /// Which keys each block query sees, `[L, ctx_len + L]` (None = all).
    /// Context rows are the latest `ctx_len` positions before the block.
    fn mask(&self, l: i32, ctx_len: i32) -> Result<Option<Array>> {
        if self.window.is_none() && !self.causal {
            return Ok(None);
        }
        let total = ctx_len + l;
        let mut allowed = Vec::with_capacity((l * total) as usize);
        for i in 0..l {
            let query = ctx_len + i;
            for key in 0..total {
                let visible = if key < ctx_len {
                    self.window.is_none_or(|w| query - key < w)
                } else {
                    !self.causal || key <= query
                };
                allowed.push(visible);
            }
        }
        Ok(Some(Array::from_slice(&allowed, &[l, total])))
    }
}

/// The three maps of a q/k/v [`Fused`].
fn three(maps: Vec<Array>) -> Result<[Array; 3]> {
    maps.try_into()
        .map_err(|_| mlx_rs::error::Exception::custom("q/k/v gave other than 3 maps").into())
}
