//! `config.json` of a Qwen3.5 / Qwen3.6 hybrid checkpoint, HF or MLX format.
//!
//! Multimodal checkpoints nest the language model under `text_config`; MLX
//! quantized ones add `quantization` (defaults plus per-module overrides;
//! docs/checkpoints.md has the published layouts).

use crate::error::{ModelError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

mod rope_scaling;
pub use rope_scaling::{Scaling, Yarn};

/// Which of the two hybrid architectures a checkpoint holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Dense,
    Moe,
}

#[derive(Clone, Debug, Deserialize)]
pub struct TextConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub vocab_size: usize,
    pub linear_num_value_heads: usize,
    pub linear_num_key_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    #[serde(default)]
    pub intermediate_size: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_conv_kernel")]
    pub linear_conv_kernel_dim: usize,
    #[serde(default = "default_interval")]
    pub full_attention_interval: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    pub head_dim: Option<usize>,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub num_experts: usize,
    #[serde(default)]
    pub num_experts_per_tok: usize,
    #[serde(default)]
    pub moe_intermediate_size: usize,
    #[serde(default)]
    pub shared_expert_intermediate_size: usize,
    #[serde(default = "default_true")]
    pub norm_topk_prob: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RopeParameters {
    /// `rope_type`; the older `type` stays in `rest` (transformers 5 writes
    /// both, and an alias would reject that as a duplicate field).
    #[serde(default)]
    pub rope_type: Option<String>,
    pub rope_theta: Option<f32>,
    pub partial_rotary_factor: Option<f32>,
    pub factor: Option<f32>,
    /// The other keys (YaRN's `beta_fast`, `original_max_position_embeddings`...).
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// Affine quantization of one module: `group_size` weights share a scale and bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct QuantParams {
    pub group_size: usize,
    pub bits: usize,
}

/// MLX `quantization`: defaults, and per-module overrides (or `false`).
#[derive(Clone, Debug, Default)]
pub struct Quantization {
    pub default: Option<QuantParams>,
    pub overrides: BTreeMap<String, Option<QuantParams>>,
}

impl Quantization {
    /// The quantization of the module at `path` (a normalized module path).
    pub fn for_module(&self, path: &str) -> Option<QuantParams> {
        match self.overrides.get(path) {
            Some(params) => *params,
            None => self.default,
        }
    }
}

/// The rotary embedding as mlx-lm builds it: partial, non-traditional.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub dims: usize,
    pub theta: f32,
    /// Position scaling: linear (1 = none) or YaRN (`nn::rope`).
    pub scaling: Scaling,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub text: TextConfig,
    pub quantization: Quantization,
    pub rope: Rope,
}

impl TextConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Layer `i` is full attention every `full_attention_interval` layers.
    pub fn is_linear_layer(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.full_attention_interval)
    }

    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Channels of the GDN short convolution: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

impl ModelConfig {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|error| ModelError::Io {
            path: path.clone(),
            error,
        })?;
        Self::parse(&text).map_err(|reason| match reason {
            ParseError::ModelType(t) => ModelError::UnknownModelType(t),
            ParseError::Invalid(reason) => ModelError::Config { path, reason },
        })
    }

    pub fn parse(json: &str) -> Result<Self, ParseError> {
        let root: serde_json::Value =
            serde_json::from_str(json).map_err(|e| ParseError::Invalid(e.to_string()))?;
        let model_type = root
            .get("model_type")
            .and_then(|v| v.as_str())
            .ok_or_else(|| ParseError::Invalid("missing field `model_type`".into()))?;
        let architecture = match model_type {
            "qwen3_5" | "qwen3_5_text" => Architecture::Dense,
            "qwen3_5_moe" | "qwen3_5_moe_text" => Architecture::Moe,
            other => return Err(ParseError::ModelType(other.to_owned())),
        };
        let text_value = root.get("text_config").unwrap_or(&root).clone();
        let text: TextConfig =
            serde_json::from_value(text_value).map_err(|e| ParseError::Invalid(e.to_string()))?;
        text.check(architecture).map_err(ParseError::Invalid)?;
        let quantization = parse_quantization(&root).map_err(ParseError::Invalid)?;
        let rope = rope_of(&text).map_err(ParseError::Invalid)?;
        Ok(ModelConfig {
            architecture,
            text,
            quantization,
            rope,
        })
    }
}

#[derive(Debug)]
pub enum ParseError {
    ModelType(String),
    Invalid(String),
}

/// The first of `fields` that is zero, as a config error.
pub(crate) fn require_positive(fields: &[(&str, usize)]) -> Result<(), String> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(format!("`{name}` must be positive")),
        None => Ok(()),
    }
}

/// Most layers a config may declare (real checkpoints have under 100):
/// loading walks every layer, so a huge count must not get that far.
pub(crate) const MAX_LAYERS: usize = 1024;
/// Largest width, head count, head size or vocabulary a config may declare;
/// it keeps every derived size (products of a few of them) far from
/// overflowing.
pub(crate) const MAX_SIZE: usize = 1 << 24;

/// The first of `fields` over `max`, as a config error.
pub(crate) fn require_at_most(fields: &[(&str, usize)], max: usize) -> Result<(), String> {
    match fields.iter().find(|(_, v)| *v > max) {
        Some((name, value)) => Err(format!("`{name}` is {value}, more than {max}")),
        None => Ok(()),
    }
}

/// A float setting that must be finite and positive (or zero, `zero_ok`).
pub(crate) fn require_finite(name: &str, value: f32, zero_ok: bool) -> Result<(), String> {
    if value.is_finite() && (value > 0.0 || (zero_ok && value == 0.0)) {
        Ok(())
    } else {
        Err(format!(
            "`{name}` must be a finite positive number, got {value}"
        ))
    }
}

/// Attention heads must share KV heads evenly.
pub(crate) fn require_multiple(
    (heads, h): (&str, usize),
    (kv_heads, kv): (&str, usize),
) -> Result<(), String> {
    if kv == 0 || !h.is_multiple_of(kv) {
        return Err(format!("{heads} must be a multiple of {kv_heads}"));
    }
    Ok(())
}

impl TextConfig {
    fn check(&self, architecture: Architecture) -> Result<(), String> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("vocab_size", self.vocab_size),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("full_attention_interval", self.full_attention_interval),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
        ];
        require_positive(&positive)?;
        require_positive(&[("head_dim", self.head_dim())])?;
        require_at_most(&[("num_hidden_layers", self.num_hidden_layers)], MAX_LAYERS)?;
        require_at_most(
            &[
                ("hidden_size", self.hidden_size),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
                ("vocab_size", self.vocab_size),
                ("linear_num_key_heads", self.linear_num_key_heads),
                ("linear_num_value_heads", self.linear_num_value_heads),
                ("linear_key_head_dim", self.linear_key_head_dim),
                ("linear_value_head_dim", self.linear_value_head_dim),
                ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
                ("full_attention_interval", self.full_attention_interval),
                ("intermediate_size", self.intermediate_size),
                ("head_dim", self.head_dim.unwrap_or(0)),
                ("max_position_embeddings", self.max_position_embeddings),
                ("num_experts", self.num_experts),
                ("num_experts_per_tok", self.num_experts_per_tok),
                ("moe_intermediate_size", self.moe_intermediate_size),
                (
                    "shared_expert_intermediate_size",
                    self.shared_expert_intermediate_size,
                ),
            ],
            MAX_SIZE,
        )?;
        require_finite("rms_norm_eps", self.rms_norm_eps, true)?;
        require_multiple(
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_num_key_heads", self.linear_num_key_heads),
        )?;
        require_multiple(
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        )?;
        match architecture {
            Architecture::Dense if self.intermediate_size == 0 => {
                Err("missing field `intermediate_size`".into())
            }
            Architecture::Moe
                if self.num_experts == 0
                    || self.num_experts_per_tok == 0
                    || self.num_experts_per_tok > self.num_experts
                    || self.moe_intermediate_size == 0 =>
            {
                Err("an MoE config needs num_experts >= num_experts_per_tok > 0 and moe_intermediate_size".into())
            }
            _ => Ok(()),
        }
    }
}

fn rope_of(text: &TextConfig) -> Result<Rope, String> {
    let params = text.rope_parameters.clone().unwrap_or(RopeParameters {
        rope_type: None,
        rope_theta: None,
        partial_rotary_factor: None,
        factor: None,
        rest: Default::default(),
    });
    let factor = params.partial_rotary_factor.unwrap_or(0.25);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(format!(
            "`partial_rotary_factor` must be in (0, 1], got {factor}"
        ));
    }
    let dims = (text.head_dim() as f32 * factor) as usize;
    let mut object = params.rest.clone();
    let mut put = |key: &str, value: serde_json::Value| {
        object.insert(key.to_owned(), value);
    };
    if let Some(t) = &params.rope_type {
        put("rope_type", t.clone().into());
    }
    if let Some(f) = params.factor {
        put("factor", f.into());
    }
    let scaling = Scaling::parse(Some(&serde_json::Value::Object(object)))?;
    let theta = params.rope_theta.unwrap_or(100_000.0);
    require_finite("rope_theta", theta, false)?;
    Ok(Rope {
        dims,
        theta,
        scaling,
    })
}

pub(crate) fn parse_quantization(root: &serde_json::Value) -> Result<Quantization, String> {
    let Some(value) = root
        .get("quantization")
        .or_else(|| root.get("quantization_config"))
    else {
        return Ok(Quantization::default());
    };
    let object = value
        .as_object()
        .ok_or("`quantization` must be an object")?;
    let default = match (object.get("group_size"), object.get("bits")) {
        (Some(g), Some(b)) => Some(QuantParams {
            group_size: g
                .as_u64()
                .ok_or("quantization.group_size must be a number")?
                as usize,
            bits: b.as_u64().ok_or("quantization.bits must be a number")? as usize,
        }),
        _ => None,
    };
    if let Some(mode) = object.get("mode").and_then(|m| m.as_str()) {
        if mode != "affine" {
            return Err(format!("unsupported quantization mode {mode:?} (affine)"));
        }
    }
    let mut overrides = BTreeMap::new();
    for (key, entry) in object {
        // An mlx-vlm conversion may list its vision tower's modules; they
        // are not loaded (checkpoint.rs), so their settings do not matter.
        if crate::checkpoint::skipped_part(key).is_some() {
            continue;
        }
        let params = match entry {
            serde_json::Value::Bool(false) => None,
            serde_json::Value::Object(_) => Some(
                serde_json::from_value::<QuantParams>(entry.clone())
                    .map_err(|e| format!("quantization[{key:?}]: {e}"))?,
            ),
            _ => continue,
        };
        overrides.insert(crate::checkpoint::normalize_name(key), params);
    }
    for params in default.iter().chain(overrides.values().flatten()) {
        if ![2, 3, 4, 5, 6, 8].contains(&params.bits) || params.group_size == 0 {
            return Err(format!("unsupported quantization {params:?}"));
        }
    }
    Ok(Quantization { default, overrides })
}

fn default_eps() -> f32 {
    1e-6
}
fn default_conv_kernel() -> usize {
    4
}
fn default_interval() -> usize {
    4
}
fn default_max_positions() -> usize {
    131_072
}
fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded default target's config, its `text_config` edited.
    fn with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<ModelConfig, ParseError> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/default/target/config.json"
        );
        let mut value: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        edit(&mut value["text_config"]);
        ModelConfig::parse(&value.to_string())
    }

    fn reason(result: Result<ModelConfig, ParseError>) -> String {
        match result {
            Err(ParseError::Invalid(reason)) => reason,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn the_default_config_parses() {
        assert!(with(|_| {}).is_ok());
    }

    #[test]
    fn sizes_that_would_run_away_are_refused() {
        // Loading walks every layer and multiplies sizes: bound them first.
        let r = reason(with(|v| v["num_hidden_layers"] = 100_000_000_000u64.into()));
        assert!(r.contains("num_hidden_layers"), "{r}");
        let r = reason(with(|v| v["linear_key_head_dim"] = (1u64 << 40).into()));
        assert!(r.contains("linear_key_head_dim"), "{r}");
        let r = reason(with(|v| v["head_dim"] = 0.into()));
        assert!(r.contains("head_dim"), "{r}");
    }

    /// The `quantization` entries of modules the loader skips (an mlx-vlm
    /// vision tower, an MTP head) are not read; a text module's still are.
    #[test]
    fn quantization_entries_of_skipped_modules_are_not_read() {
        let parse = |key: &str| {
            let mut value: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../models/default/target/config.json"
                ))
                .unwrap(),
            )
            .unwrap();
            value["quantization"] = serde_json::json!({
                "group_size": 64, "bits": 4, "mode": "affine",
                key: {"group_size": 64, "bits": 7}
            });
            ModelConfig::parse(&value.to_string())
        };
        for skipped in ["vision_tower.blocks.0.attn.qkv", "language_model.mtp.fc"] {
            let config = parse(skipped).unwrap();
            assert!(config.quantization.overrides.is_empty(), "{skipped}");
        }
        let r = reason(parse("language_model.model.layers.0.mlp.gate"));
        assert!(r.contains("unsupported quantization"), "{r}");
    }

    #[test]
    fn bad_rope_and_norm_numbers_are_refused() {
        let r = reason(with(|v| {
            v["rope_parameters"] = serde_json::json!({"partial_rotary_factor": 4.0})
        }));
        assert!(r.contains("partial_rotary_factor"), "{r}");
        let r = reason(with(|v| {
            v["rope_parameters"] = serde_json::json!({"rope_type": "linear", "factor": 0.0})
        }));
        assert!(r.contains("factor"), "{r}");
        let r = reason(with(|v| v["rms_norm_eps"] = (-1.0).into()));
        assert!(r.contains("rms_norm_eps"), "{r}");
    }

    /// transformers 5 writes a rope block with both `rope_type` and the
    /// older `type` (as in z-lab's Qwen3.6 drafter config, re-saved by it):
    /// both keys are read, neither is a duplicate field.
    #[test]
    fn rope_parameters_with_both_type_keys() {
        let config = with(|v| {
            v["rope_parameters"] = serde_json::json!({
                "rope_type": "yarn", "type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 4096, "rope_theta": 1e7,
                "partial_rotary_factor": 0.25
            })
        })
        .unwrap();
        assert!(matches!(config.rope.scaling, Scaling::Yarn(y) if y.factor == 4.0));
        let config =
            with(|v| v["rope_parameters"] = serde_json::json!({"type": "linear", "factor": 2.0}))
                .unwrap();
        assert_eq!(config.rope.scaling, Scaling::Linear(0.5));
    }
}
