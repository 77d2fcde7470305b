//! Memory admission for a model load: a target + drafter whose weights (plus
//! the margin of [`required_bytes`]) do not fit in the budget are refused
//! before anything is allocated, with both numbers in one line; a load that
//! fits caps MLX's allocations at the budget, so a long prompt later makes
//! MLX reclaim its cache or fail one request rather than the system
//! OOM-killing the app.

use crate::memory::{required_bytes, MemoryBudget};
use std::path::Path;

/// Bytes of the `*.safetensors` files in a checkpoint folder.
pub fn weight_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                .filter_map(|e| std::fs::metadata(e.path()).ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `Err(one line)` when the pair cannot fit in `budget`; an unknown budget
/// admits (the doctor reports it as unknown), and so does a target with no
/// weight files (the loader then says what is missing).
pub fn admit(target: &Path, drafter: Option<&Path>, budget: &MemoryBudget) -> Result<(), String> {
    let target_weights = weight_bytes(target);
    if target_weights == 0 {
        return Ok(());
    }
    let weights = target_weights + drafter.map_or(0, weight_bytes);
    let needed = required_bytes(weights);
    match budget.bytes {
        Some(have) if needed > have => Err(format!(
            "not enough memory: the {} about {} ({} of weights + margin) but only {} is available ({})",
            if drafter.is_some() {
                "model and drafter need"
            } else {
                "model needs"
            },
            human(needed),
            human(weights),
            human(have),
            budget.source
        )),
        _ => Ok(()),
    }
}

/// Sets MLX's memory limit to the budget (when known); returns the limit in
/// force afterwards.
pub fn apply_limit(budget: &MemoryBudget) -> Result<usize, String> {
    if let Some(bytes) = budget.bytes {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        mlx_rs::memory::set_memory_limit(bytes)
            .map_err(|e| format!("cannot set MLX's memory limit: {e}"))?;
    }
    mlx_rs::memory::memory_limit().map_err(|e| format!("cannot read MLX's memory limit: {e}"))
}

/// `1.02 GiB`, `95.4 MiB`.
pub fn human(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (MIB * 1024.0))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(bytes: u64) -> MemoryBudget {
        MemoryBudget {
            bytes: Some(bytes),
            source: "test".into(),
        }
    }

    #[test]
    fn a_pair_over_the_budget_is_refused_with_the_numbers() {
        let target = tempfile::tempdir().unwrap();
        let drafter = tempfile::tempdir().unwrap();
        std::fs::write(target.path().join("model.safetensors"), vec![0u8; 3 << 20]).unwrap();
        std::fs::write(drafter.path().join("model.safetensors"), vec![0u8; 1 << 20]).unwrap();
        std::fs::write(target.path().join("config.json"), vec![0u8; 5 << 20]).unwrap();
        let needed = required_bytes(4 << 20);
        let error = admit(target.path(), Some(drafter.path()), &budget(needed - 1)).unwrap_err();
        assert_eq!(
            error,
            format!(
                "not enough memory: the model and drafter need about 1.00 GiB (4.0 MiB of weights + margin) but only {} is available (test)",
                human(needed - 1)
            )
        );
        assert!(admit(target.path(), Some(drafter.path()), &budget(needed)).is_ok());
        let unknown = MemoryBudget {
            bytes: None,
            source: "?".into(),
        };
        assert!(admit(target.path(), None, &unknown).is_ok());
        let empty = tempfile::tempdir().unwrap();
        assert!(admit(empty.path(), None, &budget(1)).is_ok());
    }

    #[test]
    fn the_limit_is_applied() {
        let limit = apply_limit(&budget(3 << 30)).unwrap();
        assert_eq!(limit, 3 << 30);
        // An unknown budget leaves it alone.
        let unknown = MemoryBudget {
            bytes: None,
            source: "?".into(),
        };
        assert_eq!(apply_limit(&unknown).unwrap(), 3 << 30);
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human(1 << 30), "1.00 GiB");
        assert_eq!(human(100 << 20), "100.0 MiB");
    }
}
