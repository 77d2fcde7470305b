//! The DFlash drafter computes what z-lab's `dflash` MLX code computes on the
//! same random real-format drafter + target (f32 within 1e-4; the taps it
//! reads from the target too), incompatible pairs are refused with the
//! reason, and a verify + rollback leaves exactly the state of feeding only
//! the accepted prefix (bit-identical on CPU).

mod common;

use common::{fixture, host_f32, max_abs_diff, reference};
use flashbar_models::{Drafter, LayerCache, Model, ModelError, Outputs};
use mlx_rs::Array;

const TOLERANCE: f32 = 1e-4;

fn draft_logits_match(drafter_name: &str, target_name: &str) {
    let target = Model::load(&fixture(target_name)).unwrap();
    let drafter = Drafter::load(&fixture(drafter_name), &target).unwrap();
    let r = reference(drafter_name);
    let taps = &drafter.config().target_layer_ids;

    let tokens = r["tokens"].reshape(&[1, -1]).unwrap();
    let mut cache = target.new_cache();
    let target_taps = target
        .forward(&tokens, &mut cache, Outputs::ALL.tapping(taps))
        .unwrap()
        .taps
        .unwrap();
    let tap_diff = max_abs_diff(&target_taps, &r["taps_1"]);
    assert!(
        tap_diff <= TOLERANCE,
        "{drafter_name}: taps differ by {tap_diff}"
    );

    let mut draft_cache = drafter.new_cache();
    for round in ["1", "2"] {
        let logits = drafter
            .forward(
                &target,
                &r[&format!("block_{round}")],
                &r[&format!("taps_{round}")],
                &mut draft_cache,
            )
            .unwrap();
        let diff = max_abs_diff(&logits, &r[&format!("logits_{round}")]);
        println!("{drafter_name} on {target_name}: round {round} draft logits differ by {diff:e}");
        assert!(
            diff <= TOLERANCE,
            "{drafter_name}: round {round} differs by {diff}"
        );
    }
    assert_eq!(draft_cache.positions(), r["tokens"].shape()[0] as usize + 4);
}

#[test]
fn full_attention_drafter_matches_z_lab() {
    draft_logits_match("drafter-dense-f32", "dense-hf-f32");
}

#[test]
fn sliding_window_drafter_with_rope_scaling_matches_z_lab() {
    draft_logits_match("drafter-sliding-f32", "moe-hf-f32");
}

/// The tiny drafter tests/fixtures/make_drafters.py writes from a published
/// config (tests/fixtures/drafter_configs; `scaled` there scales only the
/// sizes) has exactly that file's keys, at every level. Several files: the
/// top-level keys of the later ones replace the earlier ones'.
fn published_keys_kept(drafter_name: &str, published: &[&str]) {
    fn keys(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
        for (key, inner) in value.as_object().unwrap() {
            out.push(format!("{prefix}{key}"));
            if inner.is_object() {
                keys(inner, &format!("{prefix}{key}."), out);
            }
        }
    }
    let read = |path: std::path::PathBuf| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let mut source = serde_json::json!({});
    for file in published {
        let part = read(
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/drafter_configs")
                .join(file),
        );
        for (key, value) in part.as_object().unwrap() {
            source[key] = value.clone();
        }
    }
    let tiny = read(fixture(drafter_name).join("config.json"));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    keys(&source, "", &mut a);
    keys(&tiny, "", &mut b);
    a.sort();
    b.sort();
    assert_eq!(a, b, "{drafter_name} lost or gained keys of {published:?}");
}

/// z-lab's published Qwen3.5 layout (5 sliding + 1 full layers, taps in
/// dflash_config, rope_parameters): tests/fixtures/drafter_configs.
#[test]
fn published_sliding_layout_drafter_matches_z_lab() {
    published_keys_kept(
        "drafter-published-nested-f32",
        &["zlab-qwen3.5-nested.json"],
    );
    draft_logits_match("drafter-published-nested-f32", "dense-hf-f32");
}

/// The same with YaRN rope_parameters (z-lab's code rotates through mlx-lm's
/// YarnRoPE).
#[test]
fn published_yarn_drafter_matches_z_lab() {
    published_keys_kept(
        "drafter-published-yarn-f32",
        &["zlab-qwen3.5-nested.json", "dspark-yarn-rope.json"],
    );
    draft_logits_match("drafter-published-yarn-f32", "moe-hf-f32");
}

/// z-lab's earlier Qwen3.5 layout: 8 full layers, `rope_theta` and
/// `block_size` at the top, the taps without a `block_size` in
/// dflash_config; on the MoE target (the size suggests Qwen3.5-35B-A3B).
#[test]
fn published_legacy_drafter_matches_z_lab() {
    published_keys_kept(
        "drafter-published-legacy-f32",
        &["zlab-qwen3.5-legacy.json"],
    );
    draft_logits_match("drafter-published-legacy-f32", "moe-hf-f32");
}

/// The "native" z-lab-format drafter: no layer_types, `is_causal` false, no
/// rope key (base 10000), no `rms_norm_eps` and no
/// `max_position_embeddings` (z-lab's `load_draft` needs both; the
/// generator's `zlab_config` supplies the defaults our loader uses), 5 query
/// heads per key/value head; on the dense target. (Not on published-9b-hf-f32:
/// its f32 taps, up to 8 in size, differ from mlx-lm's by 1.5e-4, a target
/// matter this drafter test does not judge.)
#[test]
fn published_native_drafter_matches_z_lab() {
    published_keys_kept("drafter-published-native-f32", &["native-2560-6layer.json"]);
    draft_logits_match("drafter-published-native-f32", "dense-hf-f32");
}

/// Ornith-1.5-35B-A3B-DFlash: 5 sliding + 1 full, no `num_target_layers`
/// (one past the last tap) nor `max_position_embeddings`, plus keys neither
/// reader uses (`attention_bias` false, `hidden_act` silu,
/// `use_sliding_window`); on the published Qwen3.6-35B-A3B layout.
#[test]
fn published_ornith_drafter_matches_z_lab() {
    published_keys_kept("drafter-published-ornith-f32", &["ornith-1.5-35b-a3b.json"]);
    draft_logits_match("drafter-published-ornith-f32", "published-35b-a3b-hf-f32");
}

/// z-lab's Qwen3.6-35B-A3B-DFlash (revision 42d3b34): 8 full layers, 5
/// taps, mask 248070, YaRN `rope_parameters` of factor 64 over 4096
/// positions with both `rope_type` and `type`, `sliding_window` null, and
/// the token ids and flags transformers 5 writes; on the published
/// Qwen3.6-35B-A3B layout.
#[test]
fn published_qwen3_6_drafter_matches_z_lab() {
    published_keys_kept(
        "drafter-published-qwen36-f32",
        &["zlab-qwen3.6-35b-a3b.json"],
    );
    draft_logits_match("drafter-published-qwen36-f32", "published-35b-a3b-hf-f32");
}

/// z-lab's Qwen3.6-27B-DFlash, assembled from quotes (its README row): 4
/// sliding layers of window 2048 and a full one, 5 taps over 64 target
/// layers, `block_size` at the top level only, mask 248070; on the dense
/// target.
#[test]
fn published_qwen3_6_27b_drafter_matches_z_lab() {
    published_keys_kept(
        "drafter-published-qwen36-27b-f32",
        &["zlab-qwen3.6-27b.assembled.json"],
    );
    draft_logits_match("drafter-published-qwen36-27b-f32", "dense-hf-f32");
}

#[test]
fn quantized_drafter_matches_z_lab() {
    draft_logits_match("drafter-dense-4bit", "dense-hf-f32");
}

#[test]
fn bf16_drafter_loads_and_drafts() {
    let target = Model::load(&fixture("dense-hf-f32")).unwrap();
    let drafter = Drafter::load(&fixture("drafter-dense-bf16"), &target).unwrap();
    let r = reference("drafter-dense-f32");
    let logits = drafter
        .forward(
            &target,
            &r["block_1"],
            &r["taps_1"],
            &mut drafter.new_cache(),
        )
        .unwrap();
    // bf16 weights: close to the f32 drafter, not equal.
    let diff = max_abs_diff(&logits, &r["logits_1"]);
    let scale = host_f32(&r["logits_1"])
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(
        diff <= scale * 0.05,
        "bf16 draft logits differ by {diff} (scale {scale})"
    );
}

fn incompatible(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("drafter-dense-f32");
    std::fs::copy(
        source.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap())
            .unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let target = Model::load(&fixture("dense-mlx-4bit")).unwrap();
    match Drafter::load(dir.path(), &target) {
        Err(e @ ModelError::Incompatible { .. }) => e.to_string(),
        Err(other) => panic!("expected an incompatibility, got {other}"),
        Ok(_) => panic!("an incompatible drafter loaded"),
    }
}

#[test]
fn refuses_a_drafter_that_does_not_fit_with_the_reason() {
    let e = incompatible(|c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([0, 2, 7]));
    assert!(
        e.contains("tap layer 7 does not exist (the target has 4 layers)"),
        "{e}"
    );
    let e = incompatible(|c| c["vocab_size"] = 1000.into());
    assert!(e.contains("vocab 1000 != the target's 512"), "{e}");
    let e = incompatible(|c| c["hidden_size"] = 32.into());
    assert!(e.contains("hidden size 32 != the target's 64"), "{e}");
    let e = incompatible(|c| c["dflash_config"]["mask_token_id"] = 600.into());
    assert!(e.contains("mask token 600 is outside"), "{e}");
    let e = incompatible(|c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([0, 2]));
    assert!(e.contains("fc.weight takes 192 inputs, but 2 taps"), "{e}");
}

/// Every cache entry as host values, for bit-exact comparison.
fn snapshot(cache: &[LayerCache]) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for layer in cache {
        let arrays: Vec<Array> = match layer {
            LayerCache::Gdn(s) => {
                let (conv, ssm) = s.conv_and_ssm().unwrap().unwrap();
                vec![conv, ssm]
            }
            LayerCache::Kv(kv) => {
                let (keys, values) = kv.keys_values().unwrap().unwrap();
                vec![keys, values]
            }
        };
        out.extend(arrays.iter().map(host_f32));
    }
    out
}

fn rollback_is_exact(name: &str) {
    let model = Model::load(&fixture(name)).unwrap();
    let prompt = Array::from_slice(&[3i32, 17, 101, 42, 7], &[1, 5]);
    let block: Vec<i32> = vec![250, 9, 64, 128, 5, 77, 300, 12];
    let t = block.len();
    for accepted in [1, 2, 3, 4, t - 1, t] {
        let mut verified = model.new_cache();
        model.forward(&prompt, &mut verified, Outputs::ALL).unwrap();
        let tape = model
            .verify(
                &Array::from_slice(&block, &[1, t as i32]),
                &mut verified,
                &[0, 3],
            )
            .unwrap()
            .tape;
        model.rollback(&mut verified, &tape, accepted).unwrap();

        let mut plain = model.new_cache();
        model.forward(&prompt, &mut plain, Outputs::ALL).unwrap();
        for &token in &block[..accepted] {
            model
                .forward(
                    &Array::from_slice(&[token], &[1, 1]),
                    &mut plain,
                    Outputs::ALL,
                )
                .unwrap();
        }
        let (a, b) = (snapshot(&verified), snapshot(&plain));
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                x.len(),
                y.len(),
                "{name}: cache entry {i} has another size after keeping {accepted}"
            );
            let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same,
                "{name}: cache entry {i} differs after keeping {accepted} of {t}"
            );
        }
    }
}

#[test]
fn rollback_equals_plain_decoding_of_the_accepted_prefix_dense() {
    rollback_is_exact("dense-mlx-4bit");
    rollback_is_exact("dense-hf-f32");
}

#[test]
fn rollback_equals_plain_decoding_of_the_accepted_prefix_moe() {
    rollback_is_exact("moe-mlx-4bit");
}
