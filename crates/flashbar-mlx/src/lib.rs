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

mod custom_kernel;
pub mod device;
pub mod gdn_kernels;
pub mod memory;
pub mod memory_guard;
pub mod row_invariant;
pub mod smoke;

/// Installs mlx-rs's MLX error handler, which hands errors back to the
/// caller, if no mlx-rs call has yet. mlx-c's default handler prints the
/// error and exits the process, so every raw mlx-c call here comes after
/// this. mlx-rs installs it (once) on its first fallible call: this is one
/// that touches no backend.
pub(crate) fn install_mlx_error_handler() {
    let _ = mlx_rs::Device::cpu().get_type();
}

/// Whether `array`'s values are there to read without running anything:
/// made from host data or already evaluated, not merely queued. Reading
/// such an array hands no work to MLX's thread (on the CPU, a sleep and a
/// wake-up of the caller each time).
pub fn is_ready(array: &mlx_rs::Array) -> bool {
    install_mlx_error_handler();
    let mut ready = false;
    // SAFETY: `array` is a live mlx-c array; the call only reads its status.
    let status = unsafe { mlx_sys::_mlx_array_is_available(&mut ready, array.as_ptr()) };
    status == 0 && ready
}

/// The MLX version linked, and which build of it ("cpu", "cuda" or "metal").
pub fn library() -> (&'static str, &'static str) {
    (mlx_sys::MLX_VERSION, mlx_sys::MLX_LIBRARY)
}

/// Waits until MLX has finished the work queued on the default stream.
/// Work queued asynchronously (`async_eval`) and then dropped unread still
/// runs, holding its buffers until it ends; the engine waits for it when a
/// generation ends, so an idle engine has no work of its own left in flight
/// (docs/reliability.md, "Load").
pub fn synchronize() -> Result<(), mlx_rs::error::Exception> {
    install_mlx_error_handler();
    // SAFETY: no arguments; errors go to the handler installed above.
    match unsafe { mlx_sys::mlx_synchronize_default() } {
        0 => Ok(()),
        _ => Err(mlx_rs::error::Exception::custom(
            "MLX could not wait for the default stream",
        )),
    }
}
