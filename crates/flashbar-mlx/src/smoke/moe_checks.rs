//! `flashbar smoke`'s check of a MoE block in its kernels, on a GPU
//! (docs/gpu.md, "The MoE block in kernels"): the router's choice, the
//! experts' paired gate/up product with its GLU end, their down product and
//! the weighted sum onto the residual, for 1-32 tokens against 1-token
//! calls (bit for bit), for a prefill's block whose experts each meet more
//! than 32 tokens (one tile after another, of 32 rows and of 64), with the
//! shared expert among the experts against it apart (bit for bit),
//! against MLX's ops over the same weights, and the block's last kernel
//! writing the next layer's RMS norm too.

use super::row_invariant_checks::{
    largest_relative, rows_and_reference, rows_differing, values, ROWS,
};
use super::CheckResult;
use crate::row_invariant::{
    gather_quantized_matmul_tiled, moe_combine, moe_combine_normed, moe_route, pair_glu_rows,
    quantized_matmul, quantized_matmul_with, Combine, Ends, Shared,
};
use mlx_rs::error::Exception;
use mlx_rs::fast::rms_norm;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, concatenate, gather_qmm, quantize, sigmoid, softmax_axis};
use mlx_rs::{Array, Dtype};

const EXPERTS: i32 = 64;
const TOP: i32 = 4;
const HIDDEN: i32 = 256;
/// An expert's hidden width: its gate and up paired make 512 rows, the
/// narrowest the GLU end takes (four tiles a block).
const INNER: i32 = 256;
/// Enough tokens that every expert meets 80 of them: a prefill's block,
/// more than one tile an expert, of 32 rows or of 64.
const TOKENS: i32 = 1280;

pub(crate) fn moe_block() -> Result<Vec<CheckResult>, Exception> {
    let (dtype, bits, group) = (Dtype::Bfloat16, 4, 64);
    let weight = |seed, shape: &[i32]| -> Result<(Array, Array, Array), Exception> {
        let w = values(seed, shape, Dtype::Float32)?.multiply(Array::from_f32(0.05))?;
        quantize(&w.as_dtype(dtype)?, group, bits)
    };
    let (gq, gs, gb) = weight(500, &[EXPERTS, INNER, HIDDEN])?;
    let (uq, us, ub) = weight(501, &[EXPERTS, INNER, HIDDEN])?;
    let (dq, ds, db) = weight(502, &[EXPERTS, HIDDEN, INNER])?;
    let (pq, ps, pb) = (
        pair_glu_rows(&gq, &uq)?,
        pair_glu_rows(&gs, &us)?,
        pair_glu_rows(&gb, &ub)?,
    );
    // Router logits with the shared gate's after them (a stacked product):
    // each token's experts a quarter apart, so no two probabilities are
    // equal in bf16 and MLX's top-k and the kernel's choose alike.
    let logits: Vec<f32> = (0..TOKENS)
        .flat_map(|t| {
            (0..=EXPERTS).map(move |e| match e {
                EXPERTS => ((t % 7) as f32 - 3.0) * 0.7,
                _ => ((e * 37 + t * 11) % EXPERTS) as f32 * 0.25 - 8.0,
            })
        })
        .collect();
    let logits = Array::from_slice(&logits, &[TOKENS, EXPERTS + 1]).as_dtype(dtype)?;
    let x = values(503, &[TOKENS, HIDDEN], dtype)?;
    let shared = values(504, &[TOKENS, HIDDEN], dtype)?;
    let residual = values(505, &[TOKENS, HIDDEN], dtype)?;

    // A prefill's experts take their rows `tile` at a time.
    let block = |tokens: std::ops::Range<i32>, tile: i32| -> Result<Array, Exception> {
        let count = tokens.len() as i32;
        let routes = moe_route(&logits.index(tokens.clone()), EXPERTS, TOP, true, false)?;
        let hidden = gather_quantized_matmul_tiled(
            &x.index(tokens.clone()),
            &pq,
            &ps,
            &pb,
            &routes.token_pairs,
            count,
            group,
            bits,
            true,
            tile,
        )?;
        let down = gather_quantized_matmul_tiled(
            &hidden,
            &dq,
            &ds,
            &db,
            &routes.pair_pairs,
            count,
            group,
            bits,
            false,
            tile,
        )?;
        moe_combine(Combine {
            down: &down,
            scores: &routes.scores,
            shared: Shared::Apart(&shared.index(tokens.clone())),
            gate: &logits.index(tokens.clone()),
            gate_column: EXPERTS,
            residual: Some(&residual.index(tokens)),
        })
    };
    let singles = (0..TOKENS)
        .map(|t| block(t..t + 1, 32))
        .collect::<Result<Vec<_>, _>>()?;
    let singles = concatenate(&singles, 0)?;
    let mut differing = 0.0;
    for m in ROWS {
        differing += rows_differing(&block(0..m, 32)?, &singles.index(..m), 0)?;
    }
    let mut long = 0.0;
    for tile in [32, 64] {
        long += rows_differing(&block(0..TOKENS, tile)?, &singles, 0)?;
    }

    // The ops path of the same block (nn/moe.rs), the maps apart.
    let probs = softmax_axis(logits.index((.., ..EXPERTS)), -1, true)?;
    let experts = argpartition_axis(&probs, -TOP, -1)?.index((.., -TOP..));
    let scores = probs.take_along_axis(&experts, -1)?;
    let scores = scores.divide(scores.sum_axis(-1, true)?)?;
    let rows = x.expand_dims_axes(&[-2, -3])?; // [T, 1, 1, H]
    let gathered = |x: &Array, w: &Array, s: &Array, b: &Array| {
        gather_qmm(x, w, s, b, None, &experts, true, group, bits, false)
    };
    let gate = gathered(&rows, &gq, &gs, &gb)?;
    let hidden = gate
        .multiply(sigmoid(&gate)?)?
        .multiply(gathered(&rows, &uq, &us, &ub)?)?;
    let down = gathered(&hidden, &dq, &ds, &db)?.squeeze_axes(&[-2])?; // [T, k, H]
    let routed = down
        .multiply(scores.expand_dims(-1)?)?
        .sum_axis(-2, false)?;
    let gated = shared.multiply(sigmoid(logits.index((.., EXPERTS..)))?)?;
    let reference = residual.add(routed.add(gated)?)?;
    let versus_ops = largest_relative(&singles, &reference)?;
    let [rows, reference] = rows_and_reference(
        ("moe_block_rows_invariant", differing),
        ("moe_block_vs_ops", versus_ops),
        // bf16 dequantization in the experts' products, and the experts'
        // outputs summed in the kernel's order (largest weight first)
        // where MLX's top-k leaves its own: rounding only.
        3e-2,
        super::host_f32(&singles.index(..2))?,
    );
    let long = CheckResult {
        name: "moe_block_prefill_rows_invariant",
        max_error: long,
        tolerance: 0.0,
        cross_device_tolerance: f64::INFINITY,
        output: Vec::new(),
    };
    let folded = CheckResult {
        name: "moe_block_shared_in_experts",
        max_error: shared_in_experts(&logits, &x, &residual, (&pq, &ps, &pb), (&dq, &ds, &db))?,
        tolerance: 0.0,
        cross_device_tolerance: f64::INFINITY,
        output: Vec::new(),
    };
    let [normed_rows, normed_reference] = next_norm(&logits, &residual)?;
    Ok(vec![
        rows,
        long,
        reference,
        folded,
        normed_rows,
        normed_reference,
    ])
}

/// The combine writing the next layer's RMS norm beside its output
/// (`moe_combine_normed`; docs/gpu.md, "The next norm in a MoE block's
/// last kernel"), for 1-32 tokens and with the shared expert apart and
/// among the experts: its output must be the plain combine's bit for bit,
/// its norm's rows those of 1-token calls bit for bit (rows differing, both
/// summed into the first check), and the norm within rounding of MLX's
/// `rms_norm` of that output.
fn next_norm(logits: &Array, residual: &Array) -> Result<[CheckResult; 2], Exception> {
    let dtype = Dtype::Bfloat16;
    let most = ROWS.iter().copied().max().unwrap_or(1);
    let eps = 1e-6;
    let weight = values(509, &[HIDDEN], Dtype::Float32)?
        .multiply(Array::from_f32(0.5))?
        .add(Array::from_f32(1.0))?
        .as_dtype(dtype)?;
    let (mut differing, mut versus_mlx) = (0.0, 0.0f64);
    for fold in [false, true] {
        let kp = TOP + i32::from(fold);
        let down = values(510, &[most * kp, HIDDEN], dtype)?;
        let scores = values(511, &[most, TOP], dtype)?.abs()?;
        let shared = values(512, &[most, HIDDEN], dtype)?;
        let shared = |tokens: std::ops::Range<i32>| match fold {
            true => Ok::<_, Exception>(None),
            false => Ok(Some(shared.index(tokens))),
        };
        let call = |tokens: std::ops::Range<i32>, norm: bool| -> Result<_, Exception> {
            let pairs = tokens.start * kp..tokens.end * kp;
            let own = shared(tokens.clone())?;
            let own = own.as_ref().map_or(Shared::InDown, Shared::Apart);
            let (down, scores) = (down.index(pairs), scores.index(tokens.clone()));
            let (gate, res) = (logits.index(tokens.clone()), residual.index(tokens));
            let inputs = Combine {
                down: &down,
                scores: &scores,
                shared: own,
                gate: &gate,
                gate_column: EXPERTS,
                residual: Some(&res),
            };
            match norm {
                true => moe_combine_normed(inputs, &weight, eps).map(|(y, n)| (y, Some(n))),
                false => moe_combine(inputs).map(|y| (y, None)),
            }
        };
        let singles = (0..most)
            .map(|t| call(t..t + 1, true).map(|(_, n)| n))
            .collect::<Result<Option<Vec<_>>, _>>()?
            .unwrap_or_default();
        let singles = concatenate(&singles, 0)?;
        for m in ROWS {
            let (y, normed) = call(0..m, true)?;
            let (plain, _) = call(0..m, false)?;
            differing += rows_differing(&y, &plain, 0)?;
            if let Some(normed) = normed {
                differing += rows_differing(&normed, &singles.index(..m), 0)?;
                let reference = rms_norm(&y, Some(&weight), eps)?;
                versus_mlx = versus_mlx.max(largest_relative(&normed, &reference)?);
            }
        }
    }
    Ok(rows_and_reference(
        ("moe_combine_norm_rows_invariant", differing),
        // f32 sums of squares in another order than MLX's kernel, then one
        // bf16 rounding: a last-place difference at most.
        ("moe_combine_norm_vs_mlx", versus_mlx),
        1e-2,
        Vec::new(),
    ))
}

/// Rows that differ between the block with a real shared expert run apart
/// (its two products of their own, as a prefill runs it) for one token at a
/// time, and the block with the shared expert stacked after the experts as
/// expert E and run among them (`moe_route`'s `shared`; docs/gpu.md, "The
/// shared expert among the experts") for 1-32 tokens: the same instructions
/// sum every output, so none may differ.
fn shared_in_experts(
    logits: &Array,
    x: &Array,
    residual: &Array,
    glu: (&Array, &Array, &Array),
    down: (&Array, &Array, &Array),
) -> Result<f64, Exception> {
    let (dtype, bits, group) = (Dtype::Bfloat16, 4, 64);
    let weight = |seed, shape: &[i32]| -> Result<(Array, Array, Array), Exception> {
        let w = values(seed, shape, Dtype::Float32)?.multiply(Array::from_f32(0.05))?;
        quantize(&w.as_dtype(dtype)?, group, bits)
    };
    let (gq, gs, gb) = weight(506, &[INNER, HIDDEN])?;
    let (uq, us, ub) = weight(507, &[INNER, HIDDEN])?;
    let own_glu = [
        pair_glu_rows(&gq, &uq)?,
        pair_glu_rows(&gs, &us)?,
        pair_glu_rows(&gb, &ub)?,
    ];
    let (sq, ss, sb) = weight(508, &[HIDDEN, INNER])?;
    let own_down = [sq, ss, sb];
    // The experts' maps with the shared expert's after them.
    let after = |experts: [&Array; 3], own: &[Array; 3]| -> Result<Vec<Array>, Exception> {
        experts
            .iter()
            .zip(own)
            .map(|(e, o)| concatenate(&[(*e).clone(), o.expand_dims(0)?], 0))
            .collect()
    };
    let all_glu = after([glu.0, glu.1, glu.2], &own_glu)?;
    let all_down = after([down.0, down.1, down.2], &own_down)?;

    let block = |tokens: std::ops::Range<i32>, fold: bool| -> Result<Array, Exception> {
        let count = tokens.len() as i32;
        let x = x.index(tokens.clone());
        let routes = moe_route(&logits.index(tokens.clone()), EXPERTS, TOP, true, fold)?;
        let (g, d) = match fold {
            true => (&all_glu[..], &all_down[..]),
            false => (
                &[glu.0.clone(), glu.1.clone(), glu.2.clone()][..],
                &[down.0.clone(), down.1.clone(), down.2.clone()][..],
            ),
        };
        let hidden = gather_quantized_matmul_tiled(
            &x,
            &g[0],
            &g[1],
            &g[2],
            &routes.token_pairs,
            count,
            group,
            bits,
            true,
            32,
        )?;
        let down = gather_quantized_matmul_tiled(
            &hidden,
            &d[0],
            &d[1],
            &d[2],
            &routes.pair_pairs,
            count,
            group,
            bits,
            false,
            32,
        )?;
        // Apart: the shared expert's products as the dense layers run them.
        let apart = match fold {
            true => None,
            false => {
                let ends = Ends {
                    glu: true,
                    residual: None,
                };
                let rows = x.expand_dims(0)?;
                let [w, s, b] = &own_glu;
                let inner = quantized_matmul_with(&rows, w, s, b, group, bits, ends)?;
                let [w, s, b] = &own_down;
                Some(quantized_matmul(&inner, w, s, b, group, bits)?.squeeze_axes(&[0])?)
            }
        };
        moe_combine(Combine {
            down: &down,
            scores: &routes.scores,
            shared: apart.as_ref().map_or(Shared::InDown, Shared::Apart),
            gate: &logits.index(tokens.clone()),
            gate_column: EXPERTS,
            residual: Some(&residual.index(tokens)),
        })
    };
    let most = ROWS.iter().copied().max().unwrap_or(1);
    let singles = (0..most)
        .map(|t| block(t..t + 1, false))
        .collect::<Result<Vec<_>, _>>()?;
    let singles = concatenate(&singles, 0)?;
    let mut differing = 0.0;
    for m in ROWS {
        differing += rows_differing(&block(0..m, true)?, &singles.index(..m), 0)?;
    }
    Ok(differing)
}
