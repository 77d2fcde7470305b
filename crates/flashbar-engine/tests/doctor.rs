//! `flashbar doctor`'s weights line on the published targets' layouts
//! (make_fixtures.py, `write_published_targets`; docs/checkpoints.md): it
//! says what the download holds that is not loaded, and the modules
//! quantized at other settings than the rest.

use flashbar_engine::doctor::check_target;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    let dir = std::env::var_os("FLASHBAR_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures"));
    assert!(
        dir.join(name).join("config.json").is_file(),
        "no fixture {name} in {}: run `.venv/bin/python tests/fixtures/make_fixtures.py target/fixtures` (scripts/test.sh does)",
        dir.display()
    );
    dir.join(name)
}

fn weights_line(name: &str) -> String {
    let findings = check_target(&fixture(name));
    let weights = findings.iter().find(|f| f.check == "weights").unwrap();
    assert!(weights.ok, "{name}: {}", weights.detail);
    assert!(!weights.detail.contains('\n'), "{}", weights.detail);
    weights.detail.clone()
}

#[test]
fn the_weights_line_notes_skipped_vision_and_mtp_tensors() {
    let hf = weights_line("published-9b-hf-f32");
    assert!(hf.contains("skipped 11 vision-tower tensors"), "{hf}");
    assert!(
        hf.contains("7 multi-token-prediction (MTP) tensors"),
        "{hf}"
    );
    assert!(hf.contains("mlx-lm"), "{hf}");
    let vlm = weights_line("published-35b-a3b-mlx-4bit");
    assert!(vlm.contains("skipped 11 vision-tower tensors"), "{vlm}");
    assert!(!vlm.contains("MTP"), "{vlm}");
    let plain = weights_line("dense-mlx-8bit");
    assert!(!plain.contains("skipped"), "{plain}");
}

#[test]
fn the_weights_line_counts_modules_at_other_quantization() {
    // mlx-lm's 8-bit router and shared-expert gates, 2 per layer, 4 layers.
    let moe = weights_line("published-35b-a3b-mlx-4bit");
    assert!(
        moe.contains("4-bit (group 64), 8 modules at other settings"),
        "{moe}"
    );
    // A uniform dense conversion has none.
    let dense = weights_line("published-9b-mlx-4bit");
    assert!(dense.contains("4-bit (group 64),"), "{dense}");
    assert!(!dense.contains("other settings"), "{dense}");
}
