//! Gated DeltaNet: the linear-attention layer of the hybrid models.
//!
//! Projections -> short causal depthwise conv (K taps, state of K-1 rows) ->
//! per-head L2-normalized q/k -> the gated delta recurrence over a f32 state
//! `S [B, Hv, Dv, Dk]` -> gated RMSNorm -> output projection.
//! The recurrence, per step t (docs/dflash.md):
//!   S <- g_t S;  delta_t = beta_t (v_t - S k_t);  S <- S + delta_t k_t^T;  y_t = S q_t

use crate::config::TextConfig;
use crate::error::Result;
use crate::nn::gated_delta_head::{HostHead, HostState, HostTape};
use crate::nn::gated_delta_host::{self, Dims};
use crate::nn::host;
use crate::nn::linear::{row_kernels, Fused, Linear, Onto, Weights};
use flashbar_mlx::{device, gdn_kernels, row_invariant};
use mlx_rs::fast::rms_norm;
use mlx_rs::nn::{silu, softplus};
use mlx_rs::ops::{
    concatenate, conv1d, repeat_axis, sigmoid, split_at_indices, stack, zeros_dtype,
};
use mlx_rs::{Array, Dtype};

/// A GDN layer's cache: the last K-1 conv inputs and the recurrent state,
/// as MLX arrays or, on the CPU's host path, in host memory (docs/cpu.md,
/// "Host caches"). One of the two holds it; a forward that takes the other
/// path moves it over first.
#[derive(Clone, Default)]
pub struct GdnState {
    pub(crate) conv: Option<Array>,
    pub(crate) ssm: Option<Array>,
    pub(crate) host: Option<HostState>,
}

impl GdnState {
    /// The MLX arrays it holds (none on the host path): what evaluating
    /// the cache must evaluate.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.conv.iter().chain(self.ssm.iter())
    }

    /// The conv rows `[1, K-1, C]` and the state `[1, Hv, Dv, Dk]`,
    /// whichever path holds them (None before the first token).
    pub fn conv_and_ssm(&self) -> Result<Option<(Array, Array)>> {
        Ok(match (&self.host, &self.conv, &self.ssm) {
            (Some(host), ..) => Some(host.arrays()?),
            (None, Some(conv), Some(ssm)) => Some((conv.clone(), ssm.clone())),
            _ => None,
        })
    }

    /// The state as MLX arrays again (for MLX's ops), if the host held it.
    pub(crate) fn move_to_arrays(&mut self) -> Result<()> {
        if let Some(host) = self.host.take() {
            let (conv, ssm) = host.arrays()?;
            self.conv = Some(conv);
            self.ssm = Some(ssm);
        }
        Ok(())
    }
}

/// What a verify forward records so the layer can roll back to any prefix
/// without recomputing projections, conv or norms (docs/dflash.md, "The tape").
#[derive(Clone)]
pub struct GdnTape(Recorded);

#[derive(Clone)]
enum Recorded {
    Arrays(ArrayTape),
    Host(HostTape),
}

#[derive(Clone)]
struct ArrayTape {
    /// The previous conv state `[B, K-1, C]` and the T raw qkv rows `[B, T,
    /// C]`, kept apart: joined, they would cost a verify two copies a layer
    /// for the rollback's K-1 rows, which are mostly the rows' own.
    conv_before: Array,
    rows: Array,
    /// The recurrent state before the forward.
    ssm_before: Array,
    /// Normalized keys `[B, T, Hk, Dk]`, decays `[B, T, Hv]`, and the per-step
    /// updates `delta_t` `[B, T, Hv, Dv]`.
    k: Array,
    g: Array,
    delta: Array,
    conv_kernel: i32,
    /// Who recorded it: the replay is its twin, for identical rounding.
    by: Recurrence,
}

/// Where the recurrence runs: the GPU kernel, the CPU's host code, or MLX
/// ops (a batch of several rows on the CPU).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recurrence {
    Kernel,
    Host,
    Ops,
}

impl GdnTape {
    /// A tape recorded by the host path (`gated_delta_head`).
    pub(crate) fn host(tape: HostTape) -> Self {
        GdnTape(Recorded::Host(tape))
    }

    /// The MLX arrays it holds (none on the host path).
    pub fn arrays(&self) -> Vec<&Array> {
        match &self.0 {
            Recorded::Arrays(t) => {
                vec![&t.conv_before, &t.rows, &t.ssm_before, &t.k, &t.g, &t.delta]
            }
            Recorded::Host(_) => Vec::new(),
        }
    }

    /// `state` as if only the first `accepted` of the recorded tokens had
    /// been fed: S <- g_t S + k_t delta_t^T replayed for t < accepted, and
    /// the conv state rebuilt from the raw rows.
    pub fn rollback(&self, state: &mut GdnState, accepted: i32) -> Result<()> {
        let t = match &self.0 {
            Recorded::Host(tape) => {
                *state = GdnState {
                    host: Some(tape.rollback(accepted as usize)),
                    ..GdnState::default()
                };
                return Ok(());
            }
            Recorded::Arrays(t) => t,
        };
        state.host = None;
        // Rows accepted .. accepted + K-1 of the conv state followed by the rows.
        let window = t.conv_kernel - 1;
        state.conv = Some(match accepted {
            0 => t.conv_before.clone(),
            a if a >= window => t.rows.index((.., (a - window)..a, ..)).contiguous()?,
            a => concatenate(
                &[
                    t.conv_before.index((.., a.., ..)),
                    t.rows.index((.., ..a, ..)),
                ],
                1,
            )?,
        });
        let (before, k, g, delta) = (&t.ssm_before, &t.k, &t.g, &t.delta);
        state.ssm = Some(match t.by {
            Recurrence::Kernel => gdn_kernels::replay(before, k, g, delta, accepted)?,
            Recurrence::Host => gated_delta_host::replay_arrays(before, k, g, delta, accepted)?,
            Recurrence::Ops => replay(before, k, g, delta, accepted)?,
        });
        Ok(())
    }
}

pub struct GatedDeltaNet {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`: maps of the
    /// same input.
    in_proj: Fused,
    /// `[conv_dim, K, 1]`, MLX's depthwise layout.
    conv_weight: Array,
    dt_bias: Array,
    a_log: Array,
    norm_weight: Array,
    out_proj: Linear,
    num_k_heads: i32,
    num_v_heads: i32,
    head_k_dim: i32,
    head_v_dim: i32,
    conv_kernel: i32,
    eps: f32,
    /// The recurrence on the host (the CPU path, docs/cpu.md).
    host: bool,
    /// `norm_weight` for the host's gated norm (the CPU path).
    host_norm: Option<host::HostVector>,
    /// The conv, q/k norms and gates on the host (the CPU path, bf16).
    host_head: Option<HostHead>,
    /// The convolution of decode steps and verified blocks on the
    /// row-invariant CUDA kernel (`linear::row_kernels`): no cuDNN plan per
    /// block length (docs/gpu.md).
    row_kernel: bool,
    /// The layer's middle as one CUDA kernel ([`gdn_kernels::layer`]), when
    /// the device has it (docs/gpu.md, "One kernel per gated-delta layer").
    fused: Option<(gdn_kernels::LayerShape, gdn_kernels::LayerParams)>,
}

/// `0` keeps CUDA's gated-delta layers op by op instead of
/// [`gdn_kernels::layer`]; benchmarks compare the two.
pub const GDN_LAYER_ENV: &str = "FLASHBAR_GDN_LAYER";

impl GatedDeltaNet {
    pub fn load(weights: &mut Weights, path: &str, config: &TextConfig) -> Result<Self> {
        let mut layer = GatedDeltaNet {
            in_proj: Fused::load(
                weights,
                &["qkv", "z", "b", "a"].map(|part| format!("{path}.in_proj_{part}")),
            )?,
            conv_weight: weights.take(&format!("{path}.conv1d.weight"))?,
            dt_bias: weights.take(&format!("{path}.dt_bias"))?,
            a_log: weights.take(&format!("{path}.A_log"))?,
            norm_weight: weights.take(&format!("{path}.norm.weight"))?,
            out_proj: Linear::load(weights, &format!("{path}.out_proj"))?,
            num_k_heads: config.linear_num_key_heads as i32,
            num_v_heads: config.linear_num_value_heads as i32,
            head_k_dim: config.linear_key_head_dim as i32,
            head_v_dim: config.linear_value_head_dim as i32,
            conv_kernel: config.linear_conv_kernel_dim as i32,
            eps: config.rms_norm_eps,
            host: weights.host_kernels(),
            host_norm: None,
            host_head: None,
            row_kernel: row_kernels(),
            fused: None,
        };
        if layer.host && host::takes(layer.norm_weight.dtype()) {
            layer.host_norm = Some(host::HostVector::of(&layer.norm_weight)?);
        }
        if layer.host {
            layer.host_head = HostHead::new(&layer.conv_weight, &layer.a_log, &layer.dt_bias)?;
        }
        layer.fused = layer.fused_kernel()?;
        Ok(layer)
    }

    /// Runs this layer op by op from now on (the smoke check compares the two).
    pub(crate) fn drop_fused_kernel(&mut self) {
        self.fused = None;
    }

    /// The fused layer kernel's shape and weights, when this device runs it.
    fn fused_kernel(&self) -> Result<Option<(gdn_kernels::LayerShape, gdn_kernels::LayerParams)>> {
        let inv_scale = (self.head_k_dim as f32).powf(-0.5);
        let shape = gdn_kernels::LayerShape {
            hk: self.num_k_heads,
            hv: self.num_v_heads,
            dk: self.head_k_dim,
            dv: self.head_v_dim,
            conv_kernel: self.conv_kernel,
            qk_eps: QK_EPS * inv_scale * inv_scale,
            norm_eps: self.eps,
            q_scale: inv_scale * inv_scale,
            k_scale: inv_scale,
        };
        if !self.row_kernel
            || !gdn_kernels::layer_available(device::current())
            || !shape.supported()
            || std::env::var(GDN_LAYER_ENV).as_deref() == Ok("0")
        {
            return Ok(None);
        }
        let params = gdn_kernels::LayerParams::new(
            &shape,
            &self.conv_weight,
            &self.a_log,
            &self.dt_bias,
            &self.norm_weight,
        )?;
        Ok(Some((shape, params)))
    }

    /// `x`: `[B, S, hidden]`; advances `state` by S tokens.
    pub fn forward(&self, x: &Array, state: &mut GdnState) -> Result<Array> {
        match self.forward_recording(x, state, false, None)?.0 {
            Onto::Apart(out) | Onto::Added(out) => Ok(out),
        }
    }

    /// [`Self::forward`] onto the residual stream `residual` when given,
    /// also returning the rollback tape when `record`.
    pub fn forward_recording(
        &self,
        x: &Array,
        state: &mut GdnState,
        record: bool,
        residual: Option<&Array>,
    ) -> Result<(Onto, Option<GdnTape>)> {
        let (b, s) = (x.shape()[0], x.shape()[1]);
        let (hk, hv, dk, dv) = (
            self.num_k_heads,
            self.num_v_heads,
            self.head_k_dim,
            self.head_v_dim,
        );
        let key_dim = hk * dk;
        let conv_dim = 2 * key_dim + hv * dv;

        let [qkv, z, b_proj, a]: [Array; 4] = self
            .in_proj
            .forward(x)?
            .try_into()
            .map_err(|_| mlx_rs::error::Exception::custom("in_proj gave other than 4 maps"))?;
        if let Some((shape, params)) = &self.fused {
            state.move_to_arrays()?;
            let conv_state = match &state.conv {
                Some(c) => c.clone(),
                None => zeros_dtype(&[b, self.conv_kernel - 1, conv_dim], x.dtype())?,
            };
            let ssm = match &state.ssm {
                Some(s) => s.clone(),
                None => zeros_dtype(&[b, hv, dv, dk], Dtype::Float32)?,
            };
            let out = gdn_kernels::layer(shape, params, &qkv, &z, &b_proj, &a, &conv_state, &ssm)?;
            state.conv = Some(out.conv_state);
            state.ssm = Some(out.state);
            let tape = if record {
                Some(GdnTape(Recorded::Arrays(ArrayTape {
                    conv_before: conv_state,
                    rows: qkv,
                    ssm_before: ssm,
                    k: out.k,
                    g: out.g,
                    delta: out.delta,
                    conv_kernel: self.conv_kernel,
                    by: Recurrence::Kernel,
                })))
            } else {
                None
            };
            return Ok((self.project(&out.out, residual)?, tape));
        }
        let bf16 = [&qkv, &b_proj, &a]
            .iter()
            .all(|p| p.dtype() == Dtype::Bfloat16);
        if let Some(head) = self.host_head.as_ref().filter(|_| b == 1 && bf16) {
            let dims = Dims {
                steps: s as usize,
                hk: hk as usize,
                hv: hv as usize,
                dk: dk as usize,
                dv: dv as usize,
            };
            let (y, tape) = head.forward(&qkv, &b_proj, &a, state, dims, record)?;
            return Ok((self.finish(&y, &z, qkv.dtype(), b, s, residual)?, tape));
        }
        let z_rows = z;
        let beta = sigmoid(&b_proj)?;

        state.move_to_arrays()?;
        let conv_state = match &state.conv {
            Some(c) => c.clone(),
            None => zeros_dtype(&[b, self.conv_kernel - 1, conv_dim], x.dtype())?,
        };
        let conv_for_tape = record.then(|| (conv_state.clone(), qkv.clone()));
        let conv_input = concatenate(&[conv_state, qkv], 1)?;
        let total = conv_input.shape()[1];
        state.conv = Some(
            conv_input
                .index((.., (total - (self.conv_kernel - 1)).., ..))
                .contiguous()?,
        );
        let conv_out = if self.row_kernel
            && row_invariant::takes_depthwise_conv(&conv_input, &self.conv_weight)
        {
            row_invariant::depthwise_conv(&conv_input, &self.conv_weight)?
        } else {
            conv1d(&conv_input, &self.conv_weight, 1, 0, 1, conv_dim)?
        };
        let conv_out = silu(conv_out)?;
        let parts = split_at_indices(&conv_out, &[key_dim, 2 * key_dim], -1)?;
        let q = parts[0].reshape(&[b, s, hk, dk])?;
        let k = parts[1].reshape(&[b, s, hk, dk])?;
        let v = parts[2].reshape(&[b, s, hv, dv])?;
        let (q, k) = normalize_qk(&q, &k, dk)?;

        // g = exp(-exp(A_log) * softplus(a + dt_bias)), in f32.
        let decay = self.a_log.as_dtype(Dtype::Float32)?.exp()?;
        let g = decay
            .multiply(softplus(a.add(&self.dt_bias)?)?)?
            .negative()?
            .exp()?;
        let ssm = match &state.ssm {
            Some(s) => s.clone(),
            None => zeros_dtype(&[b, hv, dv, dk], Dtype::Float32)?,
        };
        // One recurrence per backend, used for every T (decode, verify,
        // prefill), so a verified block equals decoding it token by token.
        let by = if gdn_kernels::available(device::current()) {
            Recurrence::Kernel
        } else if self.host && b == 1 {
            Recurrence::Host
        } else {
            Recurrence::Ops
        };
        let (y, new_ssm, delta) = match by {
            Recurrence::Kernel => {
                let (y, state, delta) = gdn_kernels::record(&q, &k, &v, &g, &beta, &ssm)?;
                (y, state, Some(delta))
            }
            Recurrence::Host => {
                gated_delta_host::record_arrays(&q, &k, &v, &g, &beta, &ssm, record)?
            }
            Recurrence::Ops => recurrence(&q, &k, &v, &g, &beta, ssm.clone(), record)?,
        };
        state.ssm = Some(new_ssm);
        let tape = match (conv_for_tape, delta) {
            (Some((conv_before, rows)), Some(delta)) => {
                Some(GdnTape(Recorded::Arrays(ArrayTape {
                    conv_before,
                    rows,
                    ssm_before: ssm,
                    k,
                    g,
                    delta,
                    conv_kernel: self.conv_kernel,
                    by,
                })))
            }
            _ => None,
        };

        // The recurrence sums in f32; its output goes on in the activations'
        // type, as mlx-lm's does (`y.astype(q.dtype)`). Kept f32, it made
        // the whole residual stream f32 from the first layer on in a bf16
        // model: other rounding than mlx-lm's, and on CUDA every later
        // matmul a f32 one (docs/dflash.md, "Activation types").
        Ok((self.finish(&y, &z_rows, q.dtype(), b, s, residual)?, tape))
    }

    /// The output projection, onto `residual` when given.
    fn project(&self, x: &Array, residual: Option<&Array>) -> Result<Onto> {
        match residual {
            Some(residual) => self.out_proj.forward_onto(x, residual),
            None => Ok(Onto::Apart(self.out_proj.forward(x)?)),
        }
    }

    /// The gated norm of the recurrence's `y` by `z` (`[B, S, Hv * Dv]`),
    /// in the activations' type `act`, and the output projection.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        y: &Array,
        z: &Array,
        act: Dtype,
        b: i32,
        s: i32,
        residual: Option<&Array>,
    ) -> Result<Onto> {
        if let Some(w) = &self.host_norm {
            if let Some(gated) = host::gated_norm(y, z, w, self.eps, act)? {
                return self.project(&gated, residual);
            }
        }
        let z = z.reshape(&[b, s, self.num_v_heads, self.head_v_dim])?;
        let y = y.as_dtype(act)?;
        let normed = rms_norm(&y, Some(&self.norm_weight), self.eps)?;
        let gated = silu(z.as_dtype(Dtype::Float32)?)?
            .multiply(normed.as_dtype(Dtype::Float32)?)?
            .as_dtype(y.dtype())?;
        self.project(&gated.reshape(&[b, s, -1])?, residual)
    }
}

/// The q/k L2 norm's epsilon on the sum of squares.
pub(crate) const QK_EPS: f32 = 1e-6;

/// L2-normalize q and k per head (eps 1e-6 on the sum of squares, as the HF
/// reference does) and fold the Dk^-1/2 readout scale into q.
pub fn normalize_qk(q: &Array, k: &Array, head_k_dim: i32) -> Result<(Array, Array)> {
    let inv_scale = (head_k_dim as f32).powf(-0.5);
    let eps = QK_EPS * inv_scale * inv_scale;
    // Scalars in the inputs' dtype, as Python scalars are in mlx-lm (no promotion).
    let scalar = |value: f32| Array::from_f32(value).as_dtype(q.dtype());
    let q = rms_norm(q, None, eps)?.multiply(scalar(inv_scale * inv_scale)?)?;
    let k = rms_norm(k, None, eps)?.multiply(scalar(inv_scale)?)?;
    Ok((q, k))
}

/// The gated delta recurrence, one token at a time with MLX ops.
/// q, k: `[B, T, Hk, Dk]`; v: `[B, T, Hv, Dv]`; g, beta: `[B, T, Hv]`;
/// state: `[B, Hv, Dv, Dk]` f32. Returns y `[B, T, Hv, Dv]`, the new state,
/// and (when `record`) every step's delta `[B, T, Hv, Dv]`.
pub fn recurrence(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    mut state: Array,
    record: bool,
) -> Result<(Array, Array, Option<Array>)> {
    let (q, k) = (repeat_heads(q, v)?, repeat_heads(k, v)?);
    let steps = q.shape()[1];
    let mut ys = Vec::with_capacity(steps as usize);
    let mut deltas = Vec::with_capacity(if record { steps as usize } else { 0 });
    for t in 0..steps {
        let q_t = q.index((.., t)); // [B, H, Dk]
        let k_t = k.index((.., t)).expand_dims(-2)?; // [B, H, 1, Dk]
        let v_t = v.index((.., t)); // [B, H, Dv]
        let g_t = g.index((.., t)).expand_dims_axes(&[-1, -2])?; // [B, H, 1, 1]
        let beta_t = beta.index((.., t)).expand_dims(-1)?; // [B, H, 1]

        state = state.multiply(&g_t)?;
        let kv = state.multiply(&k_t)?.sum_axis(-1, false)?; // [B, H, Dv]
        let delta = v_t.subtract(&kv)?.multiply(&beta_t)?;
        state = state.add(k_t.multiply(delta.expand_dims(-1)?)?)?;
        let y = state.multiply(q_t.expand_dims(-2)?)?.sum_axis(-1, false)?;
        ys.push(y);
        if record {
            deltas.push(delta);
        }
    }
    let deltas = if record {
        Some(stack(&deltas, 1)?)
    } else {
        None
    };
    Ok((stack(&ys, 1)?, state, deltas))
}

/// The state after `steps` recorded steps: S <- g_t S; S <- S + k_t delta_t^T,
/// with exactly the ops (and so the rounding) of [`recurrence`].
pub fn replay(state: &Array, k: &Array, g: &Array, delta: &Array, steps: i32) -> Result<Array> {
    let k = repeat_heads(k, delta)?;
    let mut state = state.clone();
    for t in 0..steps {
        let k_t = k.index((.., t)).expand_dims(-2)?;
        let g_t = g.index((.., t)).expand_dims_axes(&[-1, -2])?;
        let delta_t = delta.index((.., t));
        state = state.multiply(&g_t)?;
        state = state.add(k_t.multiply(delta_t.expand_dims(-1)?)?)?;
    }
    Ok(state)
}

/// Key heads repeated to the value heads' count (value head h reads key head h / r).
fn repeat_heads(x: &Array, values: &Array) -> Result<Array> {
    let repeat = values.shape()[2] / x.shape()[2];
    Ok(if repeat > 1 {
        repeat_axis::<f32>(x.clone(), repeat, 2)?
    } else {
        x.clone()
    })
}

use mlx_rs::ops::indexing::IndexOp;
