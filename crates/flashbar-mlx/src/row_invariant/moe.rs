//! A MoE block's ends for decode steps and verified blocks (docs/gpu.md,
//! "The MoE block in kernels"): the router's choice
//! (`kernels/cuda/moe_route.cu`) and the weighted sum of the experts with
//! the shared expert and the residual (`kernels/cuda/moe_combine.cu`).
//! Between them run the experts' gathered products (`qmm.cu` with
//! `GATHER`, their gate and up maps paired for the GLU end). Each token is
//! computed alone, so a verified block's rows equal a decode step's.

use crate::custom_kernel::{self, Body, Launch};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

static ROUTE: Body = Body::new(
    "moe_route",
    include_str!("../../../../kernels/cuda/moe_route.cu"),
);

static COMBINE: Body = Body::new(
    "moe_combine",
    include_str!("../../../../kernels/cuda/moe_combine.cu"),
);

/// The same body writing the next RMS norm of its output too
/// ([`moe_combine_normed`]).
static COMBINE_NORM: Body = Body::new(
    "moe_combine_norm",
    concat!(
        "#define NORM_OUT 1\n",
        include_str!("../../../../kernels/cuda/moe_combine.cu")
    ),
);

/// The most experts [`moe_route`] chooses from, and a token's most.
pub const MAX_EXPERTS: i32 = 1024;
pub const MAX_TOP_K: i32 = 32;

/// What [`moe_route`] chose: pair `p = t * kp + j` is token t's j-th expert,
/// where `kp` is k, or k + 1 with the shared expert among the experts (each
/// token's last pair: expert E, after the E routed ones).
pub struct Routes {
    /// `[2, T * kp]` int32: (t, expert) of each pair, for the experts'
    /// gate/up product of the token's row.
    pub token_pairs: Array,
    /// `[2, T * kp]` int32: (p, expert), for the down product of the pair's
    /// own row.
    pub pair_pairs: Array,
    /// `[T, k]`, the activations' type: each pair's weight.
    pub scores: Array,
}

/// Whether [`moe_route`] takes `logits` (`[T, S]`, the first `experts`
/// columns the experts') for `k` experts a token. Any number of tokens: a
/// prefill routes by it too, since MLX's top-k on CUDA broke ties between
/// equal probabilities differently from run to run (docs/gpu.md, "The MoE
/// block in four kernels").
pub fn takes_route(logits: &Array, experts: i32, k: i32) -> bool {
    let s = logits.shape();
    s.len() == 2
        && s[0] >= 1
        && s[1] >= experts
        && experts % 32 == 0
        && (32..=MAX_EXPERTS).contains(&experts)
        && (1..=MAX_TOP_K.min(experts)).contains(&k)
        && matches!(logits.dtype(), Dtype::Bfloat16 | Dtype::Float16)
}

/// The router of a MoE block for each token: a precise softmax over the
/// first `experts` logits of its row, rounded to their type, the `k`
/// largest (the lower expert first among equals), divided by their sum
/// when `normalize`. With `shared`, each token's pairs end with one more,
/// for the shared expert stacked after the routed ones as expert `experts`
/// (docs/gpu.md, "The shared expert among the experts"). Check
/// [`takes_route`] first.
pub fn moe_route(
    logits: &Array,
    experts: i32,
    k: i32,
    normalize: bool,
    shared: bool,
) -> Result<Routes, Exception> {
    if !takes_route(logits, experts, k) || (shared && k >= MAX_TOP_K) {
        return Err(Exception::custom(format!(
            "MoE route kernel: unsupported logits {:?} {:?} for {k} of {experts} experts",
            logits.shape(),
            logits.dtype()
        )));
    }
    let tokens = logits.shape()[0];
    let pairs = tokens * (k + i32::from(shared));
    let mut outputs = custom_kernel::launch(&Launch {
        body: &ROUTE,
        input_names: &["logits"],
        output_names: &["pairs_in", "pairs_out", "scores"],
        inputs: &[logits],
        outputs: &[
            (vec![2, pairs], Dtype::Int32),
            (vec![2, pairs], Dtype::Int32),
            (vec![tokens, k], logits.dtype()),
        ],
        grid: [32 * tokens, 1, 1],
        group: [32, 1, 1],
        template: &[
            ("E", experts),
            ("K", k),
            ("NORM", i32::from(normalize)),
            ("HALF", i32::from(logits.dtype() == Dtype::Float16)),
            ("SHARED", i32::from(shared)),
        ],
    })?
    .into_iter();
    match (outputs.next(), outputs.next(), outputs.next()) {
        (Some(token_pairs), Some(pair_pairs), Some(scores)) => Ok(Routes {
            token_pairs,
            pair_pairs,
            scores,
        }),
        _ => Err(Exception::custom("MoE route kernel: missing outputs")),
    }
}

/// Where a MoE block's shared expert output is, for [`moe_combine`].
#[derive(Clone, Copy)]
pub enum Shared<'a> {
    /// `[T, H]`, computed apart.
    Apart(&'a Array),
    /// Each token's last row of `down` (the shared expert ran among the
    /// experts: [`moe_route`] with `shared`).
    InDown,
}

/// Whether [`moe_combine`] takes these arrays: `down` `[T * kp, H]` (kp = k,
/// or k + 1 with the shared expert in it), `scores` `[T, k]`, the shared
/// output `[T, H]` where apart, `gate` `[T, S]` with `gate_column < S`, one
/// type.
pub fn takes_combine(
    down: &Array,
    scores: &Array,
    shared: Shared,
    gate: &Array,
    gate_column: i32,
) -> bool {
    let (d, s, g) = (down.shape(), scores.shape(), gate.shape());
    if d.len() != 2 || s.len() != 2 || g.len() != 2 {
        return false;
    }
    let dtype = down.dtype();
    let (rows_a_token, shared_fits) = match shared {
        Shared::Apart(h) => (s[1], h.shape() == [s[0], d[1]] && h.dtype() == dtype),
        Shared::InDown => (s[1] + 1, true),
    };
    shared_fits
        && g[0] == s[0]
        && d[0] == s[0] * rows_a_token
        && (0..g[1]).contains(&gate_column)
        && (1..=MAX_TOP_K).contains(&rows_a_token)
        && matches!(dtype, Dtype::Bfloat16 | Dtype::Float16)
        && [scores, gate].iter().all(|a| a.dtype() == dtype)
}

/// The arrays a MoE block's last kernel reads ([`moe_combine`]).
#[derive(Clone, Copy)]
pub struct Combine<'a> {
    /// `[T * kp, H]`: each pair's expert output.
    pub down: &'a Array,
    /// `[T, k]`: each pair's weight.
    pub scores: &'a Array,
    pub shared: Shared<'a>,
    /// `[T, S]`: column `gate_column` is the shared expert's gate logit.
    pub gate: &'a Array,
    pub gate_column: i32,
    /// `[T, H]`, added to the output when given.
    pub residual: Option<&'a Array>,
}

/// The MoE block's output for each token t: `sum_j down[t kp + j] *
/// scores[t, j]` plus the shared expert's output times `sigmoid(gate[t,
/// gate_column])`, added onto `residual` when given (`[T, H]`), each step
/// rounded as MLX's ops round it. Check [`takes_combine`] first.
pub fn moe_combine(inputs: Combine) -> Result<Array, Exception> {
    combine(inputs, None)?
        .pop()
        .ok_or_else(|| Exception::custom("MoE combine kernel: no output"))
}

/// [`moe_combine`], and the RMS norm of each output row with `weight`
/// (`[H]`) and `eps` beside it (the next layer's input): a block a token,
/// each row's sum of squares taken in the same order whatever the number of
/// tokens (docs/gpu.md, "The next norm in a MoE block's last kernel").
pub fn moe_combine_normed(
    inputs: Combine,
    weight: &Array,
    eps: f32,
) -> Result<(Array, Array), Exception> {
    let mut outputs = combine(inputs, Some((weight, eps)))?.into_iter();
    match (outputs.next(), outputs.next()) {
        (Some(y), Some(normed)) => Ok((y, normed)),
        _ => Err(Exception::custom("MoE combine kernel: missing outputs")),
    }
}

fn combine(inputs: Combine, norm: Option<(&Array, f32)>) -> Result<Vec<Array>, Exception> {
    let Combine {
        down,
        scores,
        shared,
        gate,
        gate_column,
        residual,
    } = inputs;
    let (tokens, width) = (
        scores.shape().first().copied(),
        down.shape().last().copied(),
    );
    let (tokens, width) = (tokens.unwrap_or(0), width.unwrap_or(0));
    let norm_fits = norm.is_none_or(|(w, _)| w.shape() == [width] && w.dtype() == down.dtype());
    if !takes_combine(down, scores, shared, gate, gate_column)
        || residual.is_some_and(|r| r.shape() != [tokens, width] || r.dtype() != down.dtype())
        || !norm_fits
    {
        return Err(Exception::custom(format!(
            "MoE combine kernel: unsupported down {:?}, scores {:?}, shared {:?}, gate {:?} \
             (column {gate_column}), residual {:?}, norm {:?}",
            down.shape(),
            scores.shape(),
            match shared {
                Shared::Apart(h) => Some(h.shape().to_vec()),
                Shared::InDown => None,
            },
            gate.shape(),
            residual.map(|r| r.shape().to_vec()),
            norm.map(|(w, _)| w.shape().to_vec()),
        )));
    }
    // Inputs the kernel does not read (no residual; the shared output in
    // `down`): `down` stands in for them.
    let own = match shared {
        Shared::Apart(h) => h,
        Shared::InDown => down,
    };
    let res = residual.unwrap_or(down);
    let template = [
        ("K", scores.shape()[1]),
        ("GCOL", gate_column),
        ("RES", i32::from(residual.is_some())),
        ("HALF", i32::from(down.dtype() == Dtype::Float16)),
        ("SHARED", i32::from(matches!(shared, Shared::InDown))),
    ];
    let y = (vec![tokens, width], down.dtype());
    match norm {
        None => custom_kernel::launch(&Launch {
            body: &COMBINE,
            input_names: &["down", "scores", "shared", "gate", "res"],
            output_names: &["y"],
            inputs: &[down, scores, own, gate, res],
            outputs: &[y],
            grid: [tokens * width, 1, 1],
            group: [256, 1, 1],
            template: &template,
        }),
        Some((weight, eps)) => custom_kernel::launch(&Launch {
            body: &COMBINE_NORM,
            input_names: &["down", "scores", "shared", "gate", "res", "nw", "eps"],
            output_names: &["y", "normed"],
            inputs: &[
                down,
                scores,
                own,
                gate,
                res,
                weight,
                &custom_kernel::scalars::float(eps),
            ],
            outputs: &[y.clone(), y],
            grid: [tokens * NORM_THREADS, 1, 1],
            group: [NORM_THREADS, 1, 1],
            template: &template,
        }),
    }
}

/// A token's block in [`moe_combine_normed`].
const NORM_THREADS: i32 = 256;
