//! Qwen3.5 / Qwen3.6 hybrid decoder (mlx-lm `models/qwen3_5.py`): Gated
//! DeltaNet layers with full attention every `full_attention_interval`
//! layers, each followed by a SwiGLU MLP (dense) or a sparse MoE block.

use crate::checkpoint::Checkpoint;
use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::nn::attention::{Attention, KvCache};
use crate::nn::gated_delta::{GatedDeltaNet, GdnState, GdnTape};
use crate::nn::host;
use crate::nn::linear::{Embedding, Linear, MatmulPath, Weights};
use crate::nn::mlp::Mlp;
use crate::nn::moe::{next_norm_in_combine, NextNorm, SparseMoe};
use crate::sanitize::{is_hf_layout, sanitize};
use crate::spec::{self, Header};
use mlx_rs::fast::rms_norm;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use std::collections::HashMap;
use std::path::Path;

/// `n` queues a verify's hidden state on the device every `n` layers, so
/// the device runs the first layers while the host builds the rest, and a
/// round's rollback as soon as it is built; `0` queues a verify whole when
/// it is read. On CUDA every 2 layers unless set (measured on the H200,
/// docs/acceptance.md "One wait a round, on the H200"); elsewhere `0`
/// unless set (the CPU's host ops evaluate as they go; Metal is untried).
/// Docs: docs/dflash.md, "One wait a round".
pub const PIPELINE_LAYERS_ENV: &str = "FLASHBAR_PIPELINE_LAYERS";

pub fn pipeline_layers() -> usize {
    use flashbar_mlx::device::{self, Backend};
    static EVERY: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        let backend = device::current();
        if backend == Backend::Cpu {
            return 0;
        }
        let default = if backend == Backend::Cuda { 2 } else { 0 };
        std::env::var(PIPELINE_LAYERS_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    })
}

/// Per-layer decoding state.
#[derive(Clone)]
pub enum LayerCache {
    Gdn(GdnState),
    Kv(KvCache),
}

enum Mixer {
    Linear(GatedDeltaNet),
    Attention(Attention),
}

enum FeedForward {
    Dense(Mlp),
    Moe(Box<SparseMoe>),
}

struct DecoderLayer {
    mixer: Mixer,
    feed_forward: FeedForward,
    input_layernorm: Norm,
    post_attention_layernorm: Norm,
}

/// An RMS norm's weight, and on the host path its values for the host op
/// (bit for bit MLX's, docs/cpu.md "Host ops"), with the residual adds.
struct Norm {
    weight: Array,
    host: Option<host::HostVector>,
}

impl Norm {
    fn load(weights: &mut Weights, name: &str) -> Result<Self> {
        let weight = weights.take(name)?;
        let host = match weights.matmul_path() {
            MatmulPath::Host if host::takes(weight.dtype()) => Some(host::HostVector::of(&weight)?),
            _ => None,
        };
        Ok(Norm { weight, host })
    }

    fn forward(&self, x: &Array, eps: f32) -> Result<Array> {
        if let Some(w) = &self.host {
            if let Some(y) = host::rms_norm(x, w, eps)? {
                return Ok(y);
            }
        }
        Ok(rms_norm(x, Some(&self.weight), eps)?)
    }

    /// `a + b`, on the host when this norm is.
    fn residual(&self, a: &Array, b: &Array) -> Result<Array> {
        if self.host.is_some() {
            if let Some(sum) = host::add(a, b)? {
                return Ok(sum);
            }
        }
        Ok(a.add(b)?)
    }
}

pub struct Model {
    config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: Norm,
    lm_head: Option<Linear>,
}

impl Model {
    /// Loads a checkpoint folder (HF or MLX format), validating every tensor
    /// against the config before any is read.
    pub fn load(dir: &Path) -> Result<Self> {
        let (config, checkpoint) = Self::check(dir)?;
        let hf_layout = hf_layout(&checkpoint);
        let arrays = sanitize(&config, checkpoint.load()?, hf_layout)?
            .into_iter()
            .collect();
        Self::from_arrays(config, arrays)
    }

    /// Everything [`Model::load`] checks, without reading any tensor data:
    /// the config, and every tensor's name, dtype and shape.
    pub fn check(dir: &Path) -> Result<(ModelConfig, Checkpoint)> {
        let config = ModelConfig::load(dir)?;
        let checkpoint = Checkpoint::open(dir)?;
        let headers = checkpoint.tensors.iter().map(|(name, info)| {
            let header = Header {
                dtype: info.dtype.clone(),
                shape: info.shape.clone(),
            };
            (name.clone(), header)
        });
        let headers = sanitize(&config, headers, hf_layout(&checkpoint))?;
        spec::check(&config, &headers.into_iter().collect())?;
        Ok((config, checkpoint))
    }

    fn from_arrays(config: ModelConfig, arrays: HashMap<String, Array>) -> Result<Self> {
        let mut weights = Weights::new(arrays, config.quantization.clone());
        let t = &config.text;
        let embed_tokens = Embedding::load(&mut weights, "model.embed_tokens")?;
        let mut layers = Vec::with_capacity(t.num_hidden_layers);
        for i in 0..t.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let mixer = if t.is_linear_layer(i) {
                Mixer::Linear(GatedDeltaNet::load(
                    &mut weights,
                    &format!("{p}.linear_attn"),
                    t,
                )?)
            } else {
                Mixer::Attention(Attention::load(
                    &mut weights,
                    &format!("{p}.self_attn"),
                    t,
                    config.rope,
                )?)
            };
            let feed_forward = match config.architecture {
                Architecture::Dense => {
                    FeedForward::Dense(Mlp::load(&mut weights, &format!("{p}.mlp"))?)
                }
                Architecture::Moe => FeedForward::Moe(Box::new(SparseMoe::load(
                    &mut weights,
                    &format!("{p}.mlp"),
                    t,
                )?)),
            };
            layers.push(DecoderLayer {
                mixer,
                feed_forward,
                input_layernorm: Norm::load(&mut weights, &format!("{p}.input_layernorm.weight"))?,
                post_attention_layernorm: Norm::load(
                    &mut weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
            });
        }
        let norm = Norm::load(&mut weights, "model.norm.weight")?;
        let lm_head = if t.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(&mut weights, "lm_head")?)
        };
        if let Some(extra) = weights.leftover() {
            return Err(ModelError::UnexpectedTensor(extra.clone()));
        }
        Ok(Model {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// A fresh decoding state: one entry per layer.
    pub fn new_cache(&self) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|layer| match layer.mixer {
                Mixer::Linear(_) => LayerCache::Gdn(GdnState::default()),
                Mixer::Attention(_) => LayerCache::Kv(KvCache::default()),
            })
            .collect()
    }

    /// Feeds `tokens` `[B, L]` to the model, continuing from `cache`; the
    /// logits and taps `outputs` asks for.
    pub fn forward(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        outputs: Outputs,
    ) -> Result<Forward> {
        let (forward, _) = self.run(tokens, cache, outputs, false)?;
        Ok(forward)
    }

    /// The verify forward of a drafted block: logits at every position, the
    /// taps, and the tape that lets [`Model::rollback`] keep any prefix of
    /// the block.
    pub fn verify(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        taps: &[usize],
    ) -> Result<Verified> {
        let (forward, tapes) = self.run(tokens, cache, Outputs::ALL.tapping(taps), true)?;
        Ok(Verified {
            logits: forward.logits,
            taps: forward.taps,
            tape: Tape {
                layers: tapes,
                tokens: tokens.shape()[1],
            },
        })
    }

    /// Makes `cache` hold only the first `accepted` tokens of the verified
    /// block: attention KV trimmed, GDN state replayed from the tape.
    pub fn rollback(&self, cache: &mut [LayerCache], tape: &Tape, accepted: usize) -> Result<()> {
        let accepted = accepted as i32;
        if accepted >= tape.tokens {
            return Ok(());
        }
        for (state, layer_tape) in cache.iter_mut().zip(&tape.layers) {
            match (state, layer_tape) {
                (LayerCache::Kv(kv), None) => kv.trim(tape.tokens - accepted),
                (LayerCache::Gdn(s), Some(t)) => t.rollback(s, accepted)?,
                _ => return Err(mismatched_cache()),
            }
        }
        Ok(())
    }

    /// The target's token embedding (the drafter borrows it).
    pub fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.lookup(tokens)
    }

    /// The target's output head on final-normed hidden states (the drafter borrows it).
    pub fn lm_head(&self, h: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(h),
            None => self.embed_tokens.as_linear(h),
        }
    }

    /// The one forward: every layer in turn, the taps copied out as they
    /// pass, the GDN tapes kept when `record`.
    fn run(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        outputs: Outputs,
        record: bool,
    ) -> Result<(Forward, Vec<Option<GdnTape>>)> {
        let eps = self.config.text.rms_norm_eps;
        let mut h = self.embed_tokens.lookup(tokens)?;
        let mut tapped: Vec<Option<Array>> = vec![None; outputs.taps.len()];
        let mut tapes = Vec::with_capacity(if record { self.layers.len() } else { 0 });
        let queue_every = if record { pipeline_layers() } else { 0 };
        // The next layer's input norm (the final norm after the last), for
        // a MoE block's last kernel to write beside its output where it
        // does (nn/moe.rs, `NEXT_NORM_ENV`); `normed` is then that input.
        let next_norms: Vec<&Norm> = match next_norm_in_combine() {
            true => (self.layers.iter().skip(1).map(|l| &l.input_layernorm))
                .chain([&self.norm])
                .collect(),
            false => Vec::new(),
        };
        let mut normed = None;
        for (index, (layer, state)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let next = next_norms.get(index).map(|n| (&n.weight, eps));
            let (out, out_normed, tape) =
                layer.forward(&h, normed.take(), next, state, record, eps)?;
            h = out;
            normed = out_normed;
            if queue_every > 0 && (index + 1) % queue_every == 0 {
                mlx_rs::transforms::async_eval([&h])?;
            }
            if record {
                tapes.push(tape);
            }
            for (slot, _) in outputs
                .taps
                .iter()
                .enumerate()
                .filter(|(_, &id)| id == index)
            {
                tapped[slot] = Some(h.clone());
            }
        }
        let taps = if outputs.taps.is_empty() {
            None
        } else {
            let tapped: Option<Vec<Array>> = tapped.into_iter().collect();
            let tapped = tapped.ok_or_else(|| {
                ModelError::Mlx(mlx_rs::error::Exception::custom(format!(
                    "tap layer out of range (the model has {} layers)",
                    self.layers.len()
                )))
            })?;
            let refs: Vec<&Array> = tapped.iter().collect();
            let last_axis = tapped[0].ndim() - 1;
            Some(match host::concatenate_ready(&refs, last_axis) {
                Some(joined) => joined,
                None => concatenate(&tapped, -1)?,
            })
        };
        let last = |h: Array| match outputs.last_only && h.shape()[1] > 1 {
            true => h.index((.., -1.., ..)),
            false => h,
        };
        let h = match normed {
            Some(normed) => last(normed),
            None => self.norm.forward(&last(h), eps)?,
        };
        let forward = Forward {
            logits: self.lm_head(&h)?,
            taps,
        };
        Ok((forward, tapes))
    }
}

impl DecoderLayer {
    /// One decoder layer (mlx-lm's `DecoderLayer.__call__`): the mixer (GDN
    /// or attention) and the feed-forward, each pre-normed and residual.
    /// `normed` is `h`'s input norm where the layer before wrote it; `next`
    /// the norm after this layer, for a MoE block to write the same way.
    /// Returns the new hidden states, their `next` norm where written, and,
    /// when `record`, a GDN layer's tape.
    fn forward(
        &self,
        h: &Array,
        normed: Option<Array>,
        next: NextNorm,
        state: &mut LayerCache,
        record: bool,
        eps: f32,
    ) -> Result<(Array, Option<Array>, Option<GdnTape>)> {
        let x = match normed {
            Some(x) => x,
            None => self.input_layernorm.forward(h, eps)?,
        };
        // Each block's output projection adds it onto the residual stream
        // itself where its kernel can (docs/gpu.md, "Fused ends").
        let (mixed, tape) = match (&self.mixer, state) {
            (Mixer::Linear(gdn), LayerCache::Gdn(s)) => {
                gdn.forward_recording(&x, s, record, Some(h))?
            }
            (Mixer::Attention(attn), LayerCache::Kv(kv)) => {
                (attn.forward_onto(&x, kv, Some(h))?, None)
            }
            _ => return Err(mismatched_cache()),
        };
        let norm = &self.post_attention_layernorm;
        let h = mixed.or_add(|out| norm.residual(h, out))?;
        let x = norm.forward(&h, eps)?;
        let (ff, normed) = match &self.feed_forward {
            FeedForward::Dense(mlp) => (mlp.forward_onto(&x, Some(&h))?, None),
            FeedForward::Moe(moe) => moe.forward_onto(&x, Some(&h), next)?,
        };
        Ok((ff.or_add(|out| norm.residual(&h, out))?, normed, tape))
    }
}

impl Tape {
    /// The recorded arrays (to evaluate them with the verify's outputs).
    pub fn arrays(&self) -> Vec<&Array> {
        self.layers
            .iter()
            .flatten()
            .flat_map(GdnTape::arrays)
            .collect()
    }
}

/// What a [`Model::forward`] returns besides the new cache state.
#[derive(Clone, Copy, Debug)]
pub struct Outputs<'a> {
    /// Logits of the last position only (`[B, 1, vocab]`): a prefill then
    /// skips the output head on every other prompt token.
    pub last_only: bool,
    /// Layers (0-based) whose outputs are returned, concatenated in this
    /// order; the taps cover every position either way.
    pub taps: &'a [usize],
}

impl<'a> Outputs<'a> {
    /// Logits at every position, no taps.
    pub const ALL: Outputs<'static> = Outputs {
        last_only: false,
        taps: &[],
    };
    /// Logits at the last position, no taps.
    pub const LAST: Outputs<'static> = Outputs {
        last_only: true,
        taps: &[],
    };

    /// These outputs, with the layers `taps` too.
    pub fn tapping<'b>(self, taps: &'b [usize]) -> Outputs<'b> {
        Outputs {
            last_only: self.last_only,
            taps,
        }
    }
}

/// The outputs of one forward.
pub struct Forward {
    /// `[B, L, vocab]`, or `[B, 1, vocab]` with `last_only`.
    pub logits: Array,
    /// `[B, L, taps.len() * hidden]`; None when no taps were asked for.
    pub taps: Option<Array>,
}

/// The outputs of a verify forward.
pub struct Verified {
    /// `[B, L, vocab]`.
    pub logits: Array,
    /// `[B, L, taps.len() * hidden]`; None when no taps were asked for.
    pub taps: Option<Array>,
    pub tape: Tape,
}

/// Every array a cache holds (to evaluate or measure it).
pub fn cache_arrays(cache: &[LayerCache]) -> Vec<&Array> {
    let mut out = Vec::new();
    for layer in cache {
        match layer {
            LayerCache::Gdn(s) => out.extend(s.arrays()),
            LayerCache::Kv(kv) => out.extend(kv.arrays()),
        }
    }
    out
}

/// Everything [`Model::rollback`] needs from one verify forward.
pub struct Tape {
    /// One entry per layer: the GDN tape, or None for attention (KV is trimmed).
    layers: Vec<Option<GdnTape>>,
    tokens: i32,
}

fn mismatched_cache() -> ModelError {
    ModelError::Mlx(mlx_rs::error::Exception::custom(
        "cache does not belong to this model",
    ))
}

fn hf_layout(checkpoint: &Checkpoint) -> bool {
    is_hf_layout(
        checkpoint
            .tensors
            .iter()
            .map(|(name, info)| (name, info.shape.as_slice())),
    )
}
