//! Unit tests of the GDN kernels' Rust side (the kernels themselves run in
//! `flashbar smoke` on a GPU).

use super::*;
use crate::custom_kernel::{launch_on, Cuda, Metal};
use mlx_rs::{with_device, Device, Stream};

#[test]
fn only_gpu_backends_have_the_kernels() {
    assert!(!available(Backend::Cpu));
    assert_ne!(available(Backend::Cuda), available(Backend::Metal));
}

#[test]
fn names_are_plain_identifiers() {
    assert!(source::RECORD
        .full_name()
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_'));
    assert_ne!(source::RECORD.full_name(), source::REPLAY.full_name());
}

/// Every kernel body of both backends, whatever this build targets.
const BODIES: [(&str, &str, &str); 4] = [
    (
        "cuda/gdn_record",
        include_str!("../../../../kernels/cuda/gdn_record.cu"),
        "q_shape",
    ),
    (
        "cuda/gdn_replay",
        include_str!("../../../../kernels/cuda/gdn_replay.cu"),
        "k_shape",
    ),
    (
        "metal/gdn_record",
        include_str!("../../../../kernels/metal/gdn_record.metal"),
        "q_shape",
    ),
    (
        "metal/gdn_replay",
        include_str!("../../../../kernels/metal/gdn_replay.metal"),
        "k_shape",
    ),
];

#[test]
fn the_bodies_ask_mlx_for_no_unexpected_arguments() {
    // MLX adds an `<input>_shape/_strides/_ndim` argument for each such
    // name it finds anywhere in a body (comments included).
    let inputs = [
        "q", "k", "v", "g", "beta", "state", "state0", "delta", "n_steps",
    ];
    for (file, body, used) in BODIES {
        for input in inputs {
            for suffix in ["_shape", "_strides", "_ndim"] {
                let name = format!("{input}{suffix}");
                assert_eq!(body.contains(&name), name == used, "{file}: {name}");
            }
        }
    }
    // Metal also declares every thread attribute whose name appears.
    let attributes = [
        "grid_origin",
        "grid_size",
        "quadgroup",
        "simdgroup",
        "thread_execution_width",
        "thread_index_in",
        "thread_position_in_threadgroup",
        "threadgroup_position_in_grid",
        "threadgroups_per_grid",
        "threads_per_grid",
        "threads_per_threadgroup",
    ];
    for (file, body, _) in &BODIES[2..] {
        assert!(body.contains("thread_position_in_grid"), "{file}");
        for attribute in attributes {
            assert!(!body.contains(attribute), "{file}: {attribute}");
        }
    }
}

#[test]
fn the_build_uses_its_backends_bodies() {
    let (record, replay) = if cfg!(target_os = "macos") {
        (BODIES[2].1, BODIES[3].1)
    } else {
        (BODIES[0].1, BODIES[1].1)
    };
    assert_eq!(source::RECORD.source, record);
    assert_eq!(source::REPLAY.source, replay);
}

#[test]
fn a_cpu_libmlx_refuses_cuda_kernels_without_aborting() {
    if mlx_sys::MLX_LIBRARY != "cpu" {
        return;
    }
    // Any mlx-rs op installs mlx-rs' error handler (mlx-c's own exits).
    zeros(&[1]);
    let body = crate::custom_kernel::Body::new("gdn_record", BODIES[0].1);
    let kernel = crate::custom_kernel::Kernel::<Cuda>::new(&body, &["q"], &["y"], &[]);
    let error = kernel.err().expect("a CPU libmlx has no CUDA kernels");
    assert!(
        error.what().contains("could not create"),
        "{}",
        error.what()
    );
}

#[test]
fn a_refused_launch_is_an_error_and_frees_its_handles() {
    // MLX creates Metal kernels on any build and refuses to run one on a
    // CPU stream, which takes the launcher through every mlx-c call.
    let (state, k) = (zeros(&[1, 2, 3, 4]), zeros(&[1, 5, 1, 4]));
    let (g, delta) = (zeros(&[1, 5, 2]), zeros(&[1, 5, 2, 3]));
    let n_steps = Array::from_slice(&[2], &[1]);
    static BODY: crate::custom_kernel::Body =
        crate::custom_kernel::Body::new("gdn_replay", BODIES[3].1);
    let spec = Launch {
        body: &BODY,
        input_names: &["state0", "k", "g", "delta", "n_steps"],
        output_names: &["state_out"],
        inputs: &[&state, &k, &g, &delta, &n_steps],
        output_shapes: &[vec![1, 2, 3, 4]],
        dims: Dims::of(&k, &delta, &state).unwrap(),
    };
    let error = spec
        .run(|launch| launch_on::<Metal>(launch, &Stream::cpu()))
        .unwrap_err();
    assert!(
        error.what().contains("launching failed"),
        "{}",
        error.what()
    );
}

fn zeros(shape: &[i32]) -> Array {
    mlx_rs::ops::zeros::<f32>(shape).unwrap()
}

#[test]
fn bad_shapes_and_cpu_streams_are_errors_not_crashes() {
    with_device(Device::cpu(), || {
        let (q, v) = (zeros(&[1, 3, 2, 8]), zeros(&[1, 3, 4, 4]));
        let (g, state) = (zeros(&[1, 3, 4]), zeros(&[1, 4, 4, 8]));
        let error = record(&q, &q, &v, &g, &g, &zeros(&[1, 4, 4, 7])).unwrap_err();
        assert!(error.what().contains("state"), "{}", error.what());
        let error = replay(&state, &q, &g, &v, 4).unwrap_err();
        assert!(error.what().contains("outside"), "{}", error.what());
        let error = record(&q, &q, &v, &g, &g, &state).unwrap_err();
        assert!(error.what().contains("GPU stream"), "{}", error.what());
    });
}

#[test]
fn the_layer_body_asks_mlx_for_qkv_shape_only() {
    for input in layer::INPUT_NAMES {
        for suffix in ["_shape", "_strides", "_ndim"] {
            let name = format!("{input}{suffix}");
            assert_eq!(
                layer::SOURCE.contains(&name),
                name == "qkv_shape",
                "gdn_layer: {name}"
            );
        }
    }
}

#[test]
fn the_layer_kernel_is_cuda_only_and_refuses_what_it_cannot_run() {
    assert!(!layer_available(Backend::Cpu));
    assert!(!layer_available(Backend::Metal));
    let shape = LayerShape {
        hk: 2,
        hv: 4,
        dk: 8,
        dv: 8,
        conv_kernel: 4,
        qk_eps: 1e-6,
        norm_eps: 1e-6,
        q_scale: 1.0,
        k_scale: 1.0,
    };
    assert!(shape.supported());
    assert!(!LayerShape { hv: 3, ..shape }.supported());
    assert!(!LayerShape { dv: 2048, ..shape }.supported());
    // A tile's arrays past 48 KB of static shared memory: the ops path.
    assert!(LayerShape {
        dk: 128,
        dv: 128,
        ..shape
    }
    .supported());
    assert!(LayerShape {
        dk: 256,
        dv: 256,
        ..shape
    }
    .supported());
    assert!(!LayerShape {
        dk: 512,
        dv: 512,
        ..shape
    }
    .supported());
    assert_eq!(
        LayerShape {
            dk: 128,
            dv: 128,
            ..shape
        }
        .shared_bytes(),
        16_480
    );
    let channels = 2 * 2 * 8 + 4 * 8;
    let params = LayerParams::new(
        &shape,
        &zeros(&[channels, 4, 1]),
        &zeros(&[4]),
        &zeros(&[4]),
        &zeros(&[8]),
    )
    .unwrap();
    let wrong = LayerParams::new(
        &shape,
        &zeros(&[channels, 3, 1]),
        &zeros(&[4]),
        &zeros(&[4]),
        &zeros(&[8]),
    );
    assert!(wrong.is_err());
    with_device(Device::cpu(), || {
        let (qkv, z, ba) = (
            zeros(&[1, 2, channels]),
            zeros(&[1, 2, 32]),
            zeros(&[1, 2, 4]),
        );
        let (conv, state) = (zeros(&[1, 3, channels]), zeros(&[1, 4, 8, 8]));
        let error = layer(
            &shape,
            &params,
            &qkv,
            &z,
            &ba,
            &ba,
            &conv,
            &zeros(&[1, 4, 8, 7]),
        )
        .err()
        .unwrap();
        assert!(error.what().contains("state"), "{}", error.what());
        let error = layer(
            &shape,
            &params,
            &qkv,
            &zeros(&[1, 2, 31]),
            &ba,
            &ba,
            &conv,
            &state,
        )
        .err()
        .unwrap();
        assert!(error.what().contains("z"), "{}", error.what());
        let error = layer(&shape, &params, &qkv, &z, &ba, &ba, &conv, &state)
            .err()
            .unwrap();
        assert!(error.what().contains("GPU stream"), "{}", error.what());
    });
}
