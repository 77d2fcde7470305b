//! The published drafter configs of tests/fixtures/drafter_configs (its
//! README says where each was found) parse into what they say: layer kinds,
//! window, causality, taps, mask token and rope.

use flashbar_models::config::Scaling;
use flashbar_models::dflash_config::LayerKind;
use flashbar_models::DrafterConfig;
use std::path::PathBuf;

fn text(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/drafter_configs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse(name: &str) -> DrafterConfig {
    DrafterConfig::parse(&text(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

const FIVE_SLIDING_ONE_FULL: [LayerKind; 6] = [
    LayerKind::Sliding,
    LayerKind::Sliding,
    LayerKind::Sliding,
    LayerKind::Sliding,
    LayerKind::Sliding,
    LayerKind::Full,
];

#[test]
fn z_lab_nested_qwen3_5_drafter() {
    let c = parse("zlab-qwen3.5-nested.json");
    assert_eq!(c.layer_kinds, FIVE_SLIDING_ONE_FULL);
    assert_eq!((c.window(0), c.window(5)), (Some(4096), None));
    // No is_causal: sliding layers causal inside the block, the full one not.
    assert!(c.causal(0) && !c.causal(5));
    assert_eq!(c.target_layer_ids, vec![1, 6, 11, 16, 22, 27, 32, 37]);
    assert_eq!((c.mask_token_id, c.block_size), (248077, 16));
    assert_eq!((c.rope_theta, c.rope_scaling), (1e7, Scaling::Linear(1.0)));
    assert_eq!(
        (c.hidden_size, c.head_dim, c.num_key_value_heads),
        (2048, 128, 8)
    );
}

#[test]
fn z_lab_qwen3_6_27b_drafter() {
    let c = parse("zlab-qwen3.6-27b.assembled.json");
    let mut kinds = vec![LayerKind::Sliding; 4];
    kinds.push(LayerKind::Full);
    assert_eq!(c.layer_kinds, kinds);
    assert_eq!((c.window(3), c.window(4)), (Some(2048), None));
    assert!(c.causal(0) && !c.causal(4));
    assert_eq!(c.target_layer_ids, vec![1, 16, 31, 46, 61]);
    assert_eq!(c.num_target_layers, 64);
    // block_size only at the top level.
    assert_eq!((c.mask_token_id, c.block_size), (248070, 16));
    assert_eq!((c.rope_theta, c.rope_scaling), (1e7, Scaling::Linear(1.0)));
    assert_eq!(
        (c.hidden_size, c.head_dim, c.num_key_value_heads),
        (5120, 128, 8)
    );
}

#[test]
fn z_lab_legacy_qwen3_5_drafter() {
    let c = parse("zlab-qwen3.5-legacy.json");
    assert_eq!(c.layer_kinds, vec![LayerKind::Full; 8]);
    assert_eq!(c.target_layer_ids, vec![1, 10, 19, 28, 37]);
    assert_eq!(
        (c.mask_token_id, c.block_size, c.rope_theta),
        (248070, 16, 1e7)
    );
    assert!(!c.causal(0));
}

#[test]
fn native_six_layer_drafter_without_layer_types() {
    let c = parse("native-2560-6layer.json");
    assert_eq!(c.layer_kinds, vec![LayerKind::Full; 6]);
    assert_eq!(c.is_causal, Some(false));
    assert_eq!(c.target_layer_ids, vec![1, 7, 13, 20, 26, 33, 39, 46]);
    assert_eq!(
        (c.num_target_layers, c.hidden_size, c.head_dim),
        (48, 2560, 128)
    );
    // No rope key at all: the default base.
    assert_eq!(c.rope_theta, 10_000.0);
}

#[test]
fn ornith_drafter() {
    let c = parse("ornith-1.5-35b-a3b.json");
    assert_eq!(c.layer_kinds, FIVE_SLIDING_ONE_FULL);
    assert_eq!(c.window(4), Some(4096));
    assert_eq!(c.rope_theta, 1e7);
    // The quote left out num_target_layers: the taps are given, so it is
    // not needed (taken as one past the last tap).
    assert_eq!(c.num_target_layers, 38);
}

#[test]
fn z_lab_qwen3_6_35b_a3b_drafter() {
    let c = parse("zlab-qwen3.6-35b-a3b.json");
    assert_eq!(c.layer_kinds, vec![LayerKind::Full; 8]);
    assert!(!c.causal(0) && c.window(0).is_none());
    assert_eq!(c.target_layer_ids, vec![1, 10, 19, 28, 37]);
    assert_eq!(
        (c.mask_token_id, c.block_size, c.rope_theta),
        (248070, 16, 1e7)
    );
    // YaRN with `rope_type` and `type` both given (transformers 5 writes both).
    let Scaling::Yarn(y) = c.rope_scaling else {
        panic!("not yarn: {:?}", c.rope_scaling)
    };
    assert_eq!(
        (
            y.factor,
            y.original_max_position_embeddings,
            y.beta_fast,
            y.beta_slow
        ),
        (64.0, 4096.0, 32.0, 1.0)
    );
    // mlx-lm's mscale for factor 64: 0.1 ln 64 + 1.
    assert!((y.input_scale() - 1.415_888_3).abs() < 1e-6);
    assert_eq!((c.hidden_size, c.num_key_value_heads), (2048, 4));
}

#[test]
fn a_drafter_with_published_yarn_rope_parameters() {
    let mut config: serde_json::Value =
        serde_json::from_str(&text("zlab-qwen3.5-nested.json")).unwrap();
    let yarn: serde_json::Value = serde_json::from_str(&text("dspark-yarn-rope.json")).unwrap();
    config["rope_parameters"] = yarn["rope_parameters"].clone();
    let c = DrafterConfig::parse(&config.to_string()).unwrap();
    let Scaling::Yarn(y) = c.rope_scaling else {
        panic!("not yarn: {:?}", c.rope_scaling)
    };
    assert_eq!(
        (y.factor, y.original_max_position_embeddings),
        (32.0, 8192.0)
    );
    assert_eq!((y.beta_fast, y.beta_slow, c.rope_theta), (32.0, 1.0, 1e7));
    // mlx-lm's mscale for factor 32: 0.1 ln 32 + 1.
    assert!((y.input_scale() - 1.346_573_6).abs() < 1e-6);
}
