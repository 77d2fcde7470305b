//! Stub bodies: a kernel's calls after its first, made with a body of a few
//! bytes under the same name (docs/gpu.md, "Stub bodies").
//!
//! MLX's `cuda_kernel` copies the whole kernel source (its header, the
//! signature, the template constants and the body) into a new string on
//! every call, and only the first call of each variant compiles it: the
//! compiled module is found by the kernel's name (the body's name plus its
//! template values). So once a variant's first call has been evaluated, its
//! later calls go through a second kernel object of the same name whose
//! body only names the arguments the real body reads shapes of (MLX passes
//! those by what the body names, so the argument list stays the same) and
//! holds an `#error`: should MLX ever compile a stub, the call fails with
//! that message instead of running an empty kernel. CUDA only.

use std::sync::OnceLock;

/// `1` turns stub bodies on.
pub const ENV: &str = "FLASHBAR_KERNEL_STUBS";

pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    cfg!(all(feature = "cuda", target_os = "linux"))
        && *ON.get_or_init(|| std::env::var(ENV).as_deref() == Ok("1"))
}

/// A key of one variant: its template values in order (MLX names a
/// variant's module by them).
pub(crate) fn variant(template: &[(&str, i32)]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for (_, value) in template {
        for b in value.to_le_bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// The stub of a body whose source (as MLX gets it) is `source`: each
/// `<input>_shape`, `_strides` and `_ndim` that `source` holds, in a comment
/// (MLX decides which of them a kernel takes by searching its body for
/// them), then an `#error`.
pub(crate) fn source(source: &str, input_names: &[&str]) -> String {
    let mut named = Vec::new();
    for name in input_names {
        for what in ["_shape", "_strides", "_ndim"] {
            let token = format!("{name}{what}");
            if source.contains(&token) {
                named.push(token);
            }
        }
    }
    format!(
        "/* {} */\n#error \"flashbar: a stub kernel body was compiled: its variant's module was not cached\"\n",
        named.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What MLX takes of an input, as `cuda_kernel` finds it in a body.
    fn shape_infos(source: &str, inputs: &[&str]) -> Vec<[bool; 3]> {
        inputs
            .iter()
            .map(|n| {
                ["_shape", "_strides", "_ndim"].map(|what| source.contains(&format!("{n}{what}")))
            })
            .collect()
    }

    #[test]
    fn a_stub_takes_the_arguments_its_body_takes() {
        let inputs = ["x", "wx", "w", "scales"];
        let body = "int k = x_shape[1]; int n = wx_ndim; s = w_strides[0];";
        let stub = source(body, &inputs);
        assert_eq!(shape_infos(&stub, &inputs), shape_infos(body, &inputs));
        // `x_ndim` is found inside `wx_ndim`, in the body as in the stub.
        assert_eq!(shape_infos(body, &inputs)[0], [true, false, true]);
        assert_eq!(shape_infos(body, &inputs)[3], [false, false, false]);
        assert!(stub.contains("#error"), "{stub}");
        assert!(stub.len() < 200, "{stub}");
    }

    #[test]
    fn every_body_s_stub_takes_its_arguments() {
        macro_rules! bodies {
            ($($file:literal),*) => {
                [$(($file, include_str!(concat!("../../../../kernels/cuda/", $file)))),*]
            };
        }
        let bodies = bodies!(
            "attn_head.cu",
            "attn_merge.cu",
            "attn_rows.cu",
            "conv_rows.cu",
            "gdn_layer.cu",
            "gdn_record.cu",
            "gdn_replay.cu",
            "moe_combine.cu",
            "moe_route.cu",
            "qmm.cu"
        );
        for (file, body) in bodies {
            let compact = super::super::compact(body);
            // Every identifier of the body as an input name: a superset of
            // the names any launch gives it.
            let names: Vec<&str> = compact
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            let stub = source(&compact, &names);
            assert_eq!(
                shape_infos(&stub, &names),
                shape_infos(&compact, &names),
                "{file}"
            );
        }
    }

    #[test]
    fn variants_differ_by_their_template_values() {
        assert_eq!(
            variant(&[("A", 1), ("B", 23)]),
            variant(&[("A", 1), ("B", 23)])
        );
        assert_ne!(
            variant(&[("A", 1), ("B", 23)]),
            variant(&[("A", 12), ("B", 3)])
        );
        assert_ne!(variant(&[("A", 1)]), variant(&[("A", 1), ("B", 0)]));
    }
}
