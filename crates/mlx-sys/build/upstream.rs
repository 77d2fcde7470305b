//! Finds mlx-c inside cargo's registry copy of upstream `mlx-sys` 0.7.0.
//!
//! The workspace patches that crate away, so nothing else makes cargo fetch
//! it; `upstream/Cargo.toml` depends on it and `cargo metadata` both fetches
//! it and tells us where it lies.

use std::env;
use std::path::PathBuf;
use std::process::Command;

pub fn mlx_c_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let locator = manifest_dir.join("upstream/Cargo.toml");
    println!("cargo:rerun-if-changed={}", locator.display());
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
        ])
        .arg(&locator)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo metadata: {e}"));
    if !output.status.success() {
        panic!(
            "cargo metadata for {} failed:\n{}",
            locator.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "mlx-sys" && p["version"] == "0.7.0")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("cargo metadata lists mlx-sys 0.7.0");
    let root = PathBuf::from(manifest)
        .parent()
        .expect("a manifest has a parent")
        .join("src/mlx-c");
    assert!(
        root.join("mlx/c/mlx.h").is_file(),
        "no mlx-c sources at {}",
        root.display()
    );
    root
}
