//! Build script: compile upstream mlx-c against an MLX library and generate
//! the same bindings upstream `mlx-sys` 0.7.0 does.
//!
//! - Linux: MLX comes from a pinned PyPI wheel (`wheel.rs`); mlx-c is compiled
//!   with `cc` plus a few shims for g++ 12 / x86_64 (`linux.rs`, `../shim`).
//! - macOS: mlx-c's own CMake build fetches and builds MLX with Metal (`macos.rs`).
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
    let clang_args = if target_os == "macos" {
        println!("cargo:rustc-env=FLASHBAR_MLX_LIBRARY=metal");
        macos::build_and_link(&mlx_c);
        Vec::new()
    } else {
        let library = linux::build_and_link(&mlx_c, &out_dir, MLX_VERSION);
        println!("cargo:rustc-env=FLASHBAR_MLX_LIBRARY={library}");
        linux::bindgen_clang_args()
    };
    bindings::generate(&mlx_c, &clang_args, &out_dir.join("bindings.rs"));
}
