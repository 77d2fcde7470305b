//! `gdn_layer` (`kernels/cuda/gdn_layer.cu`): a gated-delta layer's middle in
//! one launch, from its input projections' outputs to the input of its
//! output projection, with the rollback tape (docs/gpu.md, "One kernel per
//! gated-delta layer"). CUDA only; Metal and the CPU keep the op-by-op path.

use super::{expect_shape, Backend};
use crate::custom_kernel::{self, Body};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

/// Whether `backend` has the fused layer kernel.
pub fn layer_available(backend: Backend) -> bool {
    backend == Backend::Cuda && cfg!(not(target_os = "macos"))
}

/// A layer's sizes and the constants the kernel is built for.
#[derive(Clone, Copy, Debug)]
pub struct LayerShape {
    pub hk: i32,
    pub hv: i32,
    pub dk: i32,
    pub dv: i32,
    pub conv_kernel: i32,
    /// The q/k RMS norm's epsilon (on the sum of squares' mean).
    pub qk_eps: f32,
    /// The gated RMSNorm's epsilon.
    pub norm_eps: f32,
    /// Factors applied to the normalized q and k, rounded to the
    /// activations' type first (as a scalar of that type is).
    pub q_scale: f32,
    pub k_scale: f32,
}

impl LayerShape {
    /// Whether the kernel can take this shape: a value head's rows fit one
    /// block, and a tile's q, k, v and outputs fit its static shared memory
    /// (48 KB; 128-wide heads take 16.1 KB). Another shape runs the ops path.
    pub fn supported(&self) -> bool {
        (1..=1024).contains(&self.dv)
            && (1..=1024).contains(&self.dk)
            && (1..=8).contains(&self.conv_kernel)
            && self.hk >= 1
            && self.hv % self.hk == 0
            && self.shared_bytes() <= 48 * 1024
    }

    /// The kernel's shared arrays: `qk[TT][2 DK]`, `vs` and `ys[TT][DV]`,
    /// and three of `[TT]` floats, with TT = 8 steps a tile (gdn_layer.cu).
    pub(super) fn shared_bytes(&self) -> i64 {
        const TT: i64 = 8;
        4 * TT * (2 * self.dk as i64 + 2 * self.dv as i64 + 3)
    }

    fn channels(&self) -> i32 {
        2 * self.hk * self.dk + self.hv * self.dv
    }
}

/// The layer's weights besides its linear maps, made once at load: each in
/// f32 (exactly the checkpoint's values), with the types two of them came
/// in, which decide how the ops path rounds `a + dt_bias` and the norm.
pub struct LayerParams {
    conv_weight: Array,
    a_log: Array,
    dt_bias: Array,
    norm_weight: Array,
    dt_bias_type: Dtype,
    norm_type: Dtype,
    consts: Array,
}

impl LayerParams {
    /// `conv_weight` `[C, K, 1]`, `a_log` and `dt_bias` `[Hv]`, `norm_weight` `[Dv]`.
    pub fn new(
        shape: &LayerShape,
        conv_weight: &Array,
        a_log: &Array,
        dt_bias: &Array,
        norm_weight: &Array,
    ) -> Result<Self, Exception> {
        let f32 = |array: &Array| -> Result<Array, Exception> {
            let values = array.as_dtype(Dtype::Float32)?.flatten(None, None)?;
            values.eval()?;
            Ok(values)
        };
        let params = LayerParams {
            conv_weight: f32(conv_weight)?,
            a_log: f32(a_log)?,
            dt_bias: f32(dt_bias)?,
            norm_weight: f32(norm_weight)?,
            dt_bias_type: dt_bias.dtype(),
            norm_type: norm_weight.dtype(),
            consts: Array::from_slice(
                &[shape.qk_eps, shape.norm_eps, shape.q_scale, shape.k_scale],
                &[4],
            ),
        };
        let sizes = [
            (
                "conv weight",
                &params.conv_weight,
                shape.channels() * shape.conv_kernel,
            ),
            ("A_log", &params.a_log, shape.hv),
            ("dt_bias", &params.dt_bias, shape.hv),
            ("norm weight", &params.norm_weight, shape.dv),
        ];
        for (what, array, size) in sizes {
            if array.size() != size as usize {
                return Err(Exception::custom(format!(
                    "gdn_layer: {what} has {} values, expected {size}",
                    array.size()
                )));
            }
        }
        Ok(params)
    }
}

/// A state row runs over four threads where the shape allows (docs/gpu.md,
/// "A state row over four threads"); `1` asks for a thread a row. The
/// default since an H100 timed both (2026-12-07): its dot products sum in
/// another order than a thread a row's, the same for every T, so a verify
/// still equals its decode steps.
pub const SPLIT_ENV: &str = "FLASHBAR_GDN_SPLIT";

fn split_asked() -> i32 {
    static SPLIT: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *SPLIT.get_or_init(|| match std::env::var(SPLIT_ENV).as_deref() {
        Ok("1") => 1,
        _ => 4,
    })
}

/// The threads a state row gets: `asked` where DK divides into its float4
/// columns and the block stays within 1,024 threads, else one.
fn split_for(shape: &LayerShape, asked: i32) -> i32 {
    if asked > 1 && shape.dk % (4 * asked) == 0 && asked * shape.dv <= 1024 {
        asked
    } else {
        1
    }
}

/// The type MLX gives a binary op of two float types: the same type, else f32.
fn promoted(a: Dtype, b: Dtype) -> Dtype {
    if a == b {
        a
    } else {
        Dtype::Float32
    }
}

/// What the kernel returns: the gated norm's output `[B, T, Hv*Dv]` in the
/// activations' type, the new recurrent state `[B, Hv, Dv, Dk]` (f32) and
/// conv state `[B, K-1, C]`, and the tape: normalized keys `[B, T, Hk,
/// Dk]`, decays `[B, T, Hv]` and per-step updates `[B, T, Hv, Dv]` (f32),
/// what [`super::replay`] takes.
pub struct LayerOutputs {
    pub out: Array,
    pub state: Array,
    pub conv_state: Array,
    pub k: Array,
    pub g: Array,
    pub delta: Array,
}

/// The kernel's inputs, in the order `layer` passes them.
pub(super) const INPUT_NAMES: [&str; 11] = [
    "qkv",
    "z",
    "b_in",
    "a_in",
    "conv_state",
    "conv_w",
    "a_log",
    "dt_bias",
    "norm_w",
    "consts",
    "state",
];

static LAYER: Body = Body::new(
    "gdn_layer",
    include_str!("../../../../kernels/cuda/gdn_layer.cu"),
);

/// The kernel's code for a float type: 0 f32, 1 bf16, 2 f16.
fn type_code(dtype: Dtype) -> Result<i32, Exception> {
    match dtype {
        Dtype::Float32 => Ok(0),
        Dtype::Bfloat16 => Ok(1),
        Dtype::Float16 => Ok(2),
        other => Err(Exception::custom(format!(
            "gdn_layer: activations of type {other:?} are not supported"
        ))),
    }
}

/// Runs the layer's middle over the T tokens of `qkv` `[B, T, C]`, `z`
/// `[B, T, Hv*Dv]`, `b` and `a` `[B, T, Hv]` (all the activations' type),
/// from `conv_state` `[B, K-1, C]` and `state` `[B, Hv, Dv, Dk]` (f32).
#[allow(clippy::too_many_arguments)]
pub fn layer(
    shape: &LayerShape,
    params: &LayerParams,
    qkv: &Array,
    z: &Array,
    b: &Array,
    a: &Array,
    conv_state: &Array,
    state: &Array,
) -> Result<LayerOutputs, Exception> {
    if !shape.supported() {
        return Err(Exception::custom(format!(
            "gdn_layer: unsupported sizes {shape:?}"
        )));
    }
    let dtype = qkv.dtype();
    let qs = qkv.shape();
    if qs.len() != 3 {
        return Err(Exception::custom(format!(
            "gdn_layer: expected qkv [B, T, C], got {qs:?}"
        )));
    }
    let (batch, steps, channels) = (qs[0], qs[1], shape.channels());
    let (hk, hv, dk, dv) = (shape.hk, shape.hv, shape.dk, shape.dv);
    let window = shape.conv_kernel - 1;
    expect_shape("qkv", qkv, &[batch, steps, channels])?;
    expect_shape("z", z, &[batch, steps, hv * dv])?;
    expect_shape("b", b, &[batch, steps, hv])?;
    expect_shape("a", a, &[batch, steps, hv])?;
    expect_shape("conv_state", conv_state, &[batch, window, channels])?;
    expect_shape("state", state, &[batch, hv, dv, dk])?;
    for (what, array) in [("z", z), ("b", b), ("a", a), ("conv_state", conv_state)] {
        if array.dtype() != dtype {
            return Err(Exception::custom(format!(
                "gdn_layer: {what} is {:?}, qkv {dtype:?}",
                array.dtype()
            )));
        }
    }
    let state = state.as_dtype(Dtype::Float32)?;
    let split = split_for(shape, split_asked());
    let threads = (split * dv + 31) / 32 * 32;
    let template = [
        ("HK", hk),
        ("HV", hv),
        ("DK", dk),
        ("DV", dv),
        ("K", shape.conv_kernel),
        ("SPLIT", split),
        ("NT", threads),
        ("DT", type_code(dtype)?),
        ("RA", type_code(promoted(dtype, params.dt_bias_type))?),
        ("RN", type_code(promoted(dtype, params.norm_type))?),
    ];
    let per_step = vec![batch, steps, hv, dv];
    let outputs = custom_kernel::launch(&custom_kernel::Launch {
        body: &LAYER,
        input_names: &INPUT_NAMES,
        output_names: &["out", "state_out", "conv_out", "k_tape", "g_tape", "delta"],
        inputs: &[
            qkv,
            z,
            b,
            a,
            conv_state,
            &params.conv_weight,
            &params.a_log,
            &params.dt_bias,
            &params.norm_weight,
            &params.consts,
            &state,
        ],
        outputs: &[
            (vec![batch, steps, hv * dv], dtype),
            (vec![batch, hv, dv, dk], Dtype::Float32),
            (vec![batch, window, channels], dtype),
            (vec![batch, steps, hk, dk], Dtype::Float32),
            (vec![batch, steps, hv], Dtype::Float32),
            (per_step, Dtype::Float32),
        ],
        grid: [batch * hv * threads, 1, 1],
        group: [threads, 1, 1],
        template: &template,
    })?;
    let mut outputs = outputs.into_iter();
    match (
        outputs.next(),
        outputs.next(),
        outputs.next(),
        outputs.next(),
        outputs.next(),
        outputs.next(),
    ) {
        (Some(out), Some(state), Some(conv_state), Some(k), Some(g), Some(delta)) => {
            Ok(LayerOutputs {
                out,
                state,
                conv_state,
                k,
                g,
                delta,
            })
        }
        _ => Err(Exception::custom("gdn_layer returned too few outputs")),
    }
}

/// The layer kernel's source, for the tests of its arguments.
#[cfg(test)]
pub(super) const SOURCE: &str = include_str!("../../../../kernels/cuda/gdn_layer.cu");

#[cfg(test)]
mod split_tests {
    use super::*;

    fn shape(dk: i32, dv: i32) -> LayerShape {
        LayerShape {
            hk: 1,
            hv: 1,
            dk,
            dv,
            conv_kernel: 4,
            qk_eps: 1e-6,
            norm_eps: 1e-6,
            q_scale: 1.0,
            k_scale: 1.0,
        }
    }

    #[test]
    fn a_row_splits_only_where_its_columns_and_the_block_allow() {
        assert_eq!(split_for(&shape(128, 128), 4), 4);
        assert_eq!(split_for(&shape(64, 64), 4), 4);
        assert_eq!(split_for(&shape(128, 128), 1), 1);
        // 40 columns are not whole float4 groups of four threads
        assert_eq!(split_for(&shape(40, 128), 4), 1);
        // 4 x 512 threads would pass the block's limit
        assert_eq!(split_for(&shape(128, 512), 4), 1);
        assert_eq!(split_for(&shape(128, 256), 4), 4);
    }
}
