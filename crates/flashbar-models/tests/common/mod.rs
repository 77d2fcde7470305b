//! Shared helpers: where the fixtures are, and reading mlx-lm's references.
#![allow(dead_code)] // each test file uses its own subset

use mlx_rs::Array;
use std::collections::HashMap;
use std::path::PathBuf;

/// Fixtures written by tests/fixtures/make_fixtures.py (scripts/test.sh runs
/// it); `FLASHBAR_FIXTURES` points elsewhere.
pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("FLASHBAR_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures"));
    assert!(
        dir.join("dense-hf-f32/config.json").is_file(),
        "no fixtures in {}: run `.venv/bin/python tests/fixtures/make_fixtures.py target/fixtures` (scripts/test.sh does)",
        dir.display()
    );
    dir
}

pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

pub fn reference(name: &str) -> HashMap<String, Array> {
    let path = fixtures_dir().join(format!("{name}.reference.safetensors"));
    Array::load_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn host_f32(array: &Array) -> Vec<f32> {
    let array = array
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap()
        .contiguous()
        .unwrap();
    array.eval().unwrap();
    array.as_slice::<f32>().to_vec()
}

pub fn host_i32(array: &Array) -> Vec<i32> {
    let array = array.as_dtype(mlx_rs::Dtype::Int32).unwrap();
    array.eval().unwrap();
    array.as_slice::<i32>().to_vec()
}

pub fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape(), "shapes differ");
    let (a, b) = (host_f32(a), host_f32(b));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
