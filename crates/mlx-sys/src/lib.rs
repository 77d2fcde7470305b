//! Raw bindings to mlx-c, generated at build time, with the same names and
//! types as the upstream `mlx-sys` 0.7.0 so that `mlx-rs` builds unchanged.
//!
//! What differs from upstream is only how MLX is obtained: on Linux we link the
//! `libmlx.so` of a pinned PyPI wheel (CPU, or CUDA with the `cuda` feature);
//! on macOS we build MLX with Metal exactly as upstream does. See `build/`.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// The MLX version whose wheel (Linux) or sources (macOS) this crate links.
pub const MLX_VERSION: &str = env!("FLASHBAR_MLX_VERSION");

/// Which MLX library was linked: "cpu", "cuda" or "metal".
pub const MLX_LIBRARY: &str = env!("FLASHBAR_MLX_LIBRARY");

/// `mlx-rs` seeds its random keys from Mach's `mach_approximate_time`, which
/// exists only on Apple platforms. Elsewhere we provide it from the wall clock
/// (nanoseconds), so unseeded random streams differ between runs as on macOS.
#[cfg(not(target_vendor = "apple"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |elapsed| elapsed.as_nanos() as u64)
}

#[cfg(feature = "cuda")]
extern "C" {
    /// MLX's `fast::precompiled_cuda_kernel` (`shim/precompiled_kernel.cpp`,
    /// the `cuda` feature): launches `binary`, a cubin, as kernel `name`.
    /// Returns 0, or 1 after passing MLX's message to mlx-c's error handler.
    pub fn flashbar_precompiled_cuda_kernel(
        outputs: *mut mlx_vector_array,
        name: *const std::ffi::c_char,
        binary: *const std::ffi::c_char,
        binary_len: usize,
        inputs: mlx_vector_array,
        output_shapes: *const std::ffi::c_int,
        output_ndims: *const usize,
        output_dtypes: *const mlx_dtype,
        n_outputs: usize,
        scalars: *const std::ffi::c_int,
        n_scalars: usize,
        grid: *const std::ffi::c_int,
        thread_group: *const std::ffi::c_int,
        stream: mlx_stream,
    ) -> std::ffi::c_int;
}
