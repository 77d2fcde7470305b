//! Lossless at the level of numbers: a verify of a block computes every
//! position exactly as decoding the block token by token does. Row i of a
//! T-token verify's logits is bit for bit the logits of the i-th one-token
//! step from the same context, and so are the caches after it: otherwise a
//! near-tie can pick another token in DFlash than in plain decoding
//! (docs/cpu.md, "Row invariance").

mod common;

use common::{fixture, host_f32};
use flashbar_models::nn::host;
use flashbar_models::{Model, Outputs};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use std::path::{Path, PathBuf};

fn embedded_target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target")
}

fn row(ids: &[u32]) -> Array {
    Array::from_slice(ids, &[1, ids.len() as i32])
}

/// Token ids that are not a pattern, inside the vocabulary.
fn ids(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// The first position (if any) where a `block`-token verify's logits differ
/// from `block` one-token steps, after a `context`-token prefill.
fn first_difference(dir: &Path, context: usize, block: usize) -> Option<(usize, f32)> {
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let model = Model::load(dir).unwrap();
    let vocab = model.config().text.vocab_size;
    let prompt = ids(context, vocab, 1);
    let tokens = ids(block, vocab, 2);

    let mut stepped = model.new_cache();
    model
        .forward(&row(&prompt), &mut stepped, Outputs::ALL)
        .unwrap();
    let mut verified = stepped.clone();
    let logits = model
        .verify(&row(&tokens), &mut verified, &[0])
        .unwrap()
        .logits;
    for (i, &token) in tokens.iter().enumerate() {
        let step = model
            .forward(&row(&[token]), &mut stepped, Outputs::ALL)
            .unwrap()
            .logits;
        let (a, b) = (
            host_f32(&step),
            host_f32(&logits.index((.., i as i32..i as i32 + 1))),
        );
        if a != b {
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            return Some((i, worst));
        }
    }
    None
}

fn assert_rows_invariant(dir: &Path) {
    for (context, block) in [(1, 16), (37, 16), (37, 5), (100, 2)] {
        assert_eq!(
            first_difference(dir, context, block),
            None,
            "{}: context {context}, block {block}: (position, largest difference)",
            dir.display()
        );
    }
}

/// In both of the host kernels' arithmetics (docs/cpu.md, "Parity with
/// mlx-lm"). The only test here that sets one: the others take whichever
/// is set when they load, and every model keeps the one it loaded with.
#[test]
fn verify_rows_equal_decode_steps_on_the_embedded_target() {
    for arithmetic in [host::Arithmetic::Mlx, host::Arithmetic::F32] {
        host::set_arithmetic(arithmetic);
        assert_rows_invariant(&embedded_target());
    }
}

#[test]
fn verify_rows_equal_decode_steps_on_the_dense_fixture() {
    assert_rows_invariant(&fixture("dense-mlx-4bit"));
}

#[test]
fn verify_rows_equal_decode_steps_on_the_moe_fixture() {
    assert_rows_invariant(&fixture("moe-mlx-4bit"));
}

/// bf16 weights unquantized: the host kernels' f32 column sums (MLX's bf16
/// gemm order, docs/cpu.md "Parity with mlx-lm").
#[test]
fn verify_rows_equal_decode_steps_on_the_bf16_fixture() {
    assert_rows_invariant(&fixture("dense-hf-bf16"));
}
