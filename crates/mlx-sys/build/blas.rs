//! Which BLAS MLX's CPU backend multiplies with.
//!
//! The CPU wheel bundles the reference (netlib) BLAS, whose sgemm runs at
//! well under 1 GFLOP/s: a 2,000-token prefill of a small model then takes
//! about a minute. When the system has OpenBLAS (Debian/Ubuntu:
//! `libopenblas0-pthread`, which `scripts/setup.sh` installs), the wheel's
//! `libblas-*.so` is replaced by it in the folder placed beside the binaries
//! (the unpacked wheel itself stays as it came). OpenBLAS exports the same
//! BLAS and CBLAS symbols, so libmlx and the wheel's LAPACK bind to it.

use std::path::PathBuf;

/// Where distributions put OpenBLAS's BLAS-compatible library.
const OPENBLAS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
];

/// Set to `reference` to keep the wheel's own BLAS.
pub const BLAS_ENV: &str = "FLASHBAR_BLAS";

/// The OpenBLAS library to use instead of the wheel's BLAS, if any.
pub fn openblas() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={BLAS_ENV}");
    if std::env::var(BLAS_ENV).is_ok_and(|v| v == "reference") {
        return None;
    }
    let found = OPENBLAS.iter().map(PathBuf::from).find(|p| p.exists());
    if found.is_none() {
        println!(
            "cargo:warning=no OpenBLAS found: MLX's CPU backend keeps the wheel's reference \
             BLAS (slow prefill); install libopenblas0-pthread and rebuild"
        );
    }
    found
}

/// Whether `file` (a name in the wheel's libs folder) is its bundled BLAS.
pub fn is_wheel_blas(file: &str) -> bool {
    file.starts_with("libblas")
}
