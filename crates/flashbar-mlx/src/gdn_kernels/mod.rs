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
use mlx_rs::{Array, Dtype, Stream};
use std::ffi::{c_char, c_int, CString};

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
        name: "gdn_record",
        source: source::RECORD,
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
    let n_steps = Array::from_slice(&[n], &[1]);
    let mut outputs = launch(&Launch {
        name: "gdn_replay",
        source: source::REPLAY,
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
    pub const RECORD: &str = include_str!("../../../../kernels/cuda/gdn_record.cu");
    pub const REPLAY: &str = include_str!("../../../../kernels/cuda/gdn_replay.cu");
}

#[cfg(target_os = "macos")]
mod source {
    pub const RECORD: &str = include_str!("../../../../kernels/metal/gdn_record.metal");
    pub const REPLAY: &str = include_str!("../../../../kernels/metal/gdn_replay.metal");
}

#[cfg(not(target_os = "macos"))]
type Active = Cuda;
#[cfg(target_os = "macos")]
type Active = Metal;

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

/// One kernel call: every input and output is f32 except small int32 scalars.
struct Launch<'a> {
    name: &'static str,
    source: &'static str,
    input_names: &'a [&'a str],
    output_names: &'a [&'a str],
    inputs: &'a [&'a Array],
    output_shapes: &'a [Vec<i32>],
    dims: Dims,
}

/// MLX's name for a kernel, with a hash of its source: MLX caches compiled
/// CUDA kernels on disk by name alone (`MLX_PTX_CACHE_DIR`, default
/// `$TMPDIR/mlx/<version>/ptx`), so an edited source needs a new name.
fn kernel_name(base: &str, source: &str) -> String {
    // FNV-1a, 64 bits.
    let hash = source.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, byte| {
        (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("flashbar_{base}_{hash:016x}")
}

/// Runs `spec` on the current default (or scoped) stream, which must be a GPU one.
fn launch(spec: &Launch) -> Result<Vec<Array>, Exception> {
    let stream = Stream::thread_local_or_default();
    if !on_gpu(&stream) {
        return Err(Exception::custom(format!(
            "{} kernel {}: runs only on a GPU stream (the current default device is not a GPU)",
            Active::NAME,
            spec.name
        )));
    }
    launch_on::<Active>(spec, &stream)
}

fn launch_on<A: KernelApi>(spec: &Launch, stream: &Stream) -> Result<Vec<Array>, Exception> {
    let what = |step: &str| format!("{} kernel {}: {step}", A::NAME, spec.name);
    let rows = spec.dims.rows()?;

    let kernel = Kernel::<A>::new(spec.name, spec.source, spec.input_names, spec.output_names)?;
    let config = Config::<A>::new().ok_or_else(|| Exception::custom(what("no config")))?;
    let check = |status: c_int, step: &str| {
        if status == 0 {
            Ok(())
        } else {
            Err(Exception::custom(what(&format!("{step} failed"))))
        }
    };
    for shape in spec.output_shapes {
        // SAFETY: `shape` outlives the call; mlx-c copies it.
        let status = unsafe {
            A::add_output_arg(
                config.0,
                shape.as_ptr(),
                shape.len(),
                mlx_sys::mlx_dtype__MLX_FLOAT32,
            )
        };
        check(status, "adding an output")?;
    }
    // SAFETY: plain value arguments on a live config.
    check(
        unsafe { A::set_grid(config.0, rows, 1, 1) },
        "setting the grid",
    )?;
    check(
        unsafe { A::set_thread_group(config.0, THREADS_PER_GROUP, 1, 1) },
        "setting the thread group",
    )?;
    for (arg, value) in spec.dims.template_args() {
        let arg = c_string(arg)?;
        // SAFETY: `arg` is a valid C string for the call; mlx-c copies it.
        check(
            unsafe { A::add_template_arg_int(config.0, arg.as_ptr(), value) },
            "adding a template argument",
        )?;
    }

    let pointers: Vec<mlx_sys::mlx_array> = spec.inputs.iter().map(|a| a.as_ptr()).collect();
    // SAFETY: the pointers are live arrays; the vector takes its own references.
    let inputs = ArrayVector(unsafe {
        mlx_sys::mlx_vector_array_new_data(pointers.as_ptr(), pointers.len())
    });
    // SAFETY: creates an empty vector that we own.
    let mut outputs = ArrayVector(unsafe { mlx_sys::mlx_vector_array_new() });
    // SAFETY: every handle is live; the kernel body only touches its rows of
    // the f32 buffers declared above (bounds are checked in the body).
    let status = unsafe {
        A::apply(
            &mut outputs.0,
            kernel.0,
            inputs.0,
            config.0,
            stream.as_ptr(),
        )
    };
    check(status, "launching")?;

    // SAFETY: `outputs` is a live vector filled by the call above.
    let count = unsafe { mlx_sys::mlx_vector_array_size(outputs.0) };
    if count != spec.output_names.len() {
        return Err(Exception::custom(what(&format!(
            "returned {count} outputs, expected {}",
            spec.output_names.len()
        ))));
    }
    (0..count)
        .map(|index| {
            // SAFETY: `raw` is a fresh handle that the Array takes over (and
            // frees, even when the get failed and left it empty).
            let (array, status) = unsafe {
                let mut raw = mlx_sys::mlx_array_new();
                let status = mlx_sys::mlx_vector_array_get(&mut raw, outputs.0, index);
                (Array::from_ptr(raw), status)
            };
            check(status, "reading an output")?;
            Ok(array)
        })
        .collect()
}

/// Whether `stream` runs on the GPU.
fn on_gpu(stream: &Stream) -> bool {
    // SAFETY: the device handle is created, filled and freed here.
    unsafe {
        let mut device = mlx_sys::mlx_device_new();
        let mut kind = mlx_sys::mlx_device_type__MLX_CPU;
        let known = mlx_sys::mlx_stream_get_device(&mut device, stream.as_ptr()) == 0
            && mlx_sys::mlx_device_get_type(&mut kind, device) == 0;
        mlx_sys::mlx_device_free(device);
        known && kind == mlx_sys::mlx_device_type__MLX_GPU
    }
}

mod ffi;
#[cfg(not(target_os = "macos"))]
use ffi::Cuda;
#[cfg(target_os = "macos")]
use ffi::Metal;
use ffi::{c_string, ArrayVector, Config, Kernel, KernelApi};

#[cfg(test)]
mod tests;
