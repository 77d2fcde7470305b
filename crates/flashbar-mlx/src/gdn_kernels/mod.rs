//! Custom GPU kernels for the gated-delta (GDN) recurrence with a rollback tape.
//!
//! Two kernels, each a kernel *body* in `kernels/` that MLX compiles at run
//! time under a name (MLX writes the signature from the input and output names):
//!
//! - `gdn_record` (`kernels/cuda/gdn_record.cu`, `kernels/metal/gdn_record.metal`):
//!   runs T steps of the recurrence from `state` and returns the outputs `y`,
//!   the new state and the tape `delta` (what a rollback needs besides k and g).
//! - `gdn_replay` (`gdn_replay.cu`, `gdn_replay.metal`): re-advances a saved
//!   state through the first n steps of a tape, giving bit for bit the state
//!   `gdn_record` reached after those n steps.
//! - `gdn_layer` (`gdn_layer.cu`, CUDA only, [`layer`]): the whole middle of
//!   a layer (conv, norms, gating, the recurrence as `gdn_record` runs it,
//!   the gated norm) in one launch; `gdn_replay` rolls its tape back too.
//!
//! CUDA goes through mlx-c's `mlx_fast_cuda_kernel_*` (mlx-rs has no wrapper);
//! Metal (macOS) through `mlx_fast_metal_kernel_*`, which has the same shape, so
//! one generic launcher serves both (`KernelApi`). The CPU backend has no
//! custom kernels: check [`available`] and use the MLX-ops recurrence there.
//!
//! Shapes: q, k `[B, T, Hk, Dk]`; v `[B, T, Hv, Dv]`; g, beta `[B, T, Hv]`;
//! state `[B, Hv, Dv, Dk]`; Hv a multiple of Hk (value head `hv` reads key head
//! `hv / (Hv / Hk)`). Inputs of any float dtype are cast to f32; every output
//! is f32. Hk, Hv, Dk, Dv are compile-time constants of the kernels (one build
//! per model shape); B, T and n are run-time values.
//!
//! Errors: shapes and the device are checked here first. If mlx-c still
//! refuses a call, its message goes to mlx-rs' error handler, which only
//! mlx-rs itself can read, so the [`Exception`] names the step that failed.
//! Kernel compile errors surface, with the compiler's log, when the outputs
//! are evaluated.

use crate::device::Backend;
use mlx_rs::error::Exception;

mod layer;
pub use layer::{layer, layer_available, LayerOutputs, LayerParams, LayerShape};
use mlx_rs::{Array, Dtype};

/// Whether `backend` has these kernels (CUDA on Linux, Metal on macOS).
pub fn available(backend: Backend) -> bool {
    match backend {
        Backend::Cuda => cfg!(not(target_os = "macos")),
        Backend::Metal => cfg!(target_os = "macos"),
        Backend::Cpu => false,
    }
}

/// Runs the recurrence over all T steps of the inputs from `state`.
/// Returns `(y [B,T,Hv,Dv], new state [B,Hv,Dv,Dk], delta [B,T,Hv,Dv])`, all f32.
/// Lazy like any MLX op; runs on the current default (or scoped) stream, which
/// must be a GPU stream.
pub fn record(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<(Array, Array, Array), Exception> {
    // Casting first also makes sure mlx-rs has installed its error handler
    // before any of the raw mlx-c calls below can report an error.
    let (q, k, v) = (f32(q)?, f32(k)?, f32(v)?);
    let (g, beta, state) = (f32(g)?, f32(beta)?, f32(state)?);
    let dims = Dims::of(&k, &v, &state)?;
    let (b, t) = (dims.batch, dims.steps);
    expect_shape("q", &q, &[b, t, dims.hk, dims.dk])?;
    expect_shape("g", &g, &[b, t, dims.hv])?;
    expect_shape("beta", &beta, &[b, t, dims.hv])?;

    let per_step = vec![b, t, dims.hv, dims.dv];
    let mut outputs = launch(&Launch {
        body: &source::RECORD,
        input_names: &["q", "k", "v", "g", "beta", "state"],
        output_names: &["y", "state_out", "delta"],
        inputs: &[&q, &k, &v, &g, &beta, &state],
        output_shapes: &[per_step.clone(), state.shape().to_vec(), per_step],
        dims,
    })?
    .into_iter();
    match (outputs.next(), outputs.next(), outputs.next()) {
        (Some(y), Some(state), Some(delta)) => Ok((y, state, delta)),
        _ => Err(Exception::custom("gdn_record returned too few outputs")),
    }
}

/// Replays the first `n` (0..=T) steps of a tape from `state0`:
/// `s = s * g_t; s = s + k_t (x) delta_t`. k `[B,T,Hk,Dk]`, g `[B,T,Hv]` and
/// delta `[B,T,Hv,Dv]` are what [`record`] was given / returned; the result
/// equals, bit for bit, the state `record` reaches after the same n steps.
pub fn replay(
    state0: &Array,
    k: &Array,
    g: &Array,
    delta: &Array,
    n: i32,
) -> Result<Array, Exception> {
    let (state0, k, g, delta) = (f32(state0)?, f32(k)?, f32(g)?, f32(delta)?);
    let dims = Dims::of(&k, &delta, &state0)?;
    expect_shape("g", &g, &[dims.batch, dims.steps, dims.hv])?;
    if !(0..=dims.steps).contains(&n) {
        return Err(Exception::custom(format!(
            "gdn_replay: n = {n} is outside 0..={} (the tape's steps)",
            dims.steps
        )));
    }
    let n_steps = crate::custom_kernel::scalars::int(n);
    let mut outputs = launch(&Launch {
        body: &source::REPLAY,
        input_names: &["state0", "k", "g", "delta", "n_steps"],
        output_names: &["state_out"],
        inputs: &[&state0, &k, &g, &delta, &n_steps],
        output_shapes: &[state0.shape().to_vec()],
        dims,
    })?;
    outputs
        .pop()
        .ok_or_else(|| Exception::custom("gdn_replay returned no output"))
}

/// The kernel bodies of the backend this build targets.
#[cfg(not(target_os = "macos"))]
mod source {
    use crate::custom_kernel::Body;
    pub static RECORD: Body = Body::new(
        "gdn_record",
        include_str!("../../../../kernels/cuda/gdn_record.cu"),
    );
    pub static REPLAY: Body = Body::new(
        "gdn_replay",
        include_str!("../../../../kernels/cuda/gdn_replay.cu"),
    );
}

#[cfg(target_os = "macos")]
mod source {
    use crate::custom_kernel::Body;
    pub static RECORD: Body = Body::new(
        "gdn_record",
        include_str!("../../../../kernels/metal/gdn_record.metal"),
    );
    pub static REPLAY: Body = Body::new(
        "gdn_replay",
        include_str!("../../../../kernels/metal/gdn_replay.metal"),
    );
}

/// Threads per block / threadgroup; the grid is one thread per state row.
const THREADS_PER_GROUP: i32 = 64;

fn f32(array: &Array) -> Result<Array, Exception> {
    array.as_dtype(Dtype::Float32)
}

/// The recurrence's sizes, taken from a `[B,T,Hk,Dk]` key array, a
/// `[B,T,Hv,Dv]` per-step value-side array and the `[B,Hv,Dv,Dk]` state.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: i32,
    steps: i32,
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
}

impl Dims {
    fn of(k: &Array, per_step: &Array, state: &Array) -> Result<Self, Exception> {
        let (ks, ps) = (k.shape(), per_step.shape());
        if ks.len() != 4 || ps.len() != 4 {
            return Err(Exception::custom(format!(
                "gdn kernels: expected k [B,T,Hk,Dk] and [B,T,Hv,Dv], got {ks:?} and {ps:?}"
            )));
        }
        let dims = Dims {
            batch: ks[0],
            steps: ks[1],
            hk: ks[2],
            dk: ks[3],
            hv: ps[2],
            dv: ps[3],
        };
        expect_shape(
            "v/delta",
            per_step,
            &[dims.batch, dims.steps, dims.hv, dims.dv],
        )?;
        expect_shape("state", state, &[dims.batch, dims.hv, dims.dv, dims.dk])?;
        if dims.batch < 1 || dims.hk < 1 || dims.dk < 1 || dims.dv < 1 || dims.hv % dims.hk != 0 {
            return Err(Exception::custom(format!(
                "gdn kernels: unsupported sizes {dims:?} (need B, Hk, Dk, Dv >= 1 and Hv a multiple of Hk)"
            )));
        }
        Ok(dims)
    }

    /// One thread per state row (b, hv, dv).
    fn rows(&self) -> Result<i32, Exception> {
        self.batch
            .checked_mul(self.hv)
            .and_then(|r| r.checked_mul(self.dv))
            .ok_or_else(|| Exception::custom(format!("gdn kernels: {self:?} is too large")))
    }

    fn template_args(&self) -> [(&'static str, i32); 4] {
        [
            ("HK", self.hk),
            ("HV", self.hv),
            ("DK", self.dk),
            ("DV", self.dv),
        ]
    }
}

fn expect_shape(what: &str, array: &Array, shape: &[i32]) -> Result<(), Exception> {
    if array.shape() == shape {
        Ok(())
    } else {
        Err(Exception::custom(format!(
            "gdn kernels: {what} has shape {:?}, expected {shape:?}",
            array.shape()
        )))
    }
}

/// One recurrence kernel call: every input and output is f32 (plus small
/// int32 scalars), one thread per state row.
struct Launch<'a> {
    body: &'static Body,
    input_names: &'a [&'a str],
    output_names: &'a [&'a str],
    inputs: &'a [&'a Array],
    output_shapes: &'a [Vec<i32>],
    dims: Dims,
}

impl Launch<'_> {
    fn run(
        &self,
        run: impl FnOnce(&custom_kernel::Launch) -> Result<Vec<Array>, Exception>,
    ) -> Result<Vec<Array>, Exception> {
        let outputs: Vec<(Vec<i32>, Dtype)> = self
            .output_shapes
            .iter()
            .map(|shape| (shape.clone(), Dtype::Float32))
            .collect();
        let template = self.dims.template_args();
        run(&custom_kernel::Launch {
            body: self.body,
            input_names: self.input_names,
            output_names: self.output_names,
            inputs: self.inputs,
            outputs: &outputs,
            grid: [self.dims.rows()?, 1, 1],
            group: [THREADS_PER_GROUP, 1, 1],
            template: &template,
        })
    }
}

/// Runs `spec` on the current default (or scoped) stream, which must be a GPU one.
fn launch(spec: &Launch) -> Result<Vec<Array>, Exception> {
    spec.run(custom_kernel::launch)
}

use crate::custom_kernel::{self, Body};

#[cfg(test)]
mod tests;
