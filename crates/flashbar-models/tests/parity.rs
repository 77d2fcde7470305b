//! Our models compute what mlx-lm computes on the same checkpoints: f32 logits
//! within 1e-4 for prefill of 1..N tokens and for step-by-step decode, and
//! the same 64 greedy tokens for quantized checkpoints. On the CPU, bf16
//! checkpoints (packed with bf16 scales, as mlx-community's, or not) give
//! mlx-lm's logits bit for bit, and so its greedy tokens (docs/cpu.md,
//! "Parity with mlx-lm").

mod common;

use common::{fixture, host_i32, max_abs_diff, reference};
use flashbar_models::nn::host;
use flashbar_models::{Model, Outputs};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;

/// mlx-lm's own arithmetic on the CPU (docs/cpu.md, "Parity with mlx-lm"):
/// every test here compares with it; models load after this.
fn mlx_arithmetic() {
    host::set_arithmetic(host::Arithmetic::Mlx);
}

const F32_TOLERANCE: f32 = 1e-4;

fn prefill_and_decode_match(name: &str, tolerance: f32) {
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let model = Model::load(&fixture(name)).unwrap();
    let reference = reference(name);
    let tokens = &reference["tokens"];
    let n = tokens.shape()[0];
    let mut worst = 0.0f32;
    for len in 1..=n {
        let mut cache = model.new_cache();
        let prompt = tokens.index(..len).reshape(&[1, len]).unwrap();
        let logits = model
            .forward(&prompt, &mut cache, Outputs::ALL)
            .unwrap()
            .logits
            .index(0);
        let diff = max_abs_diff(&logits, &reference[&format!("prefill_{len}")]);
        worst = worst.max(diff);
        assert!(
            diff <= tolerance,
            "{name}: prefill of {len} differs by {diff}"
        );
    }
    let mut cache = model.new_cache();
    for t in 0..n {
        let step = tokens.index(t..t + 1).reshape(&[1, 1]).unwrap();
        let logits = model
            .forward(&step, &mut cache, Outputs::ALL)
            .unwrap()
            .logits
            .index((0, 0));
        let diff = max_abs_diff(&logits, &reference["decode"].index(t));
        worst = worst.max(diff);
        assert!(
            diff <= tolerance,
            "{name}: decode step {t} differs by {diff}"
        );
    }
    eprintln!("{name}: worst logit difference {worst:e}");
}

fn greedy_matches(name: &str) {
    let model = Model::load(&fixture(name)).unwrap();
    let reference = reference(name);
    let expected = host_i32(&reference["greedy"]);
    let tokens = &reference["tokens"];
    let mut cache = model.new_cache();
    let mut logits = model
        .forward(&tokens.reshape(&[1, -1]).unwrap(), &mut cache, Outputs::ALL)
        .unwrap()
        .logits;
    let mut generated = Vec::new();
    for _ in 0..expected.len() {
        let last = logits.index((0, -1));
        let next = argmax_axis(&last, -1, false).unwrap();
        let id = host_i32(&next)[0];
        generated.push(id);
        logits = model
            .forward(&Array::from_slice(&[id], &[1, 1]), &mut cache, Outputs::ALL)
            .unwrap()
            .logits;
    }
    assert_eq!(
        generated, expected,
        "{name}: greedy tokens differ from mlx-lm"
    );
}

#[test]
fn dense_f32_logits_match_mlx_lm() {
    mlx_arithmetic();
    prefill_and_decode_match("dense-hf-f32", F32_TOLERANCE);
}

#[test]
fn moe_f32_logits_match_mlx_lm() {
    mlx_arithmetic();
    prefill_and_decode_match("moe-hf-f32", F32_TOLERANCE);
}

/// YaRN rope_parameters on the target (tests/fixtures/make_fixtures.py,
/// YARN_ROPE): partial rotation with blended periods and mscale.
#[test]
fn yarn_target_logits_match_mlx_lm() {
    mlx_arithmetic();
    prefill_and_decode_match("dense-yarn-hf-f32", F32_TOLERANCE);
}

#[test]
fn quantized_logits_match_mlx_lm() {
    mlx_arithmetic();
    for name in [
        "dense-mlx-4bit",
        "dense-mlx-8bit",
        "moe-mlx-4bit",
        "moe-mlx-8bit",
    ] {
        prefill_and_decode_match(name, F32_TOLERANCE);
    }
}

#[test]
fn quantized_greedy_tokens_match_mlx_lm() {
    mlx_arithmetic();
    for name in [
        "dense-mlx-4bit",
        "dense-mlx-8bit",
        "moe-mlx-4bit",
        "moe-mlx-8bit",
    ] {
        greedy_matches(name);
    }
}

/// The published targets' layouts at small sizes (make_fixtures.py,
/// `write_published_targets`; docs/checkpoints.md): Qwen3.5-9B's and
/// Qwen3.6-35B-A3B's config keys, HF names with a vision tower and an MTP
/// head, mlx-lm / mlx-vlm conversions with `language_model.` names, vision
/// tower tensors, 8-bit router gates as per-layer overrides, and mixed bits
/// with unquantized gates. Loaded through the same checked path, they give
/// mlx-lm's logits and greedy tokens.
#[test]
fn published_target_layouts_match_mlx_lm() {
    mlx_arithmetic();
    // f32 rounding: the HF 9B layout measured 1.09e-4 once (its prefill of
    // 7), where the 35B one measures 2.0e-5 and the same 9B weights
    // quantized 1.3e-5; a wrong tensor costs more than 0.1. So these two
    // take twice the f32 bound.
    for name in ["published-9b-hf-f32", "published-35b-a3b-hf-f32"] {
        prefill_and_decode_match(name, 2.0 * F32_TOLERANCE);
    }
    for name in [
        "published-9b-mlx-4bit",
        "published-9b-mlx-8bit",
        "published-35b-a3b-mlx-4bit",
        "published-35b-a3b-mlx-8bit",
        "published-35b-a3b-mlx-mixed",
    ] {
        prefill_and_decode_match(name, F32_TOLERANCE);
        greedy_matches(name);
    }
}

/// bf16 logits: the host kernels multiply, attend and recur in mlx-lm's
/// order with its roundings, so every prefill and decode step's logits are
/// mlx-lm's bit for bit (they differed by 5.8 bf16 units of the largest
/// logit before, docs/cpu.md "Parity with mlx-lm").
#[test]
fn bf16_checkpoint_logits_equal_mlx_lm() {
    mlx_arithmetic();
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    prefill_and_decode_match("dense-hf-bf16", 0.0);
}

#[test]
fn bf16_greedy_tokens_match_mlx_lm() {
    mlx_arithmetic();
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    greedy_matches("dense-hf-bf16");
}

/// mlx-lm's greedy pick in `generate_step`: the argmax of the
/// log-probabilities `logits - logsumexp(logits)`, in the logits' type.
fn generate_step_pick(logits: &Array) -> i32 {
    let lse = logits.logsumexp_axis(-1, true).unwrap();
    host_i32(&argmax_axis(logits.subtract(&lse).unwrap(), -1, false).unwrap())[0]
}

/// The embedded target (8-bit, bf16 scales, biases and norms, as
/// mlx-community's conversions) decodes greedily, 48 tokens after each of
/// bench/acceptance.py's prompts, exactly as mlx-lm's `generate_step` does
/// (tests/fixtures/make_fixtures.py, `embedded_target_reference`).
#[test]
fn embedded_target_greedy_matches_mlx_lm_generate_step() {
    mlx_arithmetic();
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let path = common::fixtures_dir().join("embedded-target.reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let model = Model::load(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target"),
    )
    .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<i32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect()
    };
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 12, "{} cases", cases.len());
    let mut failed = Vec::new();
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["generate_step"]);
        let mut cache = model.new_cache();
        let mut logits = model
            .forward(
                &Array::from_slice(&prompt, &[1, prompt.len() as i32]),
                &mut cache,
                Outputs::LAST,
            )
            .unwrap()
            .logits;
        let mut generated = Vec::new();
        for _ in 0..expected.len() {
            let id = generate_step_pick(&logits.index((0, -1)));
            generated.push(id);
            logits = model
                .forward(&Array::from_slice(&[id], &[1, 1]), &mut cache, Outputs::ALL)
                .unwrap()
                .logits;
        }
        if generated != expected {
            let at = generated
                .iter()
                .zip(&expected)
                .take_while(|(a, b)| a == b)
                .count();
            failed.push(format!(
                "{:?}: first difference at token {at}",
                case["prompt"]
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "differ from mlx-lm (a changed models/default/target needs its reference \
         made again: tests/fixtures/make_fixtures.py): {failed:#?}"
    );
}

/// A prompt long enough for the CPU's dequantize-then-gemm prefill
/// (`CPU_GEMM_FROM_ROWS`) gives the logits that decoding it token by token
/// (the quantized kernel, checked against mlx-lm above) gives, at every
/// position; and `forward_last` is the last of them.
#[test]
fn long_quantized_prefill_matches_token_by_token_decode() {
    mlx_arithmetic();
    use flashbar_models::nn::linear::CPU_GEMM_FROM_ROWS;
    for name in ["dense-mlx-4bit", "moe-mlx-8bit"] {
        let model = Model::load(&fixture(name)).unwrap();
        let tokens = &reference(name)["tokens"];
        let repeats = CPU_GEMM_FROM_ROWS / tokens.shape()[0] + 2;
        let long = mlx_rs::ops::concatenate(&vec![tokens.clone(); repeats as usize], 0).unwrap();
        let n = long.shape()[0];
        assert!(n > CPU_GEMM_FROM_ROWS, "{n} tokens");
        let prompt = long.reshape(&[1, n]).unwrap();
        let prefill = model
            .forward(&prompt, &mut model.new_cache(), Outputs::ALL)
            .unwrap()
            .logits;
        let last = model
            .forward(&prompt, &mut model.new_cache(), Outputs::LAST)
            .unwrap()
            .logits;
        let diff = max_abs_diff(&last.index((0, 0)), &prefill.index((0, n - 1)));
        assert!(
            diff <= F32_TOLERANCE,
            "{name}: forward_last differs by {diff}"
        );
        let mut cache = model.new_cache();
        for t in 0..n {
            let step = long.index(t..t + 1).reshape(&[1, 1]).unwrap();
            let logits = model
                .forward(&step, &mut cache, Outputs::ALL)
                .unwrap()
                .logits
                .index((0, 0));
            let diff = max_abs_diff(&logits, &prefill.index((0, t)));
            assert!(
                diff <= F32_TOLERANCE,
                "{name}: position {t} of {n} differs by {diff}"
            );
        }
    }
}
