//! A damaged or mismatched checkpoint is refused with a one-line reason
//! before anything is allocated; nothing panics.

mod common;

use common::fixture;
use flashbar_models::{Model, ModelError};
use std::fs;
use std::path::{Path, PathBuf};

/// A private copy of a fixture, to damage.
fn copy_of(name: &str) -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join(name);
    fs::create_dir(&dir).unwrap();
    for entry in fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (temp, dir)
}

fn load_error(dir: &Path) -> String {
    let error = match Model::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(error) => error,
    };
    let message = error.to_string();
    assert!(!message.contains('\n'), "not one line: {message}");
    message
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    fs::write(path, serde_json::to_string(&config).unwrap()).unwrap();
}

/// Rewrites one safetensors file with `edit` applied to its tensors.
fn edit_tensors(
    file: &Path,
    edit: impl FnOnce(&mut std::collections::HashMap<String, mlx_rs::Array>),
) {
    let mut tensors = mlx_rs::Array::load_safetensors(file).unwrap();
    edit(&mut tensors);
    let edited = file.with_extension("edited.safetensors");
    mlx_rs::Array::save_safetensors(tensors.iter().map(|(k, v)| (k.as_str(), v)), None, &edited)
        .unwrap();
    fs::rename(edited, file).unwrap();
}

#[test]
fn truncated_safetensors() {
    let (_temp, dir) = copy_of("dense-mlx-4bit");
    let file = dir.join("model.safetensors");
    let bytes = fs::read(&file).unwrap();
    fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let message = load_error(&dir);
    assert!(message.contains("truncated"), "{message}");
}

#[test]
fn garbage_header() {
    let (_temp, dir) = copy_of("dense-mlx-4bit");
    fs::write(
        dir.join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fnot json",
    )
    .unwrap();
    let message = load_error(&dir);
    assert!(message.contains("header length"), "{message}");
}

#[test]
fn missing_tensor() {
    let (_temp, dir) = copy_of("dense-mlx-8bit");
    edit_tensors(&dir.join("model.safetensors"), |t| {
        t.remove("language_model.model.layers.2.linear_attn.A_log");
    });
    let message = load_error(&dir);
    assert!(
        message.contains("missing tensor model.layers.2.linear_attn.A_log"),
        "{message}"
    );
}

#[test]
fn unexpected_tensor() {
    let (_temp, dir) = copy_of("dense-mlx-8bit");
    edit_tensors(&dir.join("model.safetensors"), |t| {
        t.insert(
            "language_model.model.layers.0.extra.weight".into(),
            mlx_rs::Array::from_slice(&[1.0f32], &[1]),
        );
    });
    let message = load_error(&dir);
    assert!(
        message.contains("unexpected tensor model.layers.0.extra.weight"),
        "{message}"
    );
}

#[test]
fn wrong_shape() {
    let (_temp, dir) = copy_of("dense-mlx-8bit");
    edit_tensors(&dir.join("model.safetensors"), |t| {
        t.insert(
            "language_model.model.norm.weight".into(),
            mlx_rs::Array::from_slice(&[1.0f32; 32], &[32]),
        );
    });
    let message = load_error(&dir);
    assert!(
        message.contains("model.norm.weight has shape [32], expected [64]"),
        "{message}"
    );
}

#[test]
fn wrong_dtype() {
    let (_temp, dir) = copy_of("dense-mlx-8bit");
    edit_tensors(&dir.join("model.safetensors"), |t| {
        t.insert(
            "language_model.model.norm.weight".into(),
            mlx_rs::Array::from_slice(&[1i32; 64], &[64]),
        );
    });
    let message = load_error(&dir);
    assert!(
        message.contains("model.norm.weight has dtype I32"),
        "{message}"
    );
}

#[test]
fn quantized_bits_that_do_not_fit_the_packed_shape() {
    let (_temp, dir) = copy_of("dense-mlx-4bit");
    edit_config(&dir, |c| c["quantization"]["bits"] = 8.into());
    let message = load_error(&dir);
    assert!(
        message.contains("has shape") && message.contains("expected"),
        "{message}"
    );
}

#[test]
fn unknown_model_type() {
    let (_temp, dir) = copy_of("dense-hf-f32");
    edit_config(&dir, |c| c["model_type"] = "llama".into());
    let error = Model::load(&dir).err().expect("refused");
    assert!(matches!(error, ModelError::UnknownModelType(ref t) if t == "llama"));
    assert!(error
        .to_string()
        .contains("unsupported model_type \"llama\""));
}

#[test]
fn config_missing_a_key() {
    let (_temp, dir) = copy_of("dense-hf-f32");
    edit_config(&dir, |c| {
        c["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("hidden_size");
    });
    let message = load_error(&dir);
    assert!(message.contains("missing field `hidden_size`"), "{message}");
}

#[test]
fn config_that_is_not_json() {
    let (_temp, dir) = copy_of("dense-hf-f32");
    fs::write(dir.join("config.json"), "{ not json").unwrap();
    let message = load_error(&dir);
    assert!(message.contains("invalid config"), "{message}");
}

#[test]
fn missing_weights() {
    let (_temp, dir) = copy_of("dense-mlx-8bit");
    fs::remove_file(dir.join("model.safetensors")).unwrap();
    fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
    let message = load_error(&dir);
    assert!(message.contains("no weights"), "{message}");
}

#[test]
fn bf16_moe_checkpoint_loads() {
    // No mlx-lm reference exists for it on the CPU (gather_mm is f32-only
    // there); it must still pass every check and load.
    Model::load(&fixture("moe-hf-bf16")).unwrap();
}
