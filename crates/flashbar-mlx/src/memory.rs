//! How much memory a model may use here, and MLX's limit set from it.
//!
//! The budget is the GPU's working-set limit on macOS (Metal), the GPU's
//! free memory on CUDA when MLX reports it, else the memory Linux says is
//! available (the physical memory on macOS). `FLASHBAR_MEMORY_BUDGET` (bytes, or with a K/M/G suffix)
//! overrides it, for tests and for users who want to leave room to others.
//! `memory_guard` refuses what does not fit and sets MLX's limit.

use crate::device::{self, Backend};
use serde::Serialize;
use std::ffi::CStr;

const GIB: u64 = 1 << 30;

/// Memory a pair with `weights` bytes of weight files needs: the weights,
/// 15% for activations and the verify block, and 1 GiB for caches and the
/// runtime (a rule of thumb, not a measurement of any one prompt length).
pub fn required_bytes(weights: u64) -> u64 {
    weights + weights * 15 / 100 + GIB
}

/// The memory a model can use here, and where the number comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryBudget {
    /// None when it cannot be measured on this machine.
    pub bytes: Option<u64>,
    /// What was measured ("Metal recommended working set", ...), or why not.
    pub source: String,
}

/// The override of the measured budget.
pub const BUDGET_ENV: &str = "FLASHBAR_MEMORY_BUDGET";

/// Measures the budget for the backend MLX will use (or takes
/// `FLASHBAR_MEMORY_BUDGET`).
pub fn budget() -> MemoryBudget {
    if let Ok(value) = std::env::var(BUDGET_ENV) {
        return match parse_size(&value) {
            Some(bytes) => MemoryBudget {
                bytes: Some(bytes),
                source: BUDGET_ENV.into(),
            },
            None => unknown(&format!(
                "{BUDGET_ENV}={value:?} is not a size (bytes, or a number with K, M or G)"
            )),
        };
    }
    let backend = device::choose().unwrap_or(Backend::Cpu);
    match backend {
        Backend::Metal => match gpu_info_size(&[c"max_recommended_working_set_size"]) {
            Some(bytes) => MemoryBudget {
                bytes: Some(bytes),
                source: "Metal recommended working set".into(),
            },
            None => unknown("MLX did not report the Metal working-set limit"),
        },
        // Keys of MLX's CUDA device info (present in libmlx 0.32.2's CUDA build).
        Backend::Cuda => match gpu_info_size(&[c"free_memory", c"total_memory"]) {
            Some(bytes) => MemoryBudget {
                bytes: Some(bytes),
                source: "free CUDA device memory".into(),
            },
            None => system_available("MLX reports no CUDA memory size; "),
        },
        Backend::Cpu => system_available(""),
    }
}

fn unknown(why: &str) -> MemoryBudget {
    MemoryBudget {
        bytes: None,
        source: why.to_owned(),
    }
}

#[cfg(target_os = "linux")]
fn system_available(prefix: &str) -> MemoryBudget {
    match std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text))
    {
        Some(bytes) => MemoryBudget {
            bytes: Some(bytes),
            source: format!("{prefix}MemAvailable in /proc/meminfo"),
        },
        None => unknown(&format!("{prefix}/proc/meminfo has no MemAvailable")),
    }
}

/// macOS reports no "available" figure as Linux does; its physical memory
/// (unified: the CPU and GPU share it) bounds what any model can use.
#[cfg(target_os = "macos")]
fn system_available(prefix: &str) -> MemoryBudget {
    let mut bytes: u64 = 0;
    let mut size = std::mem::size_of::<u64>();
    // SAFETY: hw.memsize is a 64-bit integer; sysctl writes at most `size`
    // bytes into `bytes` and sets `size` to what it wrote.
    let status = unsafe {
        libc::sysctlbyname(
            c"hw.memsize".as_ptr(),
            (&mut bytes as *mut u64).cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if status == 0 && size == std::mem::size_of::<u64>() {
        MemoryBudget {
            bytes: Some(bytes),
            source: format!("{prefix}physical memory (sysctl hw.memsize)"),
        }
    } else {
        unknown(&format!("{prefix}sysctl hw.memsize failed"))
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn system_available(prefix: &str) -> MemoryBudget {
    unknown(&format!(
        "{prefix}available memory is read only on Linux and macOS"
    ))
}

/// `1048576`, `512K`, `64M`, `2G` (binary units) -> bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_uppercase()),
        _ => (text, 'B'),
    };
    let shift = match unit {
        'B' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        _ => return None,
    };
    number.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// `MemAvailable:  123 kB` -> bytes.
#[cfg(any(target_os = "linux", test))]
pub(crate) fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut parts = line.split_whitespace().skip(1);
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => Some(value * 1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// The first of `keys` that MLX's device info has for GPU 0, as a size.
/// Only called when the library reports a usable GPU.
pub(crate) fn gpu_info_size(keys: &[&CStr]) -> Option<u64> {
    crate::install_mlx_error_handler();
    // SAFETY: the device and info objects are created, read and freed here;
    // MLX writes only through the pointers it is given.
    unsafe {
        let device = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        let mut found = None;
        if mlx_sys::mlx_device_info_get(&mut info, device) == 0 {
            for key in keys {
                let mut value: usize = 0;
                if mlx_sys::mlx_device_info_get_size(&mut value, info, key.as_ptr()) == 0 {
                    found = Some(value as u64);
                    break;
                }
            }
        }
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(device);
        found
    }
}

/// `0` leaves a checkpoint's tensors where the load put them, for
/// benchmarks ([`read_on_gpu`]).
pub const READ_ON_GPU_ENV: &str = "FLASHBAR_READ_WEIGHTS_ON_GPU";

/// Has the GPU read every byte of `arrays` once, on CUDA: MLX's CUDA
/// allocator gives every array managed memory, and a checkpoint's tensors
/// are written there by the CPU as the files are read, so their pages sit
/// in host memory until a kernel first touches them, then move a page fault
/// at a time. Without this, the first decode steps paid those faults for
/// every embedding row and every MoE expert the prompt had not yet touched
/// (docs/gpu.md, "Weights on the GPU from the load"). One reduction an
/// array, all evaluated together; nothing on the CPU or Metal, whose memory
/// is one. Only a matter of speed: where MLX cannot sum an array, the
/// array is left as it is and the load goes on.
pub fn read_on_gpu<'a>(arrays: impl IntoIterator<Item = &'a mlx_rs::Array>) {
    if device::current() != Backend::Cuda || std::env::var(READ_ON_GPU_ENV).as_deref() == Ok("0") {
        return;
    }
    let sums: Vec<mlx_rs::Array> = arrays
        .into_iter()
        .filter(|a| a.size() > 0)
        .filter_map(|a| a.sum(None).ok())
        .collect();
    // The arrays are read and valid whether or not this runs.
    let _ = mlx_rs::transforms::eval(&sums);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_meminfo() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   12345 kB\n";
        assert_eq!(mem_available(text), Some(12345 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn reads_sizes() {
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size(" 2g "), Some(2 << 30));
        assert_eq!(parse_size("512K"), Some(512 << 10));
        for bad in ["", "M", "1.5G", "-1", "12T", "lots"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn rule_of_thumb() {
        assert_eq!(required_bytes(100 * GIB), 116 * GIB);
    }

    #[cfg(any(target_os = "linux", target_os = "macos"))]
    #[test]
    fn measures_this_machine() {
        let budget = budget();
        assert!(budget.bytes.is_some_and(|b| b > 0), "{budget:?}");
    }
}
