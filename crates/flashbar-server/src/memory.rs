//! MLX's memory counters for `/health`: bytes held by live arrays (active),
//! the most ever held (peak), freed buffers kept for reuse (cache), and the
//! limit set from the machine's memory budget at load, so a soak run can
//! watch for leaks from outside the process.

use mlx_rs::memory;
use serde_json::{json, Value};

/// One counter; `None` when MLX reports an error. Read through mlx-rs, whose
/// calls install its error handler first: a raw mlx-c call made before any
/// mlx-rs call would meet mlx-c's default handler, which exits the process.
fn read(get: fn() -> mlx_rs::error::Result<usize>) -> Option<u64> {
    get().ok().map(|bytes| bytes as u64)
}

/// `{"active_bytes", "peak_bytes", "cache_bytes", "limit_bytes"}`.
pub fn stats() -> Value {
    json!({
        "active_bytes": read(memory::active_memory),
        "peak_bytes": read(memory::peak_memory),
        "cache_bytes": read(memory::cache_memory),
        "limit_bytes": read(memory::memory_limit),
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
