//! Published target configs (tests/fixtures/target_configs, its README says
//! where each was found) parse into their sizes and rope.

use flashbar_models::config::Scaling;
use flashbar_models::config::{Architecture, ModelConfig};
use std::path::PathBuf;

fn parse(name: &str) -> ModelConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/target_configs")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    ModelConfig::parse(&text).unwrap_or_else(|e| panic!("{name}: {e:?}"))
}

#[test]
fn qwen3_6_27b_config_parses() {
    let c = parse("qwen3.6-27b.json");
    let t = &c.text;
    assert_eq!(
        (t.hidden_size, t.num_hidden_layers, t.vocab_size),
        (5120, 64, 248320)
    );
    assert_eq!(
        (t.head_dim(), t.num_attention_heads, t.num_key_value_heads),
        (256, 24, 4)
    );
    assert_eq!((t.key_dim(), t.value_dim()), (16 * 128, 48 * 128));
    // Every fourth layer is full attention, as layer_types says.
    assert!(t.is_linear_layer(0) && t.is_linear_layer(2) && !t.is_linear_layer(3));
    assert!(!t.is_linear_layer(63));
    // Rope: a quarter of the 256-dim head, theta 1e7, no scaling.
    assert_eq!((c.rope.dims, c.rope.theta), (64, 1e7));
    assert_eq!(c.rope.scaling, Scaling::Linear(1.0));
}

/// unsloth/Qwen3.5-9B's config.json (Qwen3.5-9B's with unsloth's keys): the
/// dense 9B's sizes.
#[test]
fn qwen3_5_9b_config_parses() {
    let c = parse("qwen3.5-9b-unsloth.json");
    let t = &c.text;
    assert_eq!(c.architecture, Architecture::Dense);
    assert_eq!(
        (
            t.hidden_size,
            t.num_hidden_layers,
            t.intermediate_size,
            t.vocab_size
        ),
        (4096, 32, 12288, 248320)
    );
    assert_eq!(
        (t.head_dim(), t.num_attention_heads, t.num_key_value_heads),
        (256, 16, 4)
    );
    assert_eq!((t.key_dim(), t.value_dim()), (16 * 128, 32 * 128));
    assert!(t.is_linear_layer(0) && !t.is_linear_layer(3) && !t.is_linear_layer(31));
    assert_eq!((c.rope.dims, c.rope.theta), (64, 1e7));
    assert!(c.quantization.default.is_none());
}

/// Qwen3.6-35B-A3B's config as assembled from quoted fragments (the
/// README says which): the MoE's sizes.
#[test]
fn qwen3_6_35b_a3b_config_parses() {
    let c = parse("qwen3.6-35b-a3b.assembled.json");
    let t = &c.text;
    assert_eq!(c.architecture, Architecture::Moe);
    assert_eq!(
        (t.hidden_size, t.num_hidden_layers, t.vocab_size),
        (2048, 40, 248320)
    );
    assert_eq!(
        (
            t.num_experts,
            t.num_experts_per_tok,
            t.moe_intermediate_size
        ),
        (256, 8, 512)
    );
    assert_eq!(t.shared_expert_intermediate_size, 512);
    assert_eq!(
        (t.head_dim(), t.num_attention_heads, t.num_key_value_heads),
        (256, 16, 2)
    );
    assert!(!t.is_linear_layer(39));
    assert_eq!((c.rope.dims, c.rope.theta), (64, 1e7));
}
