//! A DFlash drafter's `config.json` (z-lab format; modal-labs checkpoints use
//! the same keys), and the checks that it fits a target.

use crate::config::Scaling;
use crate::config::{
    require_at_most, require_finite, require_multiple, require_positive, ModelConfig, QuantParams,
    Quantization, MAX_LAYERS, MAX_SIZE,
};
use crate::error::{ModelError, Result};
use serde::Deserialize;
use std::path::Path;

/// Attention span of one drafter layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Full,
    /// Sees the last `window` context positions (absolute positions).
    Sliding,
}

#[derive(Clone, Debug)]
pub struct DrafterConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    /// Position scaling: linear (1 = none) or YaRN (`nn::rope`).
    pub rope_scaling: Scaling,
    pub block_size: usize,
    pub num_target_layers: usize,
    /// Target layers whose outputs feed the drafter, in concatenation order.
    pub target_layer_ids: Vec<usize>,
    pub mask_token_id: u32,
    pub layer_kinds: Vec<LayerKind>,
    pub sliding_window: Option<usize>,
    /// `None`: sliding layers are causal inside the block, full ones are not.
    pub is_causal: Option<bool>,
    pub input_embedding_scale: f32,
    pub output_multiplier: f32,
    pub final_logit_softcapping: Option<f32>,
    /// The latest committed positions the drafter attends to (None: all):
    /// `dflash_config.context_window`, a Flashbar key for drafters trained
    /// on short sequences, whose drafts fall apart past the context lengths
    /// they were trained on (docs/acceptance.md, "Long contexts").
    pub context_window: Option<usize>,
    pub quantization: Quantization,
}

/// The keys as they appear in config.json.
#[derive(Deserialize)]
struct RawConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    rope_theta: Option<f32>,
    rope_scaling: Option<RawRope>,
    rope_parameters: Option<RawRope>,
    block_size: Option<usize>,
    /// Only needed when `dflash_config.target_layer_ids` is absent.
    num_target_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window: Option<usize>,
    is_causal: Option<bool>,
    final_logit_softcapping: Option<f32>,
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    dflash_config: RawDflash,
}

#[derive(Deserialize, Default)]
struct RawDflash {
    target_layer_ids: Option<Vec<usize>>,
    mask_token_id: Option<u32>,
    block_size: Option<usize>,
    input_embedding_scale: Option<f32>,
    output_multiplier: Option<f32>,
    final_logit_softcapping: Option<f32>,
    context_window: Option<usize>,
    #[serde(default)]
    conv_kernel_size: usize,
    #[serde(default)]
    selector_rank: usize,
}

#[derive(Deserialize, Clone)]
struct RawRope {
    rope_theta: Option<f32>,
}

impl DrafterConfig {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|error| ModelError::Io {
            path: path.clone(),
            error,
        })?;
        Self::parse(&text).map_err(|reason| ModelError::Config { path, reason })
    }

    pub fn parse(json: &str) -> Result<Self, String> {
        let raw: RawConfig = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let d = &raw.dflash_config;
        if raw.architectures.iter().any(|a| a == "DFlash2DraftModel")
            || d.conv_kernel_size > 0
            || d.selector_rank > 0
        {
            return Err(
                "DFlash2 drafters (dynamic convolutions, candidate selector) are not supported"
                    .into(),
            );
        }
        let positive = [
            ("hidden_size", raw.hidden_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("num_key_value_heads", raw.num_key_value_heads),
            ("vocab_size", raw.vocab_size),
            ("num_target_layers", raw.num_target_layers.unwrap_or(1)),
        ];
        require_positive(&positive)?;
        require_positive(&[("head_dim", raw.head_dim.unwrap_or(1))])?;
        // Layer lists are built from these counts: bound them first.
        require_at_most(
            &[
                ("num_hidden_layers", raw.num_hidden_layers),
                ("num_target_layers", raw.num_target_layers.unwrap_or(0)),
            ],
            MAX_LAYERS,
        )?;
        require_at_most(
            &[
                ("hidden_size", raw.hidden_size),
                ("num_attention_heads", raw.num_attention_heads),
                ("num_key_value_heads", raw.num_key_value_heads),
                ("head_dim", raw.head_dim.unwrap_or(0)),
                ("intermediate_size", raw.intermediate_size),
                ("vocab_size", raw.vocab_size),
            ],
            MAX_SIZE,
        )?;
        require_finite("rms_norm_eps", raw.rms_norm_eps, true)?;
        require_multiple(
            ("num_attention_heads", raw.num_attention_heads),
            ("num_key_value_heads", raw.num_key_value_heads),
        )?;
        let rope = raw.rope_parameters.clone().or(raw.rope_scaling.clone());
        let root: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let rope_scaling = Scaling::parse(
            root.get("rope_parameters")
                .filter(|v| !v.is_null())
                .or(root.get("rope_scaling")),
        )?;
        let layer_kinds = match &raw.layer_types {
            None => vec![LayerKind::Full; raw.num_hidden_layers],
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(LayerKind::Full),
                    "sliding_attention" => Ok(LayerKind::Sliding),
                    other => Err(format!("unsupported layer type {other:?}")),
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        if layer_kinds.len() != raw.num_hidden_layers {
            return Err("layer_types must have one entry per layer".into());
        }
        if layer_kinds.contains(&LayerKind::Sliding) && raw.sliding_window.unwrap_or(0) < 2 {
            return Err("sliding_attention layers need a sliding_window of at least 2".into());
        }
        let block_size = d.block_size.or(raw.block_size).unwrap_or(16);
        if block_size < 2 {
            return Err(format!("block_size must be at least 2, got {block_size}"));
        }
        let target_layer_ids = match (&d.target_layer_ids, raw.num_target_layers) {
            (Some(ids), _) => ids.clone(),
            (None, Some(layers)) => default_taps(layers, raw.num_hidden_layers),
            (None, None) => {
                return Err("dflash_config.target_layer_ids or num_target_layers is needed".into())
            }
        };
        if target_layer_ids.is_empty() {
            return Err("dflash_config.target_layer_ids is empty".into());
        }
        if d.context_window == Some(0) {
            return Err("dflash_config.context_window must be at least 1".into());
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads);
        require_positive(&[("head_dim", head_dim)])?;
        let rope_theta = raw
            .rope_theta
            .or(rope.as_ref().and_then(|r| r.rope_theta))
            .unwrap_or(10_000.0);
        require_finite("rope_theta", rope_theta, false)?;
        let input_embedding_scale = d.input_embedding_scale.unwrap_or(1.0);
        let output_multiplier = d.output_multiplier.unwrap_or(1.0);
        if !input_embedding_scale.is_finite() || !output_multiplier.is_finite() {
            return Err("input_embedding_scale and output_multiplier must be finite".into());
        }
        // Absent (configs trimmed of it): at least one past the last tap.
        let num_target_layers = raw
            .num_target_layers
            .unwrap_or(target_layer_ids.iter().max().map_or(0, |m| m + 1));
        Ok(DrafterConfig {
            head_dim,
            hidden_size: raw.hidden_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads,
            intermediate_size: raw.intermediate_size,
            vocab_size: raw.vocab_size,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling,
            block_size,
            num_target_layers,
            target_layer_ids,
            mask_token_id: d
                .mask_token_id
                .ok_or("dflash_config.mask_token_id is missing")?,
            layer_kinds,
            sliding_window: raw.sliding_window,
            is_causal: raw.is_causal,
            input_embedding_scale,
            output_multiplier,
            final_logit_softcapping: d
                .final_logit_softcapping
                .or(raw.final_logit_softcapping)
                .filter(|c| *c > 0.0),
            context_window: d.context_window,
            quantization: crate::config::parse_quantization(&root)?,
        })
    }

    /// Every reason this drafter cannot serve `target`, or Ok.
    pub fn check_target(&self, target: &ModelConfig) -> Result<(), String> {
        let t = &target.text;
        let mut problems = Vec::new();
        if self.hidden_size != t.hidden_size {
            problems.push(format!(
                "hidden size {} != the target's {}",
                self.hidden_size, t.hidden_size
            ));
        }
        if self.vocab_size != t.vocab_size {
            problems.push(format!(
                "vocab {} != the target's {}",
                self.vocab_size, t.vocab_size
            ));
        }
        if let Some(bad) = self
            .target_layer_ids
            .iter()
            .find(|&&id| id >= t.num_hidden_layers)
        {
            problems.push(format!(
                "tap layer {bad} does not exist (the target has {} layers)",
                t.num_hidden_layers
            ));
        }
        if self.mask_token_id as usize >= t.vocab_size {
            problems.push(format!(
                "mask token {} is outside the target's vocab of {}",
                self.mask_token_id, t.vocab_size
            ));
        }
        if self.block_size > 64 {
            problems.push(format!("block size {} is larger than 64", self.block_size));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// The attention span of layer `i` (None = all context).
    pub fn window(&self, layer: usize) -> Option<usize> {
        match self.layer_kinds[layer] {
            LayerKind::Full => None,
            LayerKind::Sliding => self.sliding_window,
        }
    }

    /// Whether block positions of layer `i` see only earlier block positions.
    pub fn causal(&self, layer: usize) -> bool {
        self.is_causal
            .unwrap_or(self.layer_kinds[layer] == LayerKind::Sliding)
    }

    pub fn quant_of(&self, module: &str) -> Option<QuantParams> {
        self.quantization.for_module(module)
    }
}

/// z-lab's default taps for `draft_layers` drafter layers over `target_layers`:
/// round(1 + i (L - 4) / (n - 1)).
pub fn default_taps(target_layers: usize, draft_layers: usize) -> Vec<usize> {
    if draft_layers <= 1 {
        return vec![target_layers / 2];
    }
    let span = target_layers.saturating_sub(4) as f64;
    (0..draft_layers)
        .map(|i| (1.0 + i as f64 * span / (draft_layers - 1) as f64).round() as usize)
        .collect()
}

fn default_eps() -> f32 {
    1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 4096,
        "block_size": 16, "num_target_layers": 4,
        "dflash_config": {"target_layer_ids": [0, 2, 3], "mask_token_id": 3}}"#;

    fn with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<DrafterConfig, String> {
        let mut value: serde_json::Value = serde_json::from_str(BASE).unwrap();
        edit(&mut value);
        DrafterConfig::parse(&value.to_string())
    }

    #[test]
    fn parses_the_z_lab_format() {
        let c = DrafterConfig::parse(BASE).unwrap();
        assert_eq!(c.target_layer_ids, vec![0, 2, 3]);
        assert_eq!((c.mask_token_id, c.block_size, c.head_dim), (3, 16, 16));
        assert_eq!(c.layer_kinds, vec![LayerKind::Full; 2]);
        assert!(!c.causal(0));
        assert_eq!(c.rope_scaling, Scaling::Linear(1.0));
    }

    /// Flashbar's `context_window`: absent is all, 0 is refused.
    #[test]
    fn context_window() {
        assert_eq!(DrafterConfig::parse(BASE).unwrap().context_window, None);
        let c = with(|v| v["dflash_config"]["context_window"] = 240.into()).unwrap();
        assert_eq!(c.context_window, Some(240));
        let e = with(|v| v["dflash_config"]["context_window"] = 0.into()).unwrap_err();
        assert!(e.contains("context_window must be at least 1"), "{e}");
    }

    #[test]
    fn sliding_layers_and_rope_scaling() {
        let c = with(|v| {
            v["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"]);
            v["sliding_window"] = 6.into();
            v["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
        })
        .unwrap();
        assert_eq!((c.window(0), c.window(1)), (Some(6), None));
        assert!(c.causal(0) && !c.causal(1));
        assert_eq!(c.rope_scaling, Scaling::Linear(0.5));
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let err =
            with(|v| v["rope_scaling"] = serde_json::json!({"type": "dynamic", "factor": 4.0}));
        assert!(err.unwrap_err().contains("dynamic"));
        let err = with(|v| v["dflash_config"]["conv_kernel_size"] = 4.into());
        assert!(err.unwrap_err().contains("DFlash2"));
        let err =
            with(|v| v["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"]));
        assert!(err.unwrap_err().contains("sliding_window"));
        let err = with(|v| v["dflash_config"] = serde_json::json!({"target_layer_ids": [1]}));
        assert!(err.unwrap_err().contains("mask_token_id"));
        let err = with(|v| {
            v.as_object_mut().unwrap().remove("num_target_layers");
            v["dflash_config"] = serde_json::json!({"mask_token_id": 3});
        });
        assert!(err.unwrap_err().contains("num_target_layers is needed"));
    }

    #[test]
    fn huge_counts_and_bad_numbers_are_refused_before_allocating() {
        // Found by review for the config fuzz target: a layer list of this
        // length used to be allocated (and abort) before any check.
        let err = with(|v| v["num_hidden_layers"] = 1_000_000_000_000u64.into());
        assert!(err.unwrap_err().contains("num_hidden_layers"));
        let err = with(|v| {
            v["num_target_layers"] = 1_000_000_000_000u64.into();
            v["dflash_config"]
                .as_object_mut()
                .unwrap()
                .remove("target_layer_ids");
        });
        assert!(err.unwrap_err().contains("num_target_layers"));
        let err = with(|v| v["head_dim"] = 0.into());
        assert!(err.unwrap_err().contains("head_dim"));
        let err = with(|v| v["rope_theta"] = (-1.0).into());
        assert!(err.unwrap_err().contains("rope_theta"));
    }

    #[test]
    fn default_taps_follow_z_lab() {
        assert_eq!(default_taps(32, 5), vec![1, 8, 15, 22, 29]);
        assert_eq!(default_taps(40, 5), vec![1, 10, 19, 28, 37]);
    }
}
