//! Template values written into a kernel's source (docs/gpu.md, "Template
//! values in the source").
//!
//! MLX's `cuda_kernel` turns each template value into a line
//! `constexpr int NAME = VALUE;` at the top of the kernel's body, and on
//! every call formats each value twice (into the kernel's name and into
//! that line): some 0.5 us of host time a value on an H100 (`bench/host_cost.py`),
//! where a 35B-A3B decode step passes over a thousand. Here each variant
//! (body, argument names, template values) gets a kernel object of its own
//! whose source already holds those lines, under a name of its own, and
//! its calls pass no template values: NVRTC compiles the same text, so the
//! machine code is the same (`every_body_compiles_as_the_cache_wraps_it`
//! compares the PTX).

use std::fmt::Write as _;
use std::sync::OnceLock;

/// `1` writes template values into each variant's source (CUDA only;
/// Metal's kernels take theirs as template parameters); unset or anything
/// else passes them to MLX on every call. Opt-in until a GPU has run it.
pub const ENV: &str = "FLASHBAR_TEMPLATE_IN_SOURCE";

pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| cfg!(not(target_os = "macos")) && std::env::var(ENV).as_deref() == Ok("1"))
}

/// The lines MLX would write for `template`, then the blank line it adds.
pub(crate) fn constants(template: &[(&str, i32)]) -> String {
    let mut lines = String::new();
    for (name, value) in template {
        let _ = writeln!(lines, "  constexpr int {name} = {value};");
    }
    if !template.is_empty() {
        lines.push('\n');
    }
    lines
}

/// FNV-1a over the template's names and values: the variant's key and
/// the suffix of its kernel's name.
pub(crate) fn hash(template: &[(&str, i32)]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut add = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (name, value) in template {
        add(name.as_bytes());
        add(&[0]);
        add(&value.to_le_bytes());
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_constants_are_the_lines_mlx_writes() {
        assert_eq!(
            constants(&[("HK", 16), ("DT", -1)]),
            "  constexpr int HK = 16;\n  constexpr int DT = -1;\n\n"
        );
        assert_eq!(constants(&[]), "");
    }

    #[test]
    fn every_value_and_name_keys_its_variant_apart() {
        let base = hash(&[("A", 1), ("B", 2)]);
        assert_eq!(base, hash(&[("A", 1), ("B", 2)]));
        assert_ne!(base, hash(&[("A", 1), ("B", 3)]));
        assert_ne!(base, hash(&[("A", 2), ("B", 1)]));
        assert_ne!(base, hash(&[("AB", 1), ("", 2)]));
        assert_ne!(base, hash(&[("A", 1)]));
        // The qmm launches a model asks for: no two alike.
        let mut seen = std::collections::HashSet::new();
        for nt in [1, 2, 4, 8] {
            for mt in [1, 2, 4] {
                for p1 in [0, 4096, 8192] {
                    assert!(seen.insert(hash(&[("NT", nt), ("MT", mt), ("P1", p1)])));
                }
            }
        }
    }
}
