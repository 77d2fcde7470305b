//! Row-invariant CUDA kernels for decode steps and verified blocks: a
//! quantized matmul and a causal attention whose row i of an M-row call is,
//! bit for bit, the 1-row call on row i (docs/gpu.md, "Row-invariant
//! kernels"). MLX's own kernels switch algorithm between one row and sixteen
//! (its quantized matmul sums in another order from M = 16 on, its attention
//! takes cuDNN for a block), so a verify could pick another token than a
//! decode step at a near tie: DFlash would stop being lossless.
//!
//! The gated-delta layers' depthwise convolution has a kernel here too
//! (`conv_rows`): MLX's conv1d is row-invariant, but on CUDA it builds a
//! cuDNN plan the first time it meets a block length, which a DFlash
//! answer pays every time its last, shorter block is verified.
//!
//! A MoE block's router and its weighted sum have kernels too (`moe`):
//! each token is computed alone, as MLX's ops would compute it.
//!
//! Bodies: `kernels/cuda/qmm.cu`, `kernels/cuda/attn_rows.cu` with
//! `attn_merge.cu`, `kernels/cuda/conv_rows.cu`, `kernels/cuda/moe_route.cu`,
//! `kernels/cuda/moe_combine.cu`, and a gated attention's head (its q/k
//! norms and RoPE) `kernels/cuda/attn_head.cu` (`head`). Only CUDA has
//! them; [`available`] says where. Callers use them for at most [`MAX_ROWS`]
//! rows (decode, verify) and MLX's kernels for longer inputs (prefill,
//! shared by plain decoding and DFlash alike).

use crate::custom_kernel::{self, Body, Launch};
use crate::device::Backend;
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

mod head;
mod moe;
mod qmm;
pub(crate) mod qmm_body;
pub use head::{attention_head, head_params, takes_attention_head, HeadShape};
pub use moe::{
    moe_combine, moe_combine_normed, moe_route, takes_combine, takes_route, Combine, Routes,
    Shared, MAX_EXPERTS, MAX_TOP_K,
};
pub use qmm::{
    gather_quantized_matmul, gather_quantized_matmul_pairs, pair_glu_rows, qmm_launch,
    quantized_matmul, quantized_matmul_parts, quantized_matmul_with, takes_gathered, takes_glu,
    takes_quantized, unpair_glu_columns, Ends, EXPERT_TILE_ENV, GLU_PAIR, LAUNCH_ENV, MAX_PARTS,
    PREFILL_ROWS_ENV, PREFILL_TILE_ENV, WIDE,
};
pub(crate) use qmm::{gather_quantized_matmul_tiled, parts_apart, quantized_matmul_tiled};

static ATTN: Body = Body::new(
    "attn_rows",
    include_str!("../../../../kernels/cuda/attn_rows.cu"),
);

/// The same body for keys and values in buffers with room, the cache's
/// length given apart ([`causal_attention_in`]).
static ATTN_ROOM: Body = Body::new(
    "attn_rows_room",
    concat!(
        "#define KV_ROOM 1\n",
        include_str!("../../../../kernels/cuda/attn_rows.cu")
    ),
);

static MERGE: Body = Body::new(
    "attn_merge",
    include_str!("../../../../kernels/cuda/attn_merge.cu"),
);

static CONV: Body = Body::new(
    "conv_rows",
    include_str!("../../../../kernels/cuda/conv_rows.cu"),
);

/// The most rows (tokens) one call takes: two 16-row tiles of the tensor
/// cores' instruction.
pub const MAX_ROWS: i32 = 32;

/// Threads per block of the attention kernel (its body assumes 256).
const ATTN_THREADS: i32 = 256;

/// Keys per block of the attention kernel (its body's `CHUNK`): the cache
/// is cut into chunks at multiples of this, whatever the call.
const ATTN_CHUNK: i32 = 128;

/// Whether `backend` has these kernels (CUDA only; Metal and the CPU keep
/// their own paths: the CPU's host kernels are row-invariant too).
pub fn available(backend: Backend) -> bool {
    backend == Backend::Cuda && cfg!(not(target_os = "macos"))
}

/// Whether [`causal_attention`] takes these queries `[B, Hq, T, D]`.
pub fn takes_attention(queries: &Array, keys: &Array) -> bool {
    let (q, k) = (queries.shape(), keys.shape());
    q.len() == 4
        && k.len() == 4
        && (1..=MAX_ROWS).contains(&q[2])
        && q[3] % 32 == 0
        && ATTN_THREADS % q[3] == 0
        && k[1] > 0
        && q[1] % k[1] == 0
        && k[2] >= q[2]
        && matches!(
            queries.dtype(),
            Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16
        )
        && keys.dtype() == queries.dtype()
}

/// Causal attention of the T newest positions: `queries` `[B, Hq, T, D]`,
/// `keys` and `values` `[B, Hkv, L, D]` (the whole cache, the T new
/// positions last). Query i attends keys `0..=L-T+i`. Check
/// [`takes_attention`] first.
pub fn causal_attention(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
) -> Result<Array, Exception> {
    heads_view(
        causal_attention_tokens(queries, keys, values, scale)?,
        queries,
    )
}

/// [`causal_attention`] as the output projection reads it, `[B, T, Hq * D]`
/// (no view nodes after the kernel).
pub fn causal_attention_tokens(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
) -> Result<Array, Exception> {
    attention(queries, keys, values, None, scale, true, None)
}

/// [`causal_attention`] over a cache kept in buffers with room: `keys` and
/// `values` `[B, Hkv, CAP, D]`, of which the first `length` positions are
/// the cache (the T new ones last). Each query reads and sums exactly what
/// [`causal_attention`] over the first `length` positions does
/// (docs/gpu.md, "A KV cache with room"). Check [`takes_attention`] first.
pub fn causal_attention_in(
    queries: &Array,
    keys: &Array,
    values: &Array,
    length: i32,
    scale: f32,
) -> Result<Array, Exception> {
    heads_view(
        attention(queries, keys, values, Some(length), scale, true, None)?,
        queries,
    )
}

/// [`causal_attention_in`], or [`causal_attention_gated_in`] with `gate`,
/// as the output projection reads it: `[B, T, Hq * D]`, the kernel's own
/// output with no view nodes after it (each costs the host time in a step).
pub fn causal_attention_in_tokens(
    queries: &Array,
    keys: &Array,
    values: &Array,
    length: i32,
    scale: f32,
    gate: Option<&Array>,
) -> Result<Array, Exception> {
    if let Some(gate) = gate.filter(|g| !takes_attention_gate(queries, g)) {
        return Err(Exception::custom(format!(
            "attention kernel: unsupported gate {:?} {:?} for queries {:?}",
            gate.shape(),
            gate.dtype(),
            queries.shape()
        )));
    }
    attention(queries, keys, values, Some(length), scale, true, gate)
}

/// The kernel's token-major output `[B, T, Hq * D]` as `[B, Hq, T, D]` (a view).
fn heads_view(out: Array, queries: &Array) -> Result<Array, Exception> {
    let q = queries.shape();
    out.reshape(&[q[0], q[2], q[1], q[3]])?
        .transpose_axes(&[0, 2, 1, 3])
}

/// Whether [`causal_attention_gated_in`] takes `gate` for these queries
/// `[B, Hq, T, D]`: the query product `[B, T, Hq * 2D]` (each head's D
/// queries, then its D gate values), bf16 or f16 as the queries.
pub fn takes_attention_gate(queries: &Array, gate: &Array) -> bool {
    let (q, g) = (queries.shape(), gate.shape());
    q.len() == 4
        && g.len() == 3
        && g[0] == q[0]
        && g[1] == q[2]
        && g[2] == q[1] * 2 * q[3]
        && gate.dtype() == queries.dtype()
        && matches!(gate.dtype(), Dtype::Bfloat16 | Dtype::Float16)
}

/// [`causal_attention_in`] with the gated attention's output gate done by
/// the merge: `out * sigmoid(gate)`, each step rounded as MLX's `sigmoid`
/// and `multiply` round it, so the values are those of the ops after
/// [`causal_attention_in`] (docs/gpu.md, "The attention's gate in its
/// merge"). Check [`takes_attention_gate`] first.
pub fn causal_attention_gated_in(
    queries: &Array,
    keys: &Array,
    values: &Array,
    length: i32,
    scale: f32,
    gate: &Array,
) -> Result<Array, Exception> {
    if !takes_attention_gate(queries, gate) {
        return Err(Exception::custom(format!(
            "attention kernel: unsupported gate {:?} {:?} for queries {:?}",
            gate.shape(),
            gate.dtype(),
            queries.shape()
        )));
    }
    heads_view(
        attention(queries, keys, values, Some(length), scale, true, Some(gate))?,
        queries,
    )
}

/// Attention of T queries over all L keys (a drafted block over its
/// context and itself): the same kernel without the causal cut, so a new
/// context length costs no plan and no compile. Check [`takes_attention`]
/// first.
pub fn full_attention(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
) -> Result<Array, Exception> {
    heads_view(
        full_attention_tokens(queries, keys, values, scale)?,
        queries,
    )
}

/// [`full_attention`] as the output projection reads it, `[B, T, Hq * D]`
/// (no view nodes after the kernel).
pub fn full_attention_tokens(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
) -> Result<Array, Exception> {
    attention(queries, keys, values, None, scale, false, None)
}

fn attention(
    queries: &Array,
    keys: &Array,
    values: &Array,
    length: Option<i32>,
    scale: f32,
    causal: bool,
    gate: Option<&Array>,
) -> Result<Array, Exception> {
    let fits = length.is_none_or(|n| (queries.shape()[2]..=keys.shape()[2]).contains(&n));
    if !takes_attention(queries, keys) || values.shape() != keys.shape() || !fits {
        return Err(Exception::custom(format!(
            "attention kernel: unsupported queries {:?} {:?} over keys {:?} and values {:?} \
             (length {length:?})",
            queries.shape(),
            queries.dtype(),
            keys.shape(),
            values.shape()
        )));
    }
    let q = queries.shape();
    let (rows, head_dim) = (q[0] * q[1] * q[2], q[3]);
    let dtype = match queries.dtype() {
        Dtype::Float32 => 0,
        Dtype::Bfloat16 => 1,
        _ => 2,
    };
    let scale = custom_kernel::scalars::float(scale);
    let kv_heads = keys.shape()[1];
    let filled = length.unwrap_or(keys.shape()[2]);
    let chunks = (filled + ATTN_CHUNK - 1) / ATTN_CHUNK;
    let template = [
        ("D", head_dim),
        ("GROUP", q[1] / kv_heads),
        ("DT", dtype),
        ("CAUSAL", i32::from(causal)),
    ];
    // Each chunk's partial softmax, then the chunks merged in order
    // (kernels/cuda/attn_rows.cu, attn_merge.cu).
    let length = length.map(custom_kernel::scalars::int);
    let (body, input_names, inputs): (&Body, &[&str], Vec<&Array>) = match &length {
        Some(n) => (
            &ATTN_ROOM,
            &["q", "k", "v", "scale", "length"],
            vec![queries, keys, values, &scale, n],
        ),
        None => (
            &ATTN,
            &["q", "k", "v", "scale"],
            vec![queries, keys, values, &scale],
        ),
    };
    let partial = custom_kernel::launch(&Launch {
        body,
        input_names,
        output_names: &["part", "stats"],
        inputs: &inputs,
        outputs: &[
            (vec![q[0], q[1], q[2], chunks, head_dim], Dtype::Float32),
            (vec![q[0], q[1], q[2], chunks, 2], Dtype::Float32),
        ],
        grid: [q[0] * kv_heads * chunks * q[2] * ATTN_THREADS, 1, 1],
        group: [ATTN_THREADS, 1, 1],
        template: &template,
    })?;
    let [part, stats] = <[Array; 2]>::try_from(partial)
        .map_err(|_| Exception::custom("the attention kernel returned other than two outputs"))?;
    // Written token-major, `[B, T, Hq * D]`, as the output projection reads
    // it (the callers above make the `[B, Hq, T, D]` view where they want
    // one). Without a gate the body reads none: `part` stands in for it.
    single(custom_kernel::launch(&Launch {
        body: &MERGE,
        input_names: &["part", "stats", "gate"],
        output_names: &["out"],
        inputs: &[&part, &stats, gate.unwrap_or(&part)],
        outputs: &[(vec![q[0], q[2], q[1] * head_dim], queries.dtype())],
        grid: [rows * head_dim, 1, 1],
        group: [head_dim, 1, 1],
        template: &[
            ("D", head_dim),
            ("DT", dtype),
            ("GATE", i32::from(gate.is_some())),
        ],
    })?)
}

/// Whether [`depthwise_conv`] takes `x` `[B, L, C]` with `weight`
/// `[C, K, 1]`: the same float type for both, at most [`MAX_ROWS`] outputs
/// (L - K + 1).
pub fn takes_depthwise_conv(x: &Array, weight: &Array) -> bool {
    let (xs, ws) = (x.shape(), weight.shape());
    xs.len() == 3
        && ws.len() == 3
        && ws[2] == 1
        && ws[0] == xs[2]
        && (1..=8).contains(&ws[1])
        && (1..=MAX_ROWS).contains(&(xs[1] - ws[1] + 1))
        && matches!(x.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
        && weight.dtype() == x.dtype()
}

/// The depthwise convolution `conv1d(x, weight, groups = C)` without
/// padding: `y[b, t, c] = sum_j x[b, t + j, c] * weight[c, j]`, `[B, L - K +
/// 1, C]`, each output summed in the same order whatever the length. Check
/// [`takes_depthwise_conv`] first.
pub fn depthwise_conv(x: &Array, weight: &Array) -> Result<Array, Exception> {
    if !takes_depthwise_conv(x, weight) {
        return Err(Exception::custom(format!(
            "conv kernel: unsupported input {:?} {:?} with weight {:?} {:?}",
            x.shape(),
            x.dtype(),
            weight.shape(),
            weight.dtype()
        )));
    }
    let (xs, width) = (x.shape(), weight.shape()[1]);
    let out = vec![xs[0], xs[1] - width + 1, xs[2]];
    let dtype = match x.dtype() {
        Dtype::Float32 => 0,
        Dtype::Bfloat16 => 1,
        _ => 2,
    };
    let threads: i32 = out.iter().product();
    single(custom_kernel::launch(&Launch {
        body: &CONV,
        input_names: &["x", "w"],
        output_names: &["y"],
        inputs: &[x, weight],
        outputs: &[(out, x.dtype())],
        grid: [threads, 1, 1],
        group: [256, 1, 1],
        template: &[("K", width), ("DT", dtype)],
    })?)
}

pub(crate) fn single(mut outputs: Vec<Array>) -> Result<Array, Exception> {
    match (outputs.pop(), outputs.is_empty()) {
        (Some(one), true) => Ok(one),
        _ => Err(Exception::custom(
            "a row-invariant kernel returned other than one output",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::zeros;

    #[test]
    fn inputs_outside_the_kernels_are_refused_not_launched() {
        let x = zeros::<f32>(&[1, 1, 64]).unwrap();
        let bf = x.as_dtype(Dtype::Bfloat16).unwrap();
        let scales = zeros::<f32>(&[8, 1])
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        assert!(!takes_quantized(&x, &scales, 64, 4), "f32 activations");
        assert!(takes_quantized(&bf, &scales, 64, 4));
        assert!(!takes_quantized(&bf, &scales, 64, 3), "3 bits");
        assert!(!takes_quantized(&bf, &scales, 16, 4), "groups of 16");
        let many = zeros::<f32>(&[1, 33, 64])
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        // More than a decode's rows: a prefill's, 32 rows a tile.
        assert!(takes_quantized(&many, &scales, 64, 4), "33 rows");
        let w = zeros::<u32>(&[8, 8]).unwrap();
        let error = quantized_matmul(&x, &w, &scales, &scales, 64, 4).unwrap_err();
        assert!(error.what().contains("unsupported"), "{}", error.what());
        // The fused ends: a GLU end needs four tiles a block (512 columns
        // on), a residual the output's shape and type.
        let glu = Ends {
            glu: true,
            residual: None,
        };
        let error = quantized_matmul_with(&bf, &w, &scales, &scales, 64, 4, glu).unwrap_err();
        assert!(error.what().contains("no GLU end"), "{}", error.what());
        assert!(takes_glu(24_576, 4096, 4) && takes_glu(2304, 384, 8));
        assert!(!takes_glu(256, 64, 4), "two tiles a block");
        for residual in [
            zeros::<f32>(&[1, 1, 8]).unwrap(),
            zeros::<f32>(&[1, 2, 8])
                .unwrap()
                .as_dtype(Dtype::Bfloat16)
                .unwrap(),
        ] {
            let ends = Ends {
                glu: false,
                residual: Some(&residual),
            };
            let error = quantized_matmul_with(&bf, &w, &scales, &scales, 64, 4, ends).unwrap_err();
            assert!(error.what().contains("residual"), "{}", error.what());
        }

        let q = zeros::<f32>(&[1, 6, 16, 64]).unwrap();
        let k = zeros::<f32>(&[1, 2, 40, 64]).unwrap();
        assert!(takes_attention(&q, &k));
        assert!(
            !takes_attention(&q, &zeros::<f32>(&[1, 4, 40, 64]).unwrap()),
            "6 heads over 4"
        );
        assert!(
            !takes_attention(&q, &zeros::<f32>(&[1, 2, 8, 64]).unwrap()),
            "cache shorter than the block"
        );
        assert!(
            !takes_attention(&zeros::<f32>(&[1, 6, 16, 80]).unwrap(), &k),
            "head dim 80"
        );
    }

    #[test]
    fn a_cpu_stream_is_an_error_not_a_crash() {
        mlx_rs::with_device(mlx_rs::Device::cpu(), || {
            let x = zeros::<f32>(&[2, 64])
                .unwrap()
                .as_dtype(Dtype::Bfloat16)
                .unwrap();
            let scales = zeros::<f32>(&[8, 1])
                .unwrap()
                .as_dtype(Dtype::Bfloat16)
                .unwrap();
            let w = zeros::<u32>(&[8, 8]).unwrap();
            let error = quantized_matmul(&x, &w, &scales, &scales, 64, 4).unwrap_err();
            assert!(error.what().contains("GPU stream"), "{}", error.what());
        });
    }
}
