//! A gated attention layer's head in one kernel (`kernels/cuda/attn_head.cu`;
//! docs/gpu.md, "The attention's head in one kernel"): the queries' and
//! keys' RMS norms, their partial RoPE, and the heads laid out for the
//! attention kernel, where MLX's ops take six kernels and a graph node for
//! every reshape, split and transpose. Each token is computed alone.

use crate::custom_kernel::{self, Body, Launch};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

static HEAD: Body = Body::new(
    "attn_head",
    include_str!("../../../../kernels/cuda/attn_head.cu"),
);

/// The shape of an attention's head: heads, KV heads, head dim, the RoPE's
/// dims, and whether the query product holds each head's output gate after
/// its queries (the target's gated attention) or the queries alone (the
/// drafter's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadShape {
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub rope_dims: i32,
    pub gated: bool,
}

/// The kernel's float parameters, made once per layer at load: log2 of the
/// RoPE's base (as MLX's `rope` takes it), its position scale, and the
/// norms' epsilon.
pub fn head_params(base: f32, scale: f32, eps: f32) -> Array {
    Array::from_slice(&[base.log2(), scale, eps], &[3])
}

/// Whether [`attention_head`] takes the query product `qg` (`[B, T, heads
/// times 2 head_dim]`) and the key and value products `k`, `v` (`[B, T,
/// kv_heads times head_dim]`) of `shape`, with norm weights `norms`
/// (`[head_dim]`, the activations' type).
pub fn takes_attention_head(
    qg: &Array,
    k: &Array,
    v: &Array,
    norms: [&Array; 2],
    shape: HeadShape,
) -> bool {
    let HeadShape {
        heads,
        kv_heads,
        head_dim,
        rope_dims,
        gated,
    } = shape;
    let (q, ks) = (qg.shape(), k.shape());
    q.len() == 3
        && ks.len() == 3
        && v.shape() == ks
        && q[..2] == ks[..2]
        && q[2] == heads * (1 + i32::from(gated)) * head_dim
        && ks[2] == kv_heads * head_dim
        && head_dim % 32 == 0
        && (32..=1024).contains(&head_dim)
        && rope_dims % 2 == 0
        && (2..=head_dim).contains(&rope_dims)
        && heads > 0
        && kv_heads > 0
        && matches!(qg.dtype(), Dtype::Bfloat16 | Dtype::Float16)
        && k.dtype() == qg.dtype()
        && v.dtype() == qg.dtype()
        && norms
            .iter()
            .all(|w| w.shape() == [head_dim] && w.dtype() == qg.dtype())
}

/// The queries `[B, heads, T, D]` and keys `[B, kv_heads, T, D]` normed by
/// `q_norm`, `k_norm` and rotated for positions `offset..`, and the values
/// `[B, kv_heads, T, D]`: what `rms_norm`, `rope` and the transposes give
/// (each norm's sum of squares in another order, so within a bit of it).
/// The queries are the first half of each head's `2 * head_dim` columns of
/// `qg` (all of its `head_dim` where the shape is not gated). Check
/// [`takes_attention_head`] first.
#[allow(clippy::too_many_arguments)]
pub fn attention_head(
    qg: &Array,
    k: &Array,
    v: &Array,
    q_norm: &Array,
    k_norm: &Array,
    params: &Array,
    offset: i32,
    shape: HeadShape,
) -> Result<[Array; 3], Exception> {
    let d = shape.head_dim;
    if !takes_attention_head(qg, k, v, [q_norm, k_norm], shape) || params.shape() != [3] {
        return Err(Exception::custom(format!(
            "attention head kernel: unsupported query product {:?} {:?}, keys {:?}, values {:?} \
             for {shape:?}",
            qg.shape(),
            qg.dtype(),
            k.shape(),
            v.shape()
        )));
    }
    let (b, t) = (qg.shape()[0], qg.shape()[1]);
    let dtype = if qg.dtype() == Dtype::Bfloat16 { 1 } else { 2 };
    let offset = custom_kernel::scalars::int(offset);
    let blocks = b * t * (shape.heads + 2 * shape.kv_heads);
    let outputs = custom_kernel::launch(&Launch {
        body: &HEAD,
        input_names: &["qg", "k", "v", "qw", "kw", "offset", "params"],
        output_names: &["q_out", "k_out", "v_out"],
        inputs: &[qg, k, v, q_norm, k_norm, &offset, params],
        outputs: &[
            (vec![b, shape.heads, t, d], qg.dtype()),
            (vec![b, shape.kv_heads, t, d], qg.dtype()),
            (vec![b, shape.kv_heads, t, d], qg.dtype()),
        ],
        grid: [blocks * d, 1, 1],
        group: [d, 1, 1],
        template: &[
            ("D", d),
            ("HQ", shape.heads),
            ("HKV", shape.kv_heads),
            ("DIMS", shape.rope_dims),
            ("DT", dtype),
            ("GATED", i32::from(shape.gated)),
        ],
    })?;
    <[Array; 3]>::try_from(outputs).map_err(|_| {
        Exception::custom("the attention head kernel returned other than three outputs")
    })
}
