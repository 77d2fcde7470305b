//! The whole CUDA source of one variant of a kernel body, as MLX's
//! `cuda_kernel` would build it, for the kernel cache (`precompiled`,
//! docs/gpu.md "The kernel cache"). Plain text work, tested on every build.

use super::Launch;
use mlx_rs::error::Exception;
use mlx_rs::Dtype;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};

/// A hash of everything the compiled source depends on besides the body:
/// argument names, types and ranks, and the template values.
pub(crate) fn signature_hash(spec: &Launch) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    spec.input_names.hash(&mut h);
    spec.output_names.hash(&mut h);
    for a in spec.inputs {
        (a.dtype() as u32, a.ndim()).hash(&mut h);
    }
    for (shape, dtype) in spec.outputs {
        (*dtype as u32, shape.len()).hash(&mut h);
    }
    spec.template.hash(&mut h);
    h.finish()
}

/// The kernel's whole source: the signature MLX's `cuda_kernel` would
/// declare (inputs, outputs; the inputs' shapes as ints after them, since a
/// precompiled kernel takes only scalars), the template values as
/// constants, then the body.
pub(crate) fn source(spec: &Launch, name: &str) -> Result<(String, Vec<usize>), Exception> {
    let body = spec.body.source;
    let mut params = Vec::new();
    for (name, array) in spec.input_names.iter().zip(spec.inputs) {
        params.push(format!("const {}* {name}", cuda_type(array.dtype())?));
    }
    for (name, (_, dtype)) in spec.output_names.iter().zip(spec.outputs) {
        params.push(format!("{}* {name}", cuda_type(*dtype)?));
    }
    let mut shaped = Vec::new();
    let mut prologue = String::new();
    for (i, (name, array)) in spec.input_names.iter().zip(spec.inputs).enumerate() {
        if !body.contains(&format!("{name}_shape")) {
            continue;
        }
        shaped.push(i);
        let dims: Vec<String> = (0..array.ndim())
            .map(|d| format!("{name}_shape_{d}"))
            .collect();
        params.extend(dims.iter().map(|d| format!("int {d}")));
        let _ = writeln!(
            prologue,
            "  const int {name}_shape[{}] = {{{}}};",
            dims.len().max(1),
            dims.join(", ")
        );
    }
    for (arg, value) in spec.template {
        let _ = writeln!(prologue, "  constexpr int {arg} = {value};");
    }
    let source = format!(
        "{PRELUDE}extern \"C\" __global__ void {name}(\n    {}) {{\n{prologue}\n{body}\n}}\n",
        params.join(",\n    ")
    );
    Ok((source, shaped))
}

/// What MLX puts before a custom kernel, reduced to what our bodies use.
const PRELUDE: &str = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\
typedef int int32_t;\ntypedef unsigned int uint32_t;\n\n";

fn cuda_type(dtype: Dtype) -> Result<&'static str, Exception> {
    Ok(match dtype {
        Dtype::Bfloat16 => "__nv_bfloat16",
        Dtype::Float16 => "__half",
        Dtype::Float32 => "float",
        Dtype::Int32 => "int32_t",
        Dtype::Uint32 => "uint32_t",
        other => {
            return Err(Exception::custom(format!(
                "CUDA kernel: no argument type for {other:?}"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::custom_kernel::Body;
    use mlx_rs::Array;

    static BODY: Body = Body::new("t", "int n = x_shape[1];\ny[0] = x[n] + (float)K;\n");

    /// The source declares what the `cuda_kernel` path would, with the shape
    /// of each input the body reads passed as ints and rebuilt as an array.
    #[test]
    fn the_source_declares_the_arguments_and_rebuilds_the_shapes() {
        let x = Array::from_slice(&[1.0f32; 6], &[2, 3]);
        let w = Array::from_slice(&[1u32; 4], &[4]);
        let spec = Launch {
            body: &BODY,
            input_names: &["x", "w"],
            output_names: &["y"],
            inputs: &[&x, &w],
            outputs: &[(vec![1], Dtype::Bfloat16)],
            grid: [32, 1, 1],
            group: [32, 1, 1],
            template: &[("K", 7)],
        };
        let (source, shaped) = source(&spec, "k1").unwrap();
        assert_eq!(shaped, vec![0], "only x's shape is read");
        assert!(source.contains("extern \"C\" __global__ void k1(\n    const float* x,\n    const uint32_t* w,\n    __nv_bfloat16* y,\n    int x_shape_0,\n    int x_shape_1) {"), "{source}");
        assert!(
            source.contains(
                "  const int x_shape[2] = {x_shape_0, x_shape_1};\n  constexpr int K = 7;\n"
            ),
            "{source}"
        );
        assert!(
            source.ends_with("y[0] = x[n] + (float)K;\n\n}\n"),
            "{source}"
        );
        // Another template value or argument type is another variant.
        let other = Launch {
            template: &[("K", 8)],
            ..spec
        };
        assert_ne!(signature_hash(&spec), signature_hash(&other));
        let x16 = x.as_dtype(Dtype::Float16).unwrap();
        let typed = Launch {
            inputs: &[&x16, &w],
            ..spec
        };
        assert_ne!(signature_hash(&spec), signature_hash(&typed));
        assert_eq!(signature_hash(&spec), signature_hash(&Launch { ..spec }));
    }

    /// Every CUDA body, wrapped by [`source`] as the kernel cache wraps it,
    /// compiles with NVRTC for the H200's architecture (no GPU needed: the NVIDIA wheel's
    /// NVRTC in the Python environment). tests/python/test_cuda_kernels.py
    /// compiles every template combination of MLX's wrapping; this checks
    /// ours, one launch of each body.
    #[cfg(target_os = "linux")]
    #[test]
    fn every_body_compiles_as_the_cache_wraps_it() {
        use crate::custom_kernel::nvrtc::{wheel, Nvrtc};
        let (handle, include) = wheel();
        let nvrtc = Nvrtc::from_handle(handle).unwrap();
        let includes = [include];
        let bodies = tempfile::tempdir().unwrap();

        let a = |dtype: Dtype, ndim: usize| {
            Array::from_slice(&[0.0f32], &[1])
                .reshape(&vec![1; ndim])
                .unwrap()
                .as_dtype(dtype)
                .unwrap()
        };
        let (bf, h, f, u, i) = (
            Dtype::Bfloat16,
            Dtype::Float16,
            Dtype::Float32,
            Dtype::Uint32,
            Dtype::Int32,
        );
        // "FILE (NAME)": the body as `row_invariant` builds it with that define.
        let kernel = |file: &str| {
            let (file, prefix) = match file.split_once(" (") {
                Some((file, name)) => (file, format!("#define {} 1\n", name.trim_end_matches(')'))),
                None => (file, String::new()),
            };
            let path = format!("{}/../../kernels/cuda/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = prefix + &std::fs::read_to_string(path).unwrap();
            let source: &'static str = Box::leak(text.into_boxed_str());
            Box::leak(Box::new(Body::new("k", source))) as &'static Body
        };
        type Case = (
            &'static str,
            Vec<(&'static str, Array)>,
            Vec<(&'static str, Dtype)>,
            Vec<(&'static str, i32)>,
        );
        // With the shared expert apart and among the experts.
        let moe: Vec<Case> = [0, 1]
            .into_iter()
            .flat_map(|shared| {
                let combine = vec![
                    ("K", 8),
                    ("GCOL", 256),
                    ("RES", 1),
                    ("HALF", 0),
                    ("SHARED", shared),
                ];
                [
                    (
                        "moe_route.cu",
                        vec![("logits", a(bf, 2))],
                        vec![("pairs_in", i), ("pairs_out", i), ("scores", bf)],
                        vec![
                            ("E", 256),
                            ("K", 8),
                            ("NORM", 1),
                            ("HALF", 0),
                            ("SHARED", shared),
                        ],
                    ),
                    (
                        "moe_combine.cu",
                        ["down", "scores", "shared", "gate", "res"]
                            .map(|n| (n, a(bf, 2)))
                            .to_vec(),
                        vec![("y", bf)],
                        combine.clone(),
                    ),
                    (
                        "moe_combine.cu (NORM_OUT)",
                        ["down", "scores", "shared", "gate", "res", "nw"]
                            .map(|n| (n, a(bf, 2)))
                            .into_iter()
                            .chain([("eps", a(f, 1))])
                            .collect(),
                        vec![("y", bf), ("normed", bf)],
                        combine,
                    ),
                ]
            })
            .collect();
        let qmm = |bits, half, nt, glu, res, gather| -> Case {
            let t = if half == 1 { h } else { bf };
            (
                "qmm.cu",
                vec![
                    ("x", a(t, 3 - gather as usize)),
                    ("w", a(u, 2 + gather as usize)),
                    ("scales", a(t, 2 + gather as usize)),
                    ("biases", a(t, 2 + gather as usize)),
                    ("res", a(t, 2)),
                    ("pairs", a(if gather == 1 { i } else { t }, 2)),
                ],
                vec![("y", t)],
                vec![
                    ("BITS", bits),
                    ("HALF", half),
                    ("NT", nt),
                    ("MT", 1),
                    ("GLU", glu),
                    ("RES", res),
                    ("GATHER", gather),
                    ("P1", 0),
                    ("P2", 0),
                    ("P3", 0),
                ],
            )
        };
        let gdn = vec![("HK", 4), ("HV", 8), ("DK", 64), ("DV", 64)];
        let cases: Vec<Case> = vec![
            qmm(4, 0, 4, 1, 0, 0),
            qmm(8, 1, 2, 0, 1, 0),
            qmm(4, 0, 1, 0, 0, 1),
            qmm(4, 0, 4, 1, 0, 1),
            {
                // a stacked product's parts (P1-P3)
                let mut case = qmm(4, 0, 4, 0, 0, 0);
                case.3[7..].copy_from_slice(&[("P1", 4096), ("P2", 8192), ("P3", 12288)]);
                case
            },
            (
                "attn_rows.cu",
                vec![
                    ("q", a(bf, 4)),
                    ("k", a(bf, 4)),
                    ("v", a(bf, 4)),
                    ("scale", a(f, 1)),
                ],
                vec![("part", f), ("stats", f)],
                vec![("D", 256), ("GROUP", 4), ("DT", 1), ("CAUSAL", 1)],
            ),
            (
                "attn_rows.cu (KV_ROOM)",
                vec![
                    ("q", a(bf, 4)),
                    ("k", a(bf, 4)),
                    ("v", a(bf, 4)),
                    ("scale", a(f, 1)),
                    ("length", a(i, 1)),
                ],
                vec![("part", f), ("stats", f)],
                vec![("D", 256), ("GROUP", 4), ("DT", 1), ("CAUSAL", 1)],
            ),
            (
                "attn_head.cu",
                vec![
                    ("qg", a(bf, 3)),
                    ("k", a(bf, 3)),
                    ("v", a(bf, 3)),
                    ("qw", a(bf, 1)),
                    ("kw", a(bf, 1)),
                    ("offset", a(i, 1)),
                    ("params", a(f, 1)),
                ],
                vec![("q_out", bf), ("k_out", bf), ("v_out", bf)],
                vec![
                    ("D", 256),
                    ("HQ", 16),
                    ("HKV", 4),
                    ("DIMS", 64),
                    ("DT", 1),
                    ("GATED", 1),
                ],
            ),
            (
                "attn_merge.cu",
                vec![("part", a(f, 5)), ("stats", a(f, 5)), ("gate", a(f, 5))],
                vec![("out", bf)],
                vec![("D", 256), ("DT", 1), ("GATE", 0)],
            ),
            (
                "attn_merge.cu",
                vec![("part", a(f, 5)), ("stats", a(f, 5)), ("gate", a(bf, 3))],
                vec![("out", bf)],
                vec![("D", 256), ("DT", 1), ("GATE", 1)],
            ),
            (
                "conv_rows.cu",
                vec![("x", a(bf, 3)), ("w", a(bf, 2))],
                vec![("y", bf)],
                vec![("K", 4), ("DT", 1)],
            ),
            (
                "gdn_record.cu",
                ["q", "k", "v", "g", "beta", "state"]
                    .map(|n| (n, a(f, 4)))
                    .to_vec(),
                vec![("y", f), ("state_out", f), ("delta", f)],
                gdn.clone(),
            ),
            (
                "gdn_replay.cu",
                vec![
                    ("state0", a(f, 4)),
                    ("k", a(f, 4)),
                    ("g", a(f, 3)),
                    ("delta", a(f, 4)),
                    ("n_steps", a(i, 1)),
                ],
                vec![("state_out", f)],
                gdn.clone(),
            ),
        ];
        // The gated-delta layer, a thread a state row and four.
        let gdn_layers: Vec<Case> = [(1, 64), (4, 256)]
            .into_iter()
            .map(|(split, threads)| {
                (
                    "gdn_layer.cu",
                    ["qkv", "z", "b_in", "a_in", "conv_state"]
                        .map(|n| (n, a(bf, 3)))
                        .into_iter()
                        .chain(
                            ["conv_w", "a_log", "dt_bias", "norm_w", "consts", "state"]
                                .map(|n| (n, a(f, 2))),
                        )
                        .collect(),
                    vec![
                        ("out", bf),
                        ("state_out", f),
                        ("conv_out", bf),
                        ("k_tape", f),
                        ("g_tape", f),
                        ("delta", f),
                    ],
                    vec![
                        ("HK", 4),
                        ("HV", 8),
                        ("DK", 64),
                        ("DV", 64),
                        ("K", 4),
                        ("SPLIT", split),
                        ("NT", threads),
                        ("DT", 1),
                        ("RA", 1),
                        ("RN", 1),
                    ],
                )
            })
            .collect();
        let mut failures = Vec::new();
        let all = cases.into_iter().chain(moe).chain(gdn_layers);
        for (n, (file, inputs, outputs, template)) in all.enumerate() {
            let input_names: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
            let input_arrays: Vec<&Array> = inputs.iter().map(|(_, a)| a).collect();
            let output_names: Vec<&str> = outputs.iter().map(|(n, _)| *n).collect();
            let outs: Vec<(Vec<i32>, Dtype)> = outputs.iter().map(|(_, d)| (vec![1], *d)).collect();
            let spec = Launch {
                body: kernel(file),
                input_names: &input_names,
                output_names: &output_names,
                inputs: &input_arrays,
                outputs: &outs,
                grid: [32, 1, 1],
                group: [32, 1, 1],
                template: &template,
            };
            let name = format!("case{n}");
            let (inline, shaped) = source(&spec, &name).unwrap();
            let ptx = match nvrtc.compile(&inline, &name, "compute_90", &includes) {
                Ok(ptx) => ptx,
                Err(log) => {
                    failures.push(format!(
                        "{file} {template:?}: {}",
                        &log[..log.len().min(1500)]
                    ));
                    continue;
                }
            };
            assert!(
                String::from_utf8_lossy(&ptx).contains(&format!(".entry {name}(")),
                "{file}: no kernel {name} in the PTX"
            );
            // qmm's template ints packed (row_invariant::qmm::Template):
            // the same PTX.
            if file == "qmm.cu" {
                let get = |k: &str| template.iter().find(|(n, _)| *n == k).unwrap().1;
                let ints = crate::row_invariant::qmm_body::Template {
                    bits: get("BITS"),
                    half: get("HALF"),
                    nt: get("NT"),
                    mt: get("MT"),
                    glu: get("GLU"),
                    res: get("RES"),
                    gather: get("GATHER"),
                    parts: [get("P1"), get("P2"), get("P3")],
                };
                let (body, packed) = ints.launch(true);
                assert_eq!(body.name, "qmm_packed");
                let by_packed = Launch {
                    body,
                    template: packed.as_slice(),
                    ..spec
                };
                let (wrapped, _) = source(&by_packed, &name).unwrap();
                let same = nvrtc.compile(&wrapped, &name, "compute_90", &includes);
                assert!(
                    same.as_deref() == Ok(&ptx[..]),
                    "{template:?} packed: {:?}",
                    same.err()
                );
            }
            // The same body by include (custom_kernel::include).
            let body_file = bodies.path().join(format!("{name}.cuh"));
            std::fs::write(&body_file, spec.body.source).unwrap();
            let line =
                super::super::include::include_line(spec.body.source, &input_names, &body_file)
                    .unwrap();
            let by_include = Launch {
                body: Box::leak(Box::new(Body::new("k", Box::leak(line.into_boxed_str())))),
                ..spec
            };
            // The same arguments and the same PTX as the body wrapped alone.
            let same_as_alone = |launch: &Launch, what: &str| {
                let (wrapped, shaped_here) = source(launch, &name).unwrap();
                assert_eq!(shaped, shaped_here, "{file} {template:?}: {what}");
                let same = nvrtc.compile(&wrapped, &name, "compute_90", &includes);
                assert!(
                    same.as_deref() == Ok(&ptx[..]),
                    "{file} {template:?}: {what} {}",
                    match &same {
                        Ok(_) => "other PTX".to_owned(),
                        Err(log) => log.clone(),
                    }
                );
            };
            same_as_alone(&by_include, "by include");
            // And with the template values written into the source before
            // the include line (custom_kernel::baked), none passed.
            let baked_line = super::super::baked::constants(&template) + by_include.body.source;
            let by_baked = Launch {
                body: Box::leak(Box::new(Body::new(
                    "k",
                    Box::leak(baked_line.into_boxed_str()),
                ))),
                template: &[],
                ..spec
            };
            same_as_alone(&by_baked, "template values in the source");
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}
