//! Build script: compile upstream mlx-c against an MLX library and generate
//! the same bindings upstream `mlx-sys` 0.7.0 does.
//!
//! - Linux: MLX comes from a pinned PyPI wheel (`wheel.rs`); mlx-c is compiled
//!   with `cc` plus a few shims for g++ 12 / x86_64 (`linux.rs`, `../shim`).
//! - macOS: mlx-c's own CMake build fetches and builds MLX with Metal (`macos.rs`).
//! - A target other than the host (e.g. `--target aarch64-apple-darwin` on
//!   Linux): check-only, the bindings and nothing native, so `cargo check` and
//!   `cargo clippy` cover the macOS code from any machine.
//!
//! The mlx-c sources are never copied into this repository: `upstream.rs` asks
//! cargo for its registry copy of the upstream crate.

mod bindings;
mod blas;
mod linux;
mod macos;
mod upstream;
mod wheel;

use std::env;
use std::path::PathBuf;

/// The MLX version mlx-c 0.7.0 is written against (its CMakeLists pins v0.32.2).
const MLX_VERSION: &str = "0.32.2";

fn main() {
    let mlx_c = upstream::mlx_c_root();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rustc-env=FLASHBAR_MLX_VERSION={MLX_VERSION}");

    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let macos = target_os == "macos";
    println!("cargo:rustc-env=FLASHBAR_MLX_LIBRARY={}", library(macos));
    let host = env::var("HOST").expect("cargo sets HOST");
    let target = env::var("TARGET").expect("cargo sets TARGET");
    if host != target {
        // Check-only: a cross target's MLX cannot be built here (no SDK, no
        // wheel for it), and `cargo check` / `clippy` need only the bindings.
        println!(
            "cargo:warning=mlx-sys: {target} is not the host ({host}): bindings only, \
             MLX is neither built nor linked (enough for cargo check and clippy; \
             a binary for {target} will not link)"
        );
    } else if macos {
        macos::build_and_link(&mlx_c);
    } else {
        linux::build_and_link(&mlx_c, &out_dir, MLX_VERSION);
    }
    let clang_args = if macos {
        Vec::new()
    } else {
        linux::bindgen_clang_args()
    };
    bindings::generate(&mlx_c, &clang_args, &out_dir.join("bindings.rs"));
}

/// Which MLX library the build links: "metal" (macOS with the `metal`
/// feature), "cuda" (Linux with the `cuda` feature), else "cpu".
fn library(macos: bool) -> &'static str {
    let feature = |name: &str| env::var_os(format!("CARGO_FEATURE_{name}")).is_some();
    match (macos, feature("METAL"), feature("CUDA")) {
        (true, true, _) => "metal",
        (false, _, true) => "cuda",
        _ => "cpu",
    }
}
