//! MLX runtime glue shared by every Flashbar crate that computes.
//!
//! - [`device`]: the single place that decides where MLX runs (Metal on macOS,
//!   CUDA when the linked library has it and a GPU is present, else the CPU),
//!   with `FLASHBAR_DEVICE` as the override.
//! - [`gdn_kernels`]: custom CUDA / Metal kernels for the gated-delta
//!   recurrence that record a rollback tape, and replay it.
//! - [`memory`]: the memory a model may use here; [`memory_guard`] refuses
//!   a pair that does not fit before loading it and sets MLX's limit.
//! - [`smoke`]: small numerical checks of the MLX operations the models rely
//!   on, run by the test suite and by `flashbar smoke` on any device.

pub mod device;
pub mod gdn_kernels;
pub mod memory;
pub mod memory_guard;
pub mod smoke;

/// The MLX version linked, and which build of it ("cpu", "cuda" or "metal").
pub fn library() -> (&'static str, &'static str) {
    (mlx_sys::MLX_VERSION, mlx_sys::MLX_LIBRARY)
}
