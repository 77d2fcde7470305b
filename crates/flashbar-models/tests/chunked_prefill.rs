//! A long prefill runs the gated-delta recurrence chunk by chunk
//! (`nn::gated_delta_chunked`, docs/cpu.md "Chunked prefill"): in another
//! order of sums than the step path, so within rounding of it, not equal.
//! Here on f32 checkpoints: a prompt prefilled whole (chunked) against the
//! same prompt in pieces below `CHUNKED_FROM` (the step path), then a few
//! decode steps from each cache, which read the final states: every logit
//! within 1e-4.

mod common;

use common::{fixture, host_f32};
use flashbar_models::nn::gated_delta_host::CHUNKED_FROM;
use flashbar_models::{Model, Outputs};
use mlx_rs::Array;

fn row(ids: &[u32]) -> Array {
    Array::from_slice(ids, &[1, ids.len() as i32])
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    let (a, b) = (host_f32(a), host_f32(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The largest logit difference between a whole prefill and a prefill in
/// pieces, over the prefill's last position and 4 decode steps after it.
fn whole_vs_pieces(name: &str) -> f32 {
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let model = Model::load(&fixture(name)).unwrap();
    let vocab = model.config().text.vocab_size;
    let prompt: Vec<u32> = (0..CHUNKED_FROM + 37)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let half = prompt.len() / 2;
    assert!(half < CHUNKED_FROM, "each piece must take the step path");

    let mut whole = model.new_cache();
    let a = model
        .forward(&row(&prompt), &mut whole, Outputs::LAST)
        .unwrap()
        .logits;
    let mut pieces = model.new_cache();
    model
        .forward(&row(&prompt[..half]), &mut pieces, Outputs::LAST)
        .unwrap();
    let b = model
        .forward(&row(&prompt[half..]), &mut pieces, Outputs::LAST)
        .unwrap()
        .logits;
    let mut worst = max_diff(&a, &b);
    for token in [5u32, 17, 3, 11] {
        let a = model
            .forward(&row(&[token]), &mut whole, Outputs::LAST)
            .unwrap()
            .logits;
        let b = model
            .forward(&row(&[token]), &mut pieces, Outputs::LAST)
            .unwrap()
            .logits;
        worst = worst.max(max_diff(&a, &b));
    }
    worst
}

#[test]
fn a_chunked_prefill_is_within_1e_4_of_the_step_path() {
    for name in ["dense-hf-f32", "moe-hf-f32"] {
        let worst = whole_vs_pieces(name);
        assert!(worst <= 1e-4, "{name}: logits {worst} apart");
    }
}
