//! Tensors that published checkpoints carry besides the text model (a
//! vision tower, a multi-token-prediction head) are skipped: a fixture with
//! them added, under the names real checkpoints use, loads and computes
//! exactly what it computes without them. The names: HF `model.visual.*`
//! (the printed module tree of Qwen3.6-27B, tests/fixtures/target_configs),
//! mlx-vlm conversions' `vision_tower.*`, HF `mtp.*`.

mod common;

use common::{fixture, host_f32};
use flashbar_models::{Model, Outputs};
use mlx_rs::Array;
use std::fs;
use std::path::Path;

fn copy_with_extra(name: &str, extra: &[&str]) -> tempfile::TempDir {
    let temp = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), temp.path().join(entry.file_name())).unwrap();
    }
    let file = temp.path().join("model.safetensors");
    let mut tensors = Array::load_safetensors(&file).unwrap();
    for (i, name) in extra.iter().enumerate() {
        tensors.insert(
            (*name).to_owned(),
            Array::from_slice(&[i as f32; 8], &[2, 4]),
        );
    }
    let edited = temp.path().join("edited.safetensors");
    Array::save_safetensors(tensors.iter().map(|(k, v)| (k.as_str(), v)), None, &edited).unwrap();
    fs::rename(edited, &file).unwrap();
    temp
}

fn logits(dir: &Path) -> Vec<f32> {
    let model = Model::load(dir).unwrap();
    let tokens = Array::from_slice(&[3i32, 17, 101, 42], &[1, 4]);
    let out = model
        .forward(&tokens, &mut model.new_cache(), Outputs::ALL)
        .unwrap();
    let values = host_f32(&out.logits);
    assert_eq!(
        values.len(),
        4 * 512,
        "logits of 4 positions over the vocab"
    );
    values
}

#[test]
fn hf_vision_and_mtp_tensors_are_skipped() {
    let extra = [
        "model.visual.patch_embed.proj.weight",
        "model.visual.blocks.0.attn.qkv.weight",
        "model.visual.merger.linear_fc1.weight",
        "mtp.fc.weight",
        "mtp.norm.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
    ];
    let dir = copy_with_extra("dense-hf-bf16", &extra);
    assert_eq!(logits(dir.path()), logits(&fixture("dense-hf-bf16")));
}

#[test]
fn mlx_vlm_vision_tower_tensors_are_skipped() {
    let extra = [
        "vision_tower.patch_embed.proj.weight",
        "vision_tower.blocks.0.attn.qkv.weight",
        "vision_tower.merger.linear_fc1.weight",
    ];
    let dir = copy_with_extra("dense-mlx-8bit", &extra);
    assert_eq!(logits(dir.path()), logits(&fixture("dense-mlx-8bit")));
}
