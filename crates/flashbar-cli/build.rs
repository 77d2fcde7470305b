//! CUDA builds: export the NVRTC calls flashbar-mlx defines
//! (`custom_kernel::nvrtc_cache::exported`), so that libmlx's calls to NVRTC
//! reach the compile cache before the real library (docs/gpu.md, "The
//! kernel cache").
fn main() {
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=nvrtc*");
    }
}
