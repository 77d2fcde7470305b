//! The row-invariant quantized matmul (`kernels/cuda/qmm.cu`): dense maps
//! with their fused ends, and a MoE's experts gathered by token
//! (docs/gpu.md, "Row-invariant kernels", "Fused ends", "The experts").

use super::qmm_body::{packed_template, Template};
use super::{single, MAX_ROWS};
use crate::custom_kernel::{self, Launch};
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, split_equal};
use mlx_rs::{Array, Dtype};

/// Whether the models run [`quantized_matmul`] for `x` (rows = every axis
/// but the last) with these weights: bf16 or f16 activations with scales of
/// that type, 4 or 8 bits, groups of 32, 64 or 128, at most [`MAX_ROWS`]
/// rows, or any number unless [`PREFILL_ROWS_ENV`] is `0` (the kernel
/// itself takes any number, 32 rows a tile).
pub fn takes_quantized(x: &Array, scales: &Array, group_size: i32, bits: i32) -> bool {
    let rows: i32 = x.shape()[..x.ndim().saturating_sub(1)].iter().product();
    fits_quantized(x, scales, group_size, bits) && (rows <= MAX_ROWS || prefill_rows())
}

/// A prefill's products (more than [`MAX_ROWS`] rows) run through the
/// kernel too, 32 rows a tile, each row summed as a decode step sums it, in
/// place of MLX's `quantized_matmul`, whose products of thousands of rows
/// did not always give the same bits twice, so the 9B's DFlash round at
/// 8,192 tokens was lossless in 1 run of 4 (docs/gpu.md, "A prefill's
/// products in the kernel"). `0` hands them back to MLX, for benchmarks:
/// ours take 22-27% longer at the 9B's shapes.
pub const PREFILL_ROWS_ENV: &str = "FLASHBAR_PREFILL_QMM";

fn prefill_rows() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(PREFILL_ROWS_ENV).as_deref() != Ok("0"))
}

/// A prefill's products (more than [`MAX_ROWS`] rows) run in tiles of 64
/// rows where a block has at most four column tiles: each weight loaded
/// and dequantized once for twice the rows, every row still summed as a
/// decode step sums it. The 9B's 8,192-token prefill took 17% less time
/// than with 32-row tiles on an H100 (docs/gpu.md, "64-row tiles"). `32`
/// goes back to 32-row tiles, for benchmarks.
pub const PREFILL_TILE_ENV: &str = "FLASHBAR_PREFILL_TILE";

fn prefill_tile() -> i32 {
    static TILE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *TILE.get_or_init(|| match std::env::var(PREFILL_TILE_ENV).as_deref() {
        Ok("32") => MAX_ROWS,
        _ => 64,
    })
}

/// What the kernel takes: [`takes_quantized`] without its limit on rows.
fn fits_quantized(x: &Array, scales: &Array, group_size: i32, bits: i32) -> bool {
    let rows: i32 = x.shape()[..x.ndim().saturating_sub(1)].iter().product();
    matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16)
        && scales.dtype() == x.dtype()
        && matches!(bits, 4 | 8)
        && matches!(group_size, 32 | 64 | 128)
        && rows >= 1
}

/// How a weight of `n` output rows and `k` inputs is split over the GPU:
/// `(tiles, warps)`, 8-column tiles per warp and warps per block (each warp
/// takes every `warps`-th chunk of k). From the weight's shape only, never
/// from the number of rows, so every M sums in the same order.
/// Chosen by `bench/qmm_tune.py --dependent` and whole decode steps on the
/// H200 (docs/gpu.md, "The quantized matmul"): a decode step's matmuls each
/// wait for the one before, so all but the lm_heads want latency: 8 warps a
/// block, each walking few chunks, and four tiles (32 columns a block) where
/// there are 512 columns or more, two from 64, else one. The lm_heads (from
/// [`WIDE`] columns) are bound by bandwidth: 2 warps (4 for 8-bit weights,
/// whose warps walk twice the chunks). `bench/gpu_kernels.py` mirrors this
/// rule.
pub fn qmm_launch(n: i32, k: i32, bits: i32) -> (i32, i32) {
    let chunks = chunks(k, bits);
    if n >= WIDE {
        let warps = if bits == 4 { 2 } else { 4 };
        return (4, warps.min(chunks / 2).max(1));
    }
    let tiles = match n {
        512.. => 4,
        64..=511 => 2,
        _ => 1,
    };
    (tiles, 8.min(chunks).max(1))
}

/// Columns from which a weight is an lm_head-sized map, bound by bandwidth.
pub const WIDE: i32 = 65_536;

/// The kernel's k steps: 4 lanes x 16 bytes of packed weights each.
fn chunks(k: i32, bits: i32) -> i32 {
    let chunk = 4 * (128 / bits);
    (k + chunk - 1) / chunk
}

/// The most warps a block of `tiles` tiles runs (the body's `MAX_WARPS`).
fn max_warps(tiles: i32) -> i32 {
    if tiles == 4 {
        8
    } else {
        16
    }
}

/// Benchmarks try other launches on a whole model without a rebuild:
/// `FLASHBAR_QMM_LAUNCH=T:W` gives every weight of fewer than [`WIDE`]
/// columns T tiles a warp and W warps a block (at most one a chunk). Still
/// a function of the shape alone, so decode and verify keep one order.
pub const LAUNCH_ENV: &str = "FLASHBAR_QMM_LAUNCH";

fn launch_override(n: i32, k: i32, bits: i32) -> Option<(i32, i32)> {
    static RULE: std::sync::OnceLock<Option<(i32, i32)>> = std::sync::OnceLock::new();
    let (tiles, warps) = (*RULE.get_or_init(|| {
        let value = std::env::var(LAUNCH_ENV).ok()?;
        let (t, w) = value.split_once(':')?;
        let (t, w) = (t.trim().parse::<i32>().ok()?, w.trim().parse::<i32>().ok()?);
        (matches!(t, 1 | 2 | 4) && w >= 1).then_some((t, w))
    }))?;
    (n < WIDE).then(|| {
        (
            tiles,
            warps.min(max_warps(tiles)).min(chunks(k, bits)).max(1),
        )
    })
}

/// What a [`quantized_matmul`] call fuses at its ends (docs/gpu.md, "Fused
/// ends"): each acts on one output after its sum, so every row is still
/// computed alike whatever the number of rows.
#[derive(Clone, Copy, Default)]
pub struct Ends<'a> {
    /// The weight is a SwiGLU's gate and up maps with their rows paired
    /// ([`pair_glu_rows`]) and the output is `silu(gate) * up` (`[.., N / 2]`),
    /// rounded step by step as MLX's ops round it. See [`takes_glu`].
    pub glu: bool,
    /// Added to the output (its shape, the activations' type): the residual
    /// stream a block's output projection writes onto.
    pub residual: Option<&'a Array>,
}

/// Rows of gate and of up side by side in the weight [`Ends::glu`] takes:
/// every block of the kernel (four 8-column tiles) holds this many of each.
pub const GLU_PAIR: i32 = 16;

/// Whether the GLU end takes a paired weight of `n` rows (gate and up
/// together) and `k` inputs: the launch gives it four tiles a block.
pub fn takes_glu(n: i32, k: i32, bits: i32) -> bool {
    let (tiles, _) = launch_override(n, k, bits).unwrap_or_else(|| qmm_launch(n, k, bits));
    tiles == 4 && n % (2 * GLU_PAIR) == 0
}

/// A gate and an up map's rows (`[.., I, C]` each: packed weights, scales
/// or biases, one map or one per expert) as the GLU end reads them: 16 rows
/// of gate, the same 16 of up, and so on (`[.., 2I, C]`).
pub fn pair_glu_rows(gate: &Array, up: &Array) -> Result<Array, Exception> {
    let shape = gate.shape();
    let rows = if shape.len() >= 2 {
        shape[shape.len() - 2]
    } else {
        0
    };
    if up.shape() != shape || rows == 0 || rows % GLU_PAIR != 0 {
        return Err(Exception::custom(format!(
            "GLU rows: gate {:?} and up {:?} must match, in blocks of {GLU_PAIR}",
            gate.shape(),
            up.shape()
        )));
    }
    let lead = &shape[..shape.len() - 2];
    let mut blocks = lead.to_vec();
    blocks.extend_from_slice(&[rows / GLU_PAIR, 1, GLU_PAIR, shape[shape.len() - 1]]);
    let axis = lead.len() as i32 + 1;
    let paired = concatenate(&[gate.reshape(&blocks)?, up.reshape(&blocks)?], axis)?;
    let mut out = lead.to_vec();
    out.extend_from_slice(&[2 * rows, shape[shape.len() - 1]]);
    paired.reshape(&out)
}

/// The gate and up products (`[.., I]` each) in a paired weight's product
/// (`[.., 2I]`): views, no copy.
pub fn unpair_glu_columns(product: &Array) -> Result<(Array, Array), Exception> {
    let shape = product.shape();
    let lead = &shape[..shape.len() - 1];
    let n = shape[shape.len() - 1];
    let mut blocks = lead.to_vec();
    blocks.extend_from_slice(&[n / (2 * GLU_PAIR), 2, GLU_PAIR]);
    let halves = split_equal(&product.reshape(&blocks)?, 2, -2)?;
    let mut out = lead.to_vec();
    out.push(n / 2);
    Ok((halves[0].reshape(&out)?, halves[1].reshape(&out)?))
}

/// `x W^T` for MLX's affine-quantized `w` (transposed, as `quantized_matmul`
/// with `transpose = true`). Check [`takes_quantized`] first.
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array, Exception> {
    quantized_matmul_with(x, w, scales, biases, group_size, bits, Ends::default())
}

/// [`quantized_matmul`] with its input and output [`Ends`] fused in.
pub fn quantized_matmul_with(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    ends: Ends,
) -> Result<Array, Exception> {
    quantized_matmul_tiled(
        x,
        w,
        scales,
        biases,
        group_size,
        bits,
        ends,
        &[],
        prefill_tile(),
    )
}

/// The most parts [`quantized_matmul_parts`] splits a product into.
pub const MAX_PARTS: usize = 4;

/// [`quantized_matmul`] of a stacked weight whose output columns are
/// `widths` maps side by side (2 to [`MAX_PARTS`] of them): each map's
/// product `[.., width]` as a contiguous array, where slices of one
/// product would be strided views that the next kernel must copy first
/// for a block of rows (docs/gpu.md, "Stacked maps' parts apart"). The
/// values are those of the whole product, bit for bit.
pub fn quantized_matmul_parts(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    widths: &[i32],
) -> Result<Vec<Array>, Exception> {
    let n = w.shape()[0];
    if !(2..=MAX_PARTS).contains(&widths.len())
        || widths.iter().any(|&width| width < 1)
        || widths.iter().sum::<i32>() != n
    {
        return Err(Exception::custom(format!(
            "qmm kernel: parts {widths:?} do not split a weight of {n} rows"
        )));
    }
    let flat = quantized_matmul_tiled(
        x,
        w,
        scales,
        biases,
        group_size,
        bits,
        Ends::default(),
        widths,
        prefill_tile(),
    )?;
    parts_apart(&flat, &x.shape()[..x.ndim() - 1], widths)
}

/// The parts of a flat product of rows `lead` (the kernel's output with
/// parts): each part's `[lead.., width]` array, contiguous.
pub(crate) fn parts_apart(
    flat: &Array,
    lead: &[i32],
    widths: &[i32],
) -> Result<Vec<Array>, Exception> {
    let m: i32 = lead.iter().product();
    let mut start = 0;
    widths
        .iter()
        .map(|&width| {
            let part = flat.index(start * m..(start + width) * m);
            start += width;
            let mut shape = lead.to_vec();
            shape.push(width);
            part.reshape(&shape)
        })
        .collect()
}

/// One launch of the dense kernel: with `parts` (the maps' widths, or none)
/// the output is flat, part after part; else shaped as `x` with `n` columns.
/// Past [`MAX_ROWS`] rows a block takes a tile of `tile` rows (32, or 64
/// where a block has at most four column tiles); `flashbar smoke` calls it
/// with each tile whatever [`PREFILL_TILE_ENV`] says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantized_matmul_tiled(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    ends: Ends,
    parts: &[i32],
    tile: i32,
) -> Result<Array, Exception> {
    if !fits_quantized(x, scales, group_size, bits) {
        return Err(Exception::custom(format!(
            "qmm kernel: unsupported input {:?} {:?} with {bits}-bit groups of {group_size} \
             and {:?} scales",
            x.shape(),
            x.dtype(),
            scales.dtype()
        )));
    }
    let shape = x.shape().to_vec();
    let k = shape[shape.len() - 1];
    let m: i32 = shape[..shape.len() - 1].iter().product();
    let (n, words) = (w.shape()[0], w.shape()[1]);
    if w.ndim() != 2 || words * (32 / bits) != k || k % group_size != 0 {
        return Err(Exception::custom(format!(
            "qmm kernel: weight {:?} does not fit {k} inputs at {bits} bits",
            w.shape()
        )));
    }
    if ends.glu && !takes_glu(n, k, bits) {
        return Err(Exception::custom(format!(
            "qmm kernel: no GLU end for a weight {:?} at this launch",
            w.shape()
        )));
    }
    let out_n = if ends.glu { n / 2 } else { n };
    let mut out_shape = shape;
    *out_shape.last_mut().expect("x has an axis") = out_n;
    if let Some(r) = ends.residual {
        if r.shape() != out_shape.as_slice() || r.dtype() != x.dtype() {
            return Err(Exception::custom(format!(
                "qmm kernel: residual {:?} {:?} does not fit the output {out_shape:?} {:?}",
                r.shape(),
                r.dtype(),
                x.dtype()
            )));
        }
    }
    let (tiles, warps) = launch_override(n, k, bits).unwrap_or_else(|| qmm_launch(n, k, bits));
    let blocks = (n + 8 * tiles - 1) / (8 * tiles);
    // 16-row tiles a block: 1 or 2 for a decode step's or a block's rows, 4
    // for a prefill's 64-row tiles.
    let (row_tiles, tile_rows) = match m {
        ..=16 => (1, MAX_ROWS),
        17..=MAX_ROWS => (2, MAX_ROWS),
        _ if tile == 64 && tiles <= 4 => (4, 64),
        _ => (2, MAX_ROWS),
    };
    // The body reads x as [B, T, K]: the models' own shape goes in as it is
    // (a reshape is a graph node, host time in a step the host bounds).
    let x3 = match x.ndim() {
        3 => x.clone(),
        _ => x.reshape(&[1, m, k])?,
    };
    // Without a residual the kernel reads none: x stands in for it. A
    // residual is read by row and column, whatever its leading shape.
    let residual = ends.residual.unwrap_or(&x3);
    // The group size and the warps are run-time values of the kernel, read
    // from the scales' shape and the block's size.
    let (body, template) = Template {
        bits,
        half: i32::from(x.dtype() == Dtype::Float16),
        nt: tiles,
        mt: row_tiles,
        glu: i32::from(ends.glu),
        res: i32::from(ends.residual.is_some()),
        gather: 0,
        parts: [1, 2, 3].map(|i| part_start(parts, i)),
    }
    .launch(packed_template());
    // Not gathering: x stands in for the unread pairs too. The output comes
    // in its final shape (flat with parts).
    let y_shape = if parts.is_empty() {
        out_shape
    } else {
        vec![m * out_n]
    };
    single(custom_kernel::launch(&Launch {
        body,
        input_names: &QMM_INPUTS,
        output_names: &["y"],
        inputs: &[&x3, w, scales, biases, residual, &x3],
        outputs: &[(y_shape, x.dtype())],
        // Past 32 rows, a block per tile of rows as well (the body's second axis).
        grid: [blocks * 32 * warps, (m + tile_rows - 1) / tile_rows, 1],
        group: [32 * warps, 1, 1],
        template: template.as_slice(),
    })?)
}

/// The column where part `i` of `parts` starts (the kernel's P1..P3; 0
/// where there is no such part).
fn part_start(parts: &[i32], i: usize) -> i32 {
    if i < parts.len() {
        parts[..i].iter().sum()
    } else {
        0
    }
}

/// The qmm body's inputs (`kernels/cuda/qmm.cu`), one list for every call
/// so that MLX makes its kernel object once.
const QMM_INPUTS: [&str; 6] = ["x", "w", "scales", "biases", "res", "pairs"];

/// Whether [`gather_quantized_matmul`] takes `x` (`[rows, K]`) with these
/// experts' scales (`[E, N, groups]`) for `tokens` tokens: any number, an
/// expert's pairs taken 32 (or 64) at a time.
pub fn takes_gathered(x: &Array, scales: &Array, group_size: i32, bits: i32, tokens: i32) -> bool {
    x.ndim() == 2
        && scales.ndim() == 3
        && matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16)
        && scales.dtype() == x.dtype()
        && matches!(bits, 4 | 8)
        && matches!(group_size, 32 | 64 | 128)
        && tokens >= 1
}

/// A MoE's experts (docs/gpu.md, "The experts"): output row p is
/// `x[rows[p]] W[experts[p]]^T` for MLX's affine-quantized `w`
/// (`[E, N, K * bits / 32]`), `x` `[R, K]`, `rows` and `experts` `[P]`
/// int32 (`tokens` tokens, each meeting an expert once). Each expert's
/// weights are read once for every 32 of its rows (once in all for a decode
/// step or a verified block), and every row is summed as it would be alone,
/// so a verified block's rows, and a prefill's, equal a decode step's.
/// Check [`takes_gathered`] first.
#[allow(clippy::too_many_arguments)]
pub fn gather_quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    rows: &Array,
    experts: &Array,
    tokens: i32,
    group_size: i32,
    bits: i32,
) -> Result<Array, Exception> {
    let p = rows.size() as i32;
    if experts.size() as i32 != p {
        return Err(Exception::custom(format!(
            "gathered qmm kernel: {p} rows for {} experts",
            experts.size()
        )));
    }
    let pairs = mlx_rs::ops::stack(
        &[
            rows.reshape(&[p])?.as_dtype(Dtype::Int32)?,
            experts.reshape(&[p])?.as_dtype(Dtype::Int32)?,
        ],
        0,
    )?;
    gather_quantized_matmul_pairs(
        x, w, scales, biases, &pairs, tokens, group_size, bits, false,
    )
}

/// `0` keeps a block for every expert in the gathered products' grids,
/// for benchmarks (else a block a pair where pairs are fewer than experts).
pub const GATHER_BY_PAIR_ENV: &str = "FLASHBAR_GATHER_BY_PAIR";

/// The gathered products' blocks a column block: one a pair where there
/// are fewer pairs than experts (a decode step, a verified block), each
/// taking its expert's pairs if it is that expert's first (`qmm.cu`);
/// else one an expert.
fn gather_blocks(pairs: i32, experts: i32) -> i32 {
    static BY_PAIR: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let by_pair = *BY_PAIR.get_or_init(|| std::env::var(GATHER_BY_PAIR_ENV).as_deref() != Ok("0"));
    if by_pair && pairs < experts {
        pairs
    } else {
        experts
    }
}

/// [`gather_quantized_matmul`] with the (row, expert) of each output row
/// given as one `[2, P]` int32 array (`row_invariant::moe_route` makes
/// them), and with `glu` the experts' gate and up maps paired
/// ([`pair_glu_rows`], `w` `[E, 2I, ..]`): output row p is then
/// `silu(gate) * up` of its row and expert (`[P, I]`), the GLU end of
/// [`Ends`].
#[allow(clippy::too_many_arguments)]
pub fn gather_quantized_matmul_pairs(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    pairs: &Array,
    tokens: i32,
    group_size: i32,
    bits: i32,
    glu: bool,
) -> Result<Array, Exception> {
    gather_quantized_matmul_tiled(
        x,
        w,
        scales,
        biases,
        pairs,
        tokens,
        group_size,
        bits,
        glu,
        expert_tile(),
    )
}

/// A prefill's experts (more than [`MAX_ROWS`] tokens) take their rows 64
/// at a time, as a dense prefill's products do: each expert's weights
/// dequantized once for twice the rows, every row summed as a decode step
/// sums it (a 35B-A3B prefill 3% faster on an H200; docs/gpu.md, "64-row
/// tiles"). `32` takes them 32 at a time, for benchmarks.
pub const EXPERT_TILE_ENV: &str = "FLASHBAR_EXPERT_TILE";

fn expert_tile() -> i32 {
    static TILE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *TILE.get_or_init(|| match std::env::var(EXPERT_TILE_ENV).as_deref() {
        Ok("32") => MAX_ROWS,
        _ => 64,
    })
}

/// [`gather_quantized_matmul_pairs`] with past [`MAX_ROWS`] tokens an
/// expert's rows taken `tile` at a time (32, or 64 where a block has at most
/// four column tiles); `flashbar smoke` calls it with each tile.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_quantized_matmul_tiled(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    pairs: &Array,
    tokens: i32,
    group_size: i32,
    bits: i32,
    glu: bool,
    tile: i32,
) -> Result<Array, Exception> {
    if !takes_gathered(x, scales, group_size, bits, tokens) {
        return Err(Exception::custom(format!(
            "gathered qmm kernel: unsupported input {:?} {:?} for {tokens} tokens with \
             {bits}-bit groups of {group_size} and {:?} scales {:?}",
            x.shape(),
            x.dtype(),
            scales.dtype(),
            scales.shape()
        )));
    }
    let k = x.shape()[1];
    let (experts_n, n) = (w.shape()[0], w.shape()[1]);
    let ps = pairs.shape();
    if w.ndim() != 3
        || w.shape()[2] * (32 / bits) != k
        || k % group_size != 0
        || ps.len() != 2
        || ps[0] != 2
        || pairs.dtype() != Dtype::Int32
    {
        return Err(Exception::custom(format!(
            "gathered qmm kernel: experts {:?} do not fit {k} inputs at {bits} bits, or pairs \
             {ps:?} {:?} are not [2, P] int32",
            w.shape(),
            pairs.dtype()
        )));
    }
    if glu && !takes_glu(n, k, bits) {
        return Err(Exception::custom(format!(
            "gathered qmm kernel: no GLU end for experts {:?} at this launch",
            w.shape()
        )));
    }
    let (tiles, warps) = launch_override(n, k, bits).unwrap_or_else(|| qmm_launch(n, k, bits));
    let blocks = (n + 8 * tiles - 1) / (8 * tiles);
    // 16-row tiles a block: an expert meets each token once, so a decode
    // step's or a block's expert has at most `tokens` rows; a prefill's
    // experts take theirs `tile` at a time.
    let row_tiles = match tokens {
        ..=16 => 1,
        17..=MAX_ROWS => 2,
        _ if tile == 64 && tiles <= 4 => 4,
        _ => 2,
    };
    let (body, template) = Template {
        bits,
        half: i32::from(x.dtype() == Dtype::Float16),
        nt: tiles,
        mt: row_tiles,
        glu: i32::from(glu),
        res: 0,
        gather: 1,
        parts: [0; 3],
    }
    .launch(packed_template());
    let out_n = if glu { n / 2 } else { n };
    // No residual: x stands in for it.
    single(custom_kernel::launch(&Launch {
        body,
        input_names: &QMM_INPUTS,
        output_names: &["y"],
        inputs: &[x, w, scales, biases, x, pairs],
        outputs: &[(vec![ps[1], out_n], x.dtype())],
        grid: [blocks * 32 * warps, gather_blocks(ps[1], experts_n), 1],
        group: [32 * warps, 1, 1],
        template: template.as_slice(),
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    /// The split is a function of the weight alone; this table is the one
    /// `bench/gpu_kernels.py` (`launch_qmm`) reproduces on the GPU.
    #[test]
    fn the_launch_depends_on_the_weight_only() {
        // 9B, 4 bits: q_proj, o_proj, mlp down, the gated-delta b / a, lm_head.
        assert_eq!(qmm_launch(8192, 4096, 4), (4, 8));
        assert_eq!(qmm_launch(4096, 4096, 4), (4, 8));
        assert_eq!(qmm_launch(4096, 12288, 4), (4, 8));
        assert_eq!(qmm_launch(32, 4096, 4), (1, 8));
        assert_eq!(qmm_launch(248_320, 4096, 4), (4, 2));
        // 8 bits keep 4 warps on wide layers.
        assert_eq!(qmm_launch(248_320, 4096, 8), (4, 4));
        assert_eq!(qmm_launch(248_320, 2048, 4), (4, 2));
        assert_eq!(qmm_launch(512, 2048, 4), (4, 8));
        assert_eq!(qmm_launch(768, 384, 8), (4, 6));
        assert_eq!(qmm_launch(8, 384, 8), (1, 6));
        assert_eq!(qmm_launch(256, 64, 4), (2, 1));
        assert_eq!(qmm_launch(128, 64, 8), (2, 1));
        for (n, k, bits) in [(8192, 4096, 4), (32, 64, 8), (248_320, 4096, 8)] {
            let (tiles, warps) = qmm_launch(n, k, bits);
            assert!(warps >= 1 && warps <= max_warps(tiles) && warps <= chunks(k, bits));
        }
    }

    /// Pairing a gate and an up map's rows and unpairing a product's
    /// columns are inverse: the GLU end sees gate row j beside up row j.
    #[test]
    fn glu_rows_pair_and_unpair() {
        let at = |a: &Array, row: i32| a.index((row, 0)).item_exact::<i32>();
        let same = |a: &Array, b: &Array| a.eq_values(b).unwrap();
        mlx_rs::with_device(mlx_rs::Device::cpu(), || {
            let gate = Array::from_iter(0..64 * 3, &[64, 3]);
            let up = Array::from_iter(1000..1000 + 64 * 3, &[64, 3]);
            let paired = pair_glu_rows(&gate, &up).unwrap();
            assert_eq!(paired.shape(), &[128, 3]);
            assert_eq!((at(&paired, 0), at(&paired, 1)), (0, 3));
            assert_eq!(at(&paired, 16), 1000, "row 16 is up's first");
            assert_eq!(at(&paired, 32), 16 * 3, "row 32 is gate's 17th");
            // A product's columns are the paired weight's rows: unpaired,
            // they are gate's and up's again.
            let product = paired.t();
            let (g, u) = unpair_glu_columns(&product).unwrap();
            assert!(same(&g, &gate.t()) && same(&u, &up.t()));
            assert!(!same(&g, &up.t()));
            assert!(pair_glu_rows(&gate.index(..40), &up.index(..40)).is_err());
            // One map per expert ([E, I, C]): each expert's rows paired alone.
            let gates = Array::from_iter(0..2 * 32 * 3, &[2, 32, 3]);
            let ups = Array::from_iter(1000..1000 + 2 * 32 * 3, &[2, 32, 3]);
            let paired = pair_glu_rows(&gates, &ups).unwrap();
            assert_eq!(paired.shape(), &[2, 64, 3]);
            for e in 0..2 {
                let (g, u) = (gates.index(e), ups.index(e));
                assert!(
                    same(&paired.index(e), &pair_glu_rows(&g, &u).unwrap()),
                    "expert {e}"
                );
            }
            assert_eq!(paired.index((1, 16, 0)).item_exact::<i32>(), 1000 + 32 * 3);
        });
    }
}
