//! MLX's memory counters for `/health`: bytes held by live arrays (active),
//! the most ever held (peak), freed buffers kept for reuse (cache), and the
//! limit set from the machine's memory budget at load, so a soak run can
//! watch for leaks from outside the process.

use serde_json::{json, Value};

/// One counter; `None` when MLX reports an error.
fn read(get: unsafe extern "C" fn(*mut usize) -> i32) -> Option<u64> {
    let mut bytes: usize = 0;
    // SAFETY: the mlx-c getters write one size_t through the pointer and
    // only read the allocator's counters (safe from any thread).
    let status = unsafe { get(&mut bytes) };
    (status == 0).then_some(bytes as u64)
}

/// `{"active_bytes", "peak_bytes", "cache_bytes", "limit_bytes"}`.
pub fn stats() -> Value {
    json!({
        "active_bytes": read(mlx_sys::mlx_get_active_memory),
        "peak_bytes": read(mlx_sys::mlx_get_peak_memory),
        "cache_bytes": read(mlx_sys::mlx_get_cache_memory),
        "limit_bytes": read(mlx_sys::mlx_get_memory_limit),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_counters_are_read() {
        let stats = super::stats();
        for key in ["active_bytes", "peak_bytes", "cache_bytes", "limit_bytes"] {
            assert!(stats[key].is_u64(), "{key}: {stats}");
        }
    }
}
