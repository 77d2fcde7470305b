//! Qwen3.5 / Qwen3.6 hybrid decoder (mlx-lm `models/qwen3_5.py`): Gated
//! DeltaNet layers with full attention every `full_attention_interval`
//! layers, each followed by a SwiGLU MLP (dense) or a sparse MoE block.

use crate::checkpoint::Checkpoint;
use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::nn::attention::{Attention, KvCache};
use crate::nn::gated_delta::{GatedDeltaNet, GdnState, GdnTape};
use crate::nn::linear::{Embedding, Linear, Weights};
use crate::nn::mlp::Mlp;
use crate::nn::moe::SparseMoe;
use crate::qwen3_5_moe;
use crate::spec::{self, Header};
use mlx_rs::fast::rms_norm;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

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
    input_layernorm: Array,
    post_attention_layernorm: Array,
}

pub struct Model {
    config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: Array,
    lm_head: Option<Linear>,
}

impl Model {
    /// Loads a checkpoint folder (HF or MLX format), validating every tensor
    /// against the config before any is read.
    pub fn load(dir: &Path) -> Result<Self> {
        let (config, checkpoint) = Self::check(dir)?;
        let hf_layout = is_hf_layout(&checkpoint);
        let arrays = sanitize(&config, checkpoint.load()?, hf_layout)?;
        Self::from_arrays(config, arrays)
    }

    /// Everything [`Model::load`] checks, without reading any tensor data:
    /// the config, and every tensor's name, dtype and shape.
    pub fn check(dir: &Path) -> Result<(ModelConfig, Checkpoint)> {
        let config = ModelConfig::load(dir)?;
        let checkpoint = Checkpoint::open(dir)?;
        let hf_layout = is_hf_layout(&checkpoint);
        spec::check(&config, &sanitize_headers(&config, &checkpoint, hf_layout))?;
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
                input_layernorm: weights.take(&format!("{p}.input_layernorm.weight"))?,
                post_attention_layernorm: weights
                    .take(&format!("{p}.post_attention_layernorm.weight"))?,
            });
        }
        let norm = weights.take("model.norm.weight")?;
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

    /// Logits `[B, L, vocab]` for `tokens` `[B, L]`, continuing from `cache`.
    pub fn forward(&self, tokens: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        Ok(self.run(tokens, cache, &[], Logits::All, false)?.logits)
    }

    /// [`Model::forward`] with the logits of the last position only
    /// (`[B, 1, vocab]`): a prefill then skips the output head on every other
    /// prompt token.
    pub fn forward_last(&self, tokens: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        Ok(self.run(tokens, cache, &[], Logits::Last, false)?.logits)
    }

    /// [`Model::forward`], also returning the outputs of the layers `taps`
    /// (0-based), concatenated in that order: `[B, L, taps.len() * hidden]`.
    pub fn forward_with_taps(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        taps: &[usize],
    ) -> Result<(Array, Array)> {
        let out = self.run(tokens, cache, taps, Logits::All, false)?;
        Ok((out.logits, out.taps.expect("taps requested")))
    }

    /// [`Model::forward_with_taps`] with the logits of the last position
    /// only; the taps still cover every position.
    pub fn forward_last_with_taps(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        taps: &[usize],
    ) -> Result<(Array, Array)> {
        let out = self.run(tokens, cache, taps, Logits::Last, false)?;
        Ok((out.logits, out.taps.expect("taps requested")))
    }

    /// The verify forward of a drafted block: logits, taps, and the tape that
    /// lets [`Model::rollback`] keep any prefix of the block.
    pub fn verify(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        taps: &[usize],
    ) -> Result<(Array, Array, Tape)> {
        let out = self.run(tokens, cache, taps, Logits::All, true)?;
        let tape = Tape {
            layers: out.tapes,
            tokens: tokens.shape()[1],
        };
        Ok((out.logits, out.taps.expect("taps requested"), tape))
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

    fn run(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        taps: &[usize],
        logits: Logits,
        record: bool,
    ) -> Result<RunOutput> {
        let eps = self.config.text.rms_norm_eps;
        let mut h = self.embed_tokens.lookup(tokens)?;
        let mut tapped: Vec<Option<Array>> = vec![None; taps.len()];
        let mut tapes = Vec::with_capacity(if record { self.layers.len() } else { 0 });
        for (index, (layer, state)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let x = rms_norm(&h, Some(&layer.input_layernorm), eps)?;
            let mixed = match (&layer.mixer, state) {
                (Mixer::Linear(gdn), LayerCache::Gdn(s)) => {
                    let (out, tape) = gdn.forward_recording(&x, s, record)?;
                    if record {
                        tapes.push(tape);
                    }
                    out
                }
                (Mixer::Attention(attn), LayerCache::Kv(kv)) => {
                    if record {
                        tapes.push(None);
                    }
                    attn.forward(&x, kv)?
                }
                _ => return Err(mismatched_cache()),
            };
            h = h.add(mixed)?;
            let x = rms_norm(&h, Some(&layer.post_attention_layernorm), eps)?;
            let ff = match &layer.feed_forward {
                FeedForward::Dense(mlp) => mlp.forward(&x)?,
                FeedForward::Moe(moe) => moe.forward(&x)?,
            };
            h = h.add(ff)?;
            for (slot, _) in taps.iter().enumerate().filter(|(_, &id)| id == index) {
                tapped[slot] = Some(h.clone());
            }
        }
        let taps = if taps.is_empty() {
            None
        } else {
            let tapped: Option<Vec<Array>> = tapped.into_iter().collect();
            let tapped = tapped.ok_or_else(|| {
                ModelError::Mlx(mlx_rs::error::Exception::custom(format!(
                    "tap layer out of range (the model has {} layers)",
                    self.layers.len()
                )))
            })?;
            Some(concatenate(&tapped, -1)?)
        };
        let h = match logits {
            Logits::All => h,
            Logits::Last => h.index((.., -1.., ..)),
        };
        let h = rms_norm(&h, Some(&self.norm), eps)?;
        Ok(RunOutput {
            logits: self.lm_head(&h)?,
            taps,
            tapes,
        })
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

/// Which positions [`Model::run`] computes logits for.
#[derive(Clone, Copy)]
enum Logits {
    All,
    Last,
}

struct RunOutput {
    logits: Array,
    taps: Option<Array>,
    tapes: Vec<Option<GdnTape>>,
}

/// Every array a cache holds (to evaluate or measure it).
pub fn cache_arrays(cache: &[LayerCache]) -> Vec<&Array> {
    let mut out = Vec::new();
    for layer in cache {
        let (a, b) = match layer {
            LayerCache::Gdn(s) => (&s.conv, &s.ssm),
            LayerCache::Kv(kv) => (&kv.keys, &kv.values),
        };
        out.extend(a.iter().chain(b.iter()));
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

/// HF checkpoints store the conv kernel as `[C, 1, K]`; MLX ones as `[C, K, 1]`.
fn is_hf_layout(checkpoint: &Checkpoint) -> bool {
    checkpoint
        .tensors
        .iter()
        .any(|(name, t)| name.ends_with("conv1d.weight") && t.shape.last() != Some(&1))
}

/// Norm weights HF stores zero-centred (mlx-lm adds 1 when converting).
const SHIFTED_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// The headers as they will look after [`sanitize`]: names and shapes only.
fn sanitize_headers(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
    hf_layout: bool,
) -> BTreeMap<String, Header> {
    let mut headers = BTreeMap::new();
    for (name, info) in &checkpoint.tensors {
        if config.text.tie_word_embeddings && name.starts_with("lm_head.") {
            continue;
        }
        let mut shape = info.shape.clone();
        if hf_layout && name.ends_with("conv1d.weight") && shape.len() == 3 {
            shape.swap(1, 2);
        }
        headers.insert(
            name.clone(),
            Header {
                dtype: info.dtype.clone(),
                shape,
            },
        );
    }
    if config.architecture == Architecture::Moe {
        qwen3_5_moe::split_fused_expert_headers(&mut headers);
    }
    headers
}

/// mlx-lm's `sanitize`: conv kernels to MLX layout and +1 on the shifted norms
/// (HF only), tied heads dropped, fused MoE experts split.
fn sanitize(
    config: &ModelConfig,
    mut arrays: HashMap<String, Array>,
    hf_layout: bool,
) -> Result<HashMap<String, Array>> {
    if config.text.tie_word_embeddings {
        arrays.retain(|name, _| !name.starts_with("lm_head."));
    }
    if hf_layout {
        for (name, array) in arrays.iter_mut() {
            if name.ends_with("conv1d.weight") && array.ndim() == 3 {
                *array = array.swap_axes(1, 2)?;
            } else if array.ndim() == 1 && SHIFTED_NORMS.iter().any(|s| name.ends_with(s)) {
                *array = array.add(Array::from_f32(1.0))?.as_dtype(array.dtype())?;
            }
        }
    }
    if config.architecture == Architecture::Moe {
        qwen3_5_moe::split_fused_experts(&mut arrays)?;
    }
    Ok(arrays)
}
