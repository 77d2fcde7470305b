//! The sparse MoE block of Qwen3.5/3.6-MoE: a softmax router picks the top-k
//! experts per token (SwiGLU experts applied through gather_mm / gather_qmm),
//! plus a shared expert scaled by its own sigmoid gate.
//!
//! On CUDA's row kernels a decode step, a verified block or a prefill runs
//! the block in seven kernels (docs/gpu.md, "The MoE block in kernels"): the router
//! and the shared gate as one product, the router's choice
//! (`row_invariant::moe_route`), the experts' paired gate/up product with
//! its GLU end, their down product, the shared expert's two, and the
//! weighted sum onto the residual (`row_invariant::moe_combine`). The ops
//! below do the same elsewhere.

use crate::config::TextConfig;
use crate::error::Result;
use crate::nn::linear::{row_qmm, ExpertsGlu, Fused, Linear, Onto, SwitchLinear, Weights};
use crate::nn::mlp::Mlp;
use flashbar_mlx::row_invariant::{self, Shared};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, sigmoid, softmax_axis};
use mlx_rs::Array;

/// `0` keeps the MoE block's ops on CUDA too (the router, the experts'
/// gate and up apart, the weighted sum), for benchmarks.
pub const MOE_KERNELS_ENV: &str = "FLASHBAR_MOE_KERNELS";

fn moe_kernels() -> bool {
    row_qmm() && std::env::var(MOE_KERNELS_ENV).as_deref() != Ok("0")
}

/// `0` runs a prefill's MoE blocks by MLX's ops (`gather_qmm` for the
/// experts), for benchmarks. By default a prefill runs them through the
/// block's kernels too (the experts' gathered products take an expert's rows
/// 32 at a time): every token computed as a decode step computes it, so the
/// same prompt gives the same bits, which MLX's `gather_qmm` did not on
/// CUDA (docs/gpu.md, "Same prompt, same answer").
pub const MOE_PREFILL_KERNELS_ENV: &str = "FLASHBAR_MOE_PREFILL_KERNELS";

fn prefill_kernels() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(MOE_PREFILL_KERNELS_ENV).as_deref() != Ok("0"))
}

/// A prefill's tokens a call of the block's kernels: each block of the
/// gathered products scans all of a call's pairs once a tile, so a long
/// prompt goes in slices (each token still computed alone).
const PREFILL_SLICE: i32 = 1024;

/// By default a MoE block's shared expert is stacked after its routed
/// experts at load (one more expert in the gathered products' weights), so
/// that a decode step or a verified block runs it inside the experts' two
/// products instead of two of its own: five kernels a block, not seven, and
/// a 35B-A3B decode step 1.26-1.43x faster on an H200 (docs/gpu.md, "The
/// shared expert among the experts"). Each output is the same sum by the
/// same instructions either way. `0` keeps it apart, for benchmarks.
pub const SHARED_IN_EXPERTS_ENV: &str = "FLASHBAR_MOE_SHARED_IN_EXPERTS";

fn shared_in_experts() -> bool {
    std::env::var(SHARED_IN_EXPERTS_ENV).as_deref() != Ok("0")
}

/// `1` has a MoE block's last kernel (`moe_combine`) write the next
/// layer's input norm of its output too, given one (a block a token; docs/gpu.md,
/// "The next norm in a MoE block's last kernel"): 40 kernels fewer a
/// 35B-A3B step. Opt-in: its checks pass on a GPU, but one decode pair
/// side by side showed no gain.
pub const NEXT_NORM_ENV: &str = "FLASHBAR_NEXT_NORM_IN_COMBINE";

pub fn next_norm_in_combine() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(NEXT_NORM_ENV).as_deref() == Ok("1"))
}

/// The next RMS norm's weight and epsilon, for [`SparseMoe::forward_onto`].
pub type NextNorm<'a> = Option<(&'a Array, f32)>;

pub struct SparseMoe {
    router: Router,
    experts: ExpertsGlu,
    down_proj: SwitchLinear,
    shared_expert: Mlp,
    /// The shared expert is also expert `num_experts` of `experts` and
    /// `down_proj` ([`SHARED_IN_EXPERTS_ENV`]).
    shared_in_experts: bool,
    num_experts: i32,
    top_k: i32,
    norm_topk_prob: bool,
}

/// The router's map and the shared expert's gate, both of the block's input.
enum Router {
    Apart {
        gate: Linear,
        shared_gate: Linear,
    },
    /// Loaded as one (stacked where their formats agree: the experts'
    /// logits, then the shared gate's), for the kernels.
    Fused(Fused),
}

impl Router {
    /// The experts' logits `[.., E]` and the shared gate's `[.., 1]`.
    fn forward(&self, x: &Array) -> Result<(Array, Array)> {
        match self {
            Router::Apart { gate, shared_gate } => Ok((gate.forward(x)?, shared_gate.forward(x)?)),
            Router::Fused(both) => {
                let mut maps = both.forward(x)?.into_iter();
                match (maps.next(), maps.next()) {
                    (Some(logits), Some(shared_gate)) => Ok((logits, shared_gate)),
                    _ => {
                        Err(mlx_rs::error::Exception::custom("the router gave no two maps").into())
                    }
                }
            }
        }
    }
}

impl SparseMoe {
    pub fn load(weights: &mut Weights, path: &str, config: &TextConfig) -> Result<Self> {
        let kernels = moe_kernels();
        let (gate, shared_gate) = (format!("{path}.gate"), format!("{path}.shared_expert_gate"));
        let router = match kernels {
            true => Router::Fused(Fused::load(weights, &[gate, shared_gate])?),
            false => Router::Apart {
                gate: Linear::load(weights, &gate)?,
                shared_gate: Linear::load(weights, &shared_gate)?,
            },
        };
        let mut experts = ExpertsGlu::load(
            weights,
            &format!("{path}.switch_mlp.gate_proj"),
            &format!("{path}.switch_mlp.up_proj"),
            kernels,
        )?;
        let mut down_proj = SwitchLinear::load(weights, &format!("{path}.switch_mlp.down_proj"))?;
        let shared_expert = Mlp::load(weights, &format!("{path}.shared_expert"))?;
        let top_k = config.num_experts_per_tok as i32;
        let shared_in_experts = kernels
            && shared_in_experts()
            && top_k < row_invariant::MAX_TOP_K
            && append_shared(&mut experts, &mut down_proj, &shared_expert)?;
        Ok(SparseMoe {
            router,
            experts,
            down_proj,
            shared_expert,
            shared_in_experts,
            num_experts: config.num_experts as i32,
            top_k,
            norm_topk_prob: config.norm_topk_prob,
        })
    }

    /// `x`: `[B, L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self.forward_onto(x, None, None)?.0 {
            Onto::Apart(out) | Onto::Added(out) => Ok(out),
        }
    }

    /// [`Self::forward`], onto the residual stream `residual` when given
    /// (the kernels add it themselves); with `next` and a residual, also
    /// the next RMS norm of the sum where the block's last kernel wrote it
    /// ([`NEXT_NORM_ENV`]), else None (the caller norms it).
    pub fn forward_onto(
        &self,
        x: &Array,
        residual: Option<&Array>,
        next: NextNorm,
    ) -> Result<(Onto, Option<Array>)> {
        if let Some(out) = self.forward_sliced(x, residual, next)? {
            return Ok(out);
        }
        let (logits, shared_gate) = self.router.forward(x)?;
        let (experts, scores) = match self.route_by_kernel(&logits)? {
            Some(chosen) => chosen,
            None => {
                let probs = softmax_axis(logits, -1, true)?;
                let k = self.top_k;
                let experts = argpartition_axis(&probs, -k, -1)?.index((.., .., -k..));
                let mut scores = probs.take_along_axis(&experts, -1)?;
                if self.norm_topk_prob {
                    scores = scores.divide(scores.sum_axis(-1, true)?)?;
                }
                (experts, scores)
            }
        };
        // Each token row meets each of its k experts: [B, L, 1, 1, hidden].
        let rows = x.expand_dims_axes(&[-2, -3])?;
        let hidden = self.experts.forward(&rows, &experts)?;
        let out = self
            .down_proj
            .forward(&hidden, &experts)?
            .squeeze_axes(&[-2])?; // [B, L, k, hidden]
        let routed = out.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, false)?;

        let shared = self
            .shared_expert
            .forward(x)?
            .multiply(sigmoid(shared_gate)?)?;
        Ok((Onto::Apart(routed.add(shared)?), None))
    }

    /// [`Self::forward_kernels`] on `x` `[1, L, hidden]` in slices of at
    /// most [`PREFILL_SLICE`] tokens, joined.
    fn forward_sliced(
        &self,
        x: &Array,
        residual: Option<&Array>,
        next: NextNorm,
    ) -> Result<Option<(Onto, Option<Array>)>> {
        let shape = x.shape();
        if shape.len() != 3 || shape[0] != 1 || shape[1] <= PREFILL_SLICE {
            return self.forward_kernels(x, residual, next);
        }
        let (mut outs, mut norms) = (Vec::new(), Vec::new());
        for start in (0..shape[1]).step_by(PREFILL_SLICE as usize) {
            let end = (start + PREFILL_SLICE).min(shape[1]);
            let res = residual.map(|r| r.index((.., start..end, ..)));
            match self.forward_kernels(&x.index((.., start..end, ..)), res.as_ref(), next)? {
                Some((Onto::Added(out) | Onto::Apart(out), normed)) => {
                    outs.push(out);
                    norms.extend(normed);
                }
                None => return Ok(None),
            }
        }
        let out = mlx_rs::ops::concatenate(&outs, 1)?;
        let normed = match norms.len() == outs.len() {
            true => Some(mlx_rs::ops::concatenate(&norms, 1)?),
            false => None,
        };
        Ok(Some((
            match residual {
                Some(_) => Onto::Added(out),
                None => Onto::Apart(out),
            },
            normed,
        )))
    }

    /// The experts and their scores (`[B, L, k]` each) by the route kernel,
    /// where the block's kernels are on, for a prefill too: MLX's top-k on
    /// CUDA broke ties between equal probabilities differently from run to
    /// run, so the same prompt decoded differently (docs/gpu.md, "The MoE
    /// block in four kernels"). None elsewhere (the ops).
    fn route_by_kernel(&self, logits: &Array) -> Result<Option<(Array, Array)>> {
        if !matches!(self.router, Router::Fused(_)) {
            return Ok(None);
        }
        let shape = logits.shape();
        let tokens: i32 = shape[..shape.len() - 1].iter().product();
        let logits = logits.reshape(&[tokens, shape[shape.len() - 1]])?;
        if !row_invariant::takes_route(&logits, self.num_experts, self.top_k) {
            return Ok(None);
        }
        let routes = row_invariant::moe_route(
            &logits,
            self.num_experts,
            self.top_k,
            self.norm_topk_prob,
            false,
        )?;
        let mut lead = shape[..shape.len() - 1].to_vec();
        lead.push(self.top_k);
        let experts = routes.token_pairs.index(1).reshape(&lead)?;
        Ok(Some((experts, routes.scores.reshape(&lead)?)))
    }

    /// The block in its kernels (the module's doc), where they take `x`:
    /// a decode step or a verified block on CUDA's row kernels, the
    /// experts' gate and up paired, and a prefill unless
    /// [`MOE_PREFILL_KERNELS_ENV`] says otherwise. None elsewhere.
    fn forward_kernels(
        &self,
        x: &Array,
        residual: Option<&Array>,
        next: NextNorm,
    ) -> Result<Option<(Onto, Option<Array>)>> {
        let (Router::Fused(router), ExpertsGlu::Paired(gate_up)) = (&self.router, &self.experts)
        else {
            return Ok(None);
        };
        let shape = x.shape();
        let width = shape[shape.len() - 1];
        let tokens: i32 = shape[..shape.len() - 1].iter().product();
        if tokens < 1 || (tokens > row_invariant::MAX_ROWS && !prefill_kernels()) {
            return Ok(None);
        }
        let x2 = x.reshape(&[tokens, width])?;
        // The experts' logits and the shared gate's column, in place in one
        // product where the two maps are stacked.
        let (logits, gate, gate_column) = match router.forward_whole(&x2)? {
            Some(both) => (both.clone(), both, self.num_experts),
            None => {
                let (logits, gate) = self.router.forward(&x2)?;
                (logits, gate, 0)
            }
        };
        if !row_invariant::takes_route(&logits, self.num_experts, self.top_k) {
            return Ok(None);
        }
        // The shared expert among the experts for a decode step or a
        // verified block; a prefill's many rows would make its one block a
        // column the slowest by far, so there it runs apart (the same sums).
        let fold = self.shared_in_experts && tokens <= row_invariant::MAX_ROWS;
        let routes = row_invariant::moe_route(
            &logits,
            self.num_experts,
            self.top_k,
            self.norm_topk_prob,
            fold,
        )?;
        let Some(hidden) = gate_up.forward_pairs(&x2, &routes.token_pairs, tokens, true)? else {
            return Ok(None);
        };
        let Some(down) =
            self.down_proj
                .forward_pairs(&hidden, &routes.pair_pairs, tokens, false)?
        else {
            return Ok(None);
        };
        let apart = match fold {
            true => None,
            false => Some(self.shared_expert.forward(&x2)?),
        };
        let shared = apart.as_ref().map_or(Shared::InDown, Shared::Apart);
        if !row_invariant::takes_combine(&down, &routes.scores, shared, &gate, gate_column) {
            return Ok(None);
        }
        let residual = residual.map(|r| r.reshape(&[tokens, width])).transpose()?;
        let inputs = row_invariant::Combine {
            down: &down,
            scores: &routes.scores,
            shared,
            gate: &gate,
            gate_column,
            residual: residual.as_ref(),
        };
        let (y, normed) = match (next, &residual) {
            (Some((weight, eps)), Some(_))
                if next_norm_in_combine()
                    && weight.shape() == [width]
                    && weight.dtype() == down.dtype() =>
            {
                let (y, normed) = row_invariant::moe_combine_normed(inputs, weight, eps)?;
                (y, Some(normed.reshape(shape)?))
            }
            _ => (row_invariant::moe_combine(inputs)?, None),
        };
        let y = y.reshape(shape)?;
        Ok(Some((
            match residual {
                Some(_) => Onto::Added(y),
                None => Onto::Apart(y),
            },
            normed,
        )))
    }
}

/// Stacks the shared expert's two maps after the routed experts' (gate and
/// up paired alike, then down) where all four are packed alike; false, with
/// nothing changed, elsewhere. The shared expert keeps its own maps for a
/// prefill (1.5 MB a block at the 35B-A3B's shape).
fn append_shared(experts: &mut ExpertsGlu, down: &mut SwitchLinear, shared: &Mlp) -> Result<bool> {
    let Some((glu, shared_down)) = shared.packed_glu_and_down() else {
        return Ok(false);
    };
    if !down.fits_expert(shared_down) || !experts.append_expert(glu)? {
        return Ok(false);
    }
    down.append_expert(shared_down)
}
