//! The pinned MLX wheels from PyPI: download with pip, check sha256, unpack.
//!
//! Wheel files are kept in `$XDG_CACHE_HOME/flashbar/wheels` (default
//! `~/.cache/flashbar/wheels`, which `scripts/setup.sh` fills), or in
//! `FLASHBAR_MLX_WHEEL_DIR` when set; their hashes are checked every time.

use sha2::{Digest, Sha256};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Wheel {
    pub file: &'static str,
    pub requirement: &'static str,
    pub sha256: &'static str,
    /// The wheel's folder of bundled shared libraries, found by libmlx's RPATH.
    pub libs_dir: &'static str,
}

pub const CPU: Wheel = Wheel {
    file: "mlx_cpu-0.32.2-py3-none-manylinux_2_35_x86_64.whl",
    requirement: "mlx-cpu==0.32.2",
    sha256: "fc5d31b90fc4f457b2f9614ed45651a567d22a6a11a03d114a90a4e10bdd8878",
    libs_dir: "mlx_cpu.libs",
};

pub const CUDA13: Wheel = Wheel {
    file: "mlx_cuda_13-0.32.2-py3-none-manylinux_2_35_x86_64.whl",
    requirement: "mlx-cuda-13==0.32.2",
    sha256: "335094ccd1c0c6dc3e09c8caba207c8180602bacc0c38ba20c1d81e9456ab394",
    libs_dir: "mlx_cuda_13.libs",
};

/// Returns the folder holding the unpacked wheel (`mlx/`, its libs folder).
pub fn unpacked(wheel: &Wheel, store: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=FLASHBAR_MLX_WHEEL_DIR");
    println!("cargo:rerun-if-env-changed=XDG_CACHE_HOME");
    let root = store.join(wheel.file.trim_end_matches(".whl"));
    let done_marker = root.join(".unpacked");
    if done_marker.is_file() {
        return root;
    }
    let file = fetch(wheel, store);
    let staging = store.join(format!("{}.partial", wheel.file));
    let _ = fs::remove_dir_all(&staging);
    run(Command::new(python())
        .args(["-m", "zipfile", "-e"])
        .arg(&file)
        .arg(&staging));
    fs::write(staging.join(".unpacked"), wheel.sha256).expect("write marker");
    let _ = fs::remove_dir_all(&root);
    fs::rename(&staging, &root).expect("move unpacked wheel into place");
    root
}

fn fetch(wheel: &Wheel, store: &Path) -> PathBuf {
    let download_dir = wheel_cache(store);
    let file = download_dir.join(wheel.file);
    if !file.is_file() {
        fs::create_dir_all(&download_dir).expect("create wheel download dir");
        run(Command::new(python())
            .args(["-m", "pip", "download", "--quiet", "--no-deps"])
            .args(["--only-binary=:all:", "--platform", "manylinux_2_35_x86_64"])
            .arg("--dest")
            .arg(&download_dir)
            .arg(wheel.requirement));
    }
    verify(&file, wheel);
    file
}

fn wheel_cache(store: &Path) -> PathBuf {
    if let Some(dir) = env::var_os("FLASHBAR_MLX_WHEEL_DIR") {
        return PathBuf::from(dir);
    }
    let cache_home = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cache")));
    match cache_home {
        Some(cache) => cache.join("flashbar/wheels"),
        None => store.join("downloads"),
    }
}

fn verify(file: &Path, wheel: &Wheel) {
    let bytes = fs::read(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    let digest = Sha256::digest(&bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    if hex != wheel.sha256 {
        let _ = fs::remove_file(file);
        panic!(
            "{} has sha256 {hex}, expected {}; the file was removed, build again",
            file.display(),
            wheel.sha256
        );
    }
}

fn python() -> String {
    env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn run(command: &mut Command) {
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e} (python3 with pip is needed)"));
    assert!(status.success(), "{command:?} failed with {status}");
}
