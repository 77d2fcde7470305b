//! Kernel bodies by `#include` (docs/gpu.md, "Bodies by include").
//!
//! MLX's `cuda_kernel` copies a kernel's whole body into a new source string
//! on every call and hashes that string to find the compiled module: on an
//! H100 a call costs some 0.35 us more per KB of body (`bench/host_cost.py`),
//! and our quantized matmul's body is 12 KB. So each body is written once
//! to a file of its own, named by its hash, and MLX gets a body of one
//! line that includes it (NVRTC opens an absolute path), preceded by a
//! comment naming the argument shapes the body reads: MLX passes an input's
//! `_shape`, `_strides` or `_ndim` only where its body names them. What
//! NVRTC compiles is the same text, so the machine code is the same
//! (`every_body_compiles_as_the_cache_wraps_it` compiles every body both
//! ways and compares the PTX). CUDA only;
//! where the folder cannot be written, MLX gets the body itself.

use super::disk;
use super::Body;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// On by default since an H100 timed it (docs/gpu.md, "Bodies by include"):
/// unset or `1` writes the bodies to `~/.cache/flashbar/cuda-bodies`,
/// another path names the folder; `0` gives MLX the bodies themselves.
pub const ENV: &str = "FLASHBAR_KERNEL_BODIES";

fn folder() -> Option<&'static Path> {
    static FOLDER: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOLDER
        .get_or_init(|| {
            cfg!(all(feature = "cuda", target_os = "linux"))
                .then(|| disk::folder(ENV, "cuda-bodies", true))
                .flatten()
        })
        .as_deref()
}

/// The source MLX gets for `body` called with `input_names`: the include
/// line where the body's file is written, else the compact body.
pub(crate) fn mlx_source(body: &Body, input_names: &[&str]) -> String {
    match folder().and_then(|dir| body_file(body, dir)) {
        Some(file) => include_line(&body.compact_source().to_string_lossy(), input_names, &file)
            .unwrap_or_else(|| body.compact_source().to_string_lossy().into_owned()),
        None => body.compact_source().to_string_lossy().into_owned(),
    }
}

/// `body`'s file in `dir`, written if it is missing or holds anything else.
fn body_file(body: &Body, dir: &Path) -> Option<PathBuf> {
    let file = dir.join(format!("{}.cuh", body.full_name()));
    if std::fs::read(&file).ok().as_deref() != Some(body.source.as_bytes()) {
        disk::write_whole(&file, body.source.as_bytes());
    }
    (std::fs::read(&file).ok().as_deref() == Some(body.source.as_bytes())).then_some(file)
}

/// The one-line body that includes `file`, after a comment naming each
/// `<input>_shape`, `_strides` and `_ndim` that `source` holds (MLX finds
/// them by searching the body). None for a path an `#include` cannot name.
pub(super) fn include_line(source: &str, input_names: &[&str], file: &Path) -> Option<String> {
    let path = file.to_str().filter(|p| !p.contains(['"', '\n', '\\']))?;
    let mut named = Vec::new();
    for name in input_names {
        for what in ["_shape", "_strides", "_ndim"] {
            let token = format!("{name}{what}");
            if source.contains(&token) {
                named.push(token);
            }
        }
    }
    Some(format!("/* {} */\n#include \"{path}\"\n", named.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What MLX passes of each input, as `cuda_kernel` finds it in a body.
    fn shape_infos(source: &str, inputs: &[&str]) -> Vec<[bool; 3]> {
        inputs
            .iter()
            .map(|n| {
                ["_shape", "_strides", "_ndim"].map(|what| source.contains(&format!("{n}{what}")))
            })
            .collect()
    }

    fn bodies() -> Vec<(&'static str, &'static str)> {
        macro_rules! bodies {
            ($($file:literal),*) => {
                vec![$(($file, include_str!(concat!("../../../../kernels/cuda/", $file)))),*]
            };
        }
        bodies!(
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
        )
    }

    #[test]
    fn an_include_line_takes_the_arguments_its_body_takes() {
        let inputs = ["x", "wx", "w", "scales"];
        let body = "int k = x_shape[1]; int n = wx_ndim; s = w_strides[0];";
        let line = include_line(body, &inputs, Path::new("/a/b.cuh")).unwrap();
        assert_eq!(shape_infos(&line, &inputs), shape_infos(body, &inputs));
        // `x_ndim` is found inside `wx_ndim`, in the body as in the line.
        assert_eq!(shape_infos(body, &inputs)[0], [true, false, true]);
        assert_eq!(shape_infos(body, &inputs)[3], [false, false, false]);
        assert!(line.ends_with("#include \"/a/b.cuh\"\n"), "{line}");
        assert_eq!(include_line(body, &inputs, Path::new("/a\"b.cuh")), None);
    }

    #[test]
    fn every_body_s_include_line_takes_its_arguments() {
        for (file, body) in bodies() {
            let compact = super::super::compact(body);
            // Every identifier of the body as an input name: a superset of
            // the names any launch gives it.
            let names: Vec<&str> = compact
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            let line = include_line(&compact, &names, Path::new("/k.cuh")).unwrap();
            assert_eq!(
                shape_infos(&line, &names),
                shape_infos(&compact, &names),
                "{file}"
            );
        }
    }

    #[test]
    fn a_body_file_is_written_once_and_mended() {
        let dir = tempfile::tempdir().unwrap();
        let body: &'static Body = Box::leak(Box::new(Body::new("t", "y[0] = x[0];\n")));
        let file = body_file(body, dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), body.source);
        assert!(file.to_str().unwrap().contains(&body.full_name()));
        std::fs::write(&file, "damaged").unwrap();
        assert_eq!(body_file(body, dir.path()), Some(file.clone()));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), body.source);
    }
}
