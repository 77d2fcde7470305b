//! The published targets' layouts at small sizes (make_fixtures.py,
//! `write_published_targets`; docs/checkpoints.md): what the checked path
//! skips and says it skipped, the per-layer quantization it reads, and a
//! config that disagrees with its tensors refused in one line before any
//! weight is read. Their logits are checked against mlx-lm in parity.rs.

mod common;

use common::fixture;
use flashbar_models::checkpoint::Count;
use flashbar_models::config::QuantParams;
use flashbar_models::Model;
use std::fs;

const Q4: QuantParams = QuantParams {
    group_size: 64,
    bits: 4,
};
const Q8: QuantParams = QuantParams {
    group_size: 64,
    bits: 8,
};

/// Vision tower and MTP tensors are counted, not loaded; the note says so.
#[test]
fn vision_and_mtp_tensors_are_skipped_and_counted() {
    // (fixture, vision tensors, MTP tensors): make_fixtures.py's
    // `vision_and_mtp` writes 11 vision tensors, and 7 (dense) or 8 (MoE)
    // MTP ones in the HF layouts only.
    for (name, vision, mtp) in [
        ("published-9b-hf-f32", 11, 7),
        ("published-35b-a3b-hf-f32", 11, 8),
        ("published-9b-mlx-4bit", 11, 0),
        ("published-35b-a3b-mlx-8bit", 11, 0),
    ] {
        let (_, checkpoint) = Model::check(&fixture(name)).unwrap();
        let skipped = checkpoint.skipped;
        assert_eq!(
            (skipped.vision.tensors, skipped.mtp.tensors),
            (vision, mtp),
            "{name}"
        );
        assert!(skipped.vision.bytes > 0, "{name}");
        assert!(checkpoint
            .tensors
            .keys()
            .all(|n| !n.contains("visual") && !n.contains("vision") && !n.contains("mtp")));
        let note = skipped.note().unwrap();
        assert!(
            note.contains(&format!("{vision} vision-tower tensors")),
            "{note}"
        );
        assert_eq!(note.contains("MTP"), mtp > 0, "{note}");
        assert!(!note.contains('\n'));
    }
    // A checkpoint without them has no note.
    let (_, plain) = Model::check(&fixture("dense-mlx-4bit")).unwrap();
    assert_eq!(plain.skipped.vision, Count::default());
    assert_eq!(plain.skipped.note(), None);
}

/// mlx-lm's MoE conversions keep the router and shared-expert gates at 8
/// bits through per-layer entries named `language_model.model.layers.N...`.
#[test]
fn per_layer_quantization_overrides_are_read() {
    let (config, checkpoint) = Model::check(&fixture("published-35b-a3b-mlx-4bit")).unwrap();
    let q = &config.quantization;
    assert_eq!(q.default, Some(Q4));
    for layer in 0..4 {
        for module in ["mlp.gate", "mlp.shared_expert_gate"] {
            let path = format!("model.layers.{layer}.{module}");
            assert_eq!(q.for_module(&path), Some(Q8), "{path}");
        }
        let attn = format!("model.layers.{layer}.mlp.shared_expert.gate_proj");
        assert_eq!(q.for_module(&attn), Some(Q4), "{attn}");
    }
    // The 8-bit gate's packed width is the 8-bit one: 64 inputs in 16 words.
    let gate = &checkpoint.tensors["model.layers.0.mlp.gate.weight"];
    assert_eq!(
        (gate.dtype.as_str(), gate.shape.as_slice()),
        ("U32", &[4, 16][..])
    );

    // Mixed: layer 0's GDN output at 8 bits, the shared-expert gates left
    // unquantized (no scales, a float weight).
    let (config, checkpoint) = Model::check(&fixture("published-35b-a3b-mlx-mixed")).unwrap();
    let q = &config.quantization;
    assert_eq!(
        q.for_module("model.layers.0.linear_attn.out_proj"),
        Some(Q8)
    );
    assert_eq!(
        q.for_module("model.layers.1.linear_attn.out_proj"),
        Some(Q4)
    );
    let gate = &checkpoint.tensors["model.layers.2.mlp.shared_expert_gate.weight"];
    assert_eq!(
        (gate.dtype.as_str(), gate.shape.as_slice()),
        ("F32", &[1, 64][..])
    );
    assert!(!checkpoint
        .tensors
        .contains_key("model.layers.2.mlp.shared_expert_gate.scales"));
}

/// A per-layer entry that disagrees with the stored tensors is one line
/// naming the tensor, from the headers, before any weight is read.
#[test]
fn an_override_that_disagrees_with_the_tensors_is_refused_in_one_line() {
    let temp = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(fixture("published-35b-a3b-mlx-4bit")).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), temp.path().join(entry.file_name())).unwrap();
    }
    let path = temp.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    config["quantization"]["language_model.model.layers.1.mlp.gate"]["bits"] = 4.into();
    fs::write(&path, config.to_string()).unwrap();
    let error = Model::check(temp.path()).unwrap_err().to_string();
    assert!(error.contains("model.layers.1.mlp.gate.weight"), "{error}");
    assert!(!error.contains('\n'), "{error}");
    // Loading fails the same way (the check runs first).
    let error = Model::load(temp.path()).err().unwrap().to_string();
    assert!(error.contains("model.layers.1.mlp.gate.weight"), "{error}");
}
