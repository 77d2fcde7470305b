//! CUDA, opt-in (`FLASHBAR_KERNEL_CACHE`): our kernels compiled by us, kept
//! on disk, and launched through MLX's precompiled-kernel call (docs/gpu.md,
//! "The kernel cache").
//!
//! MLX's `cuda_kernel` compiles a custom kernel with NVRTC in every process:
//! its disk cache (`MLX_PTX_CACHE_DIR`) holds MLX's own kernels, not custom
//! ones, so every start pays 1-2 s a kernel variant (13-25 s for a small
//! model on the H200). Here each variant (body, template values, argument
//! types) is compiled once by NVRTC to PTX for this GPU, written to the cache
//! folder, and read back by later processes: a start takes 1-2 s. But MLX
//! keeps no loaded module for a precompiled kernel, so every call hands it
//! the PTX again and the host's part of a decode step doubles (measured on
//! the H200, docs/gpu.md): worth it for short runs (checks, one-off
//! generations), not for a long chat, hence opt-in. The source is the one
//! MLX would build (the same body, the same compile options), so the same
//! arithmetic runs either way, and decode and verify take the same path.

use super::source::{signature_hash, source};
use super::{disk, nvrtc, Body, Launch};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// `FLASHBAR_KERNEL_CACHE`: unset, `0` or `off` launches through MLX's
/// `cuda_kernel` (compiled in each process); `1` or `on` through the cache in
/// `$XDG_CACHE_HOME/flashbar/cuda-kernels` (or `~/.cache/...`); any other
/// value names the cache folder.
const CACHE_ENV: &str = "FLASHBAR_KERNEL_CACHE";

pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| cache_dir().is_some())
}

fn cache_dir() -> Option<PathBuf> {
    disk::folder(CACHE_ENV, "cuda-kernels", false)
}

/// One compiled variant of a body.
struct Variant {
    name: CString,
    binary: Vec<u8>,
    /// The inputs whose shapes the body reads: their sizes follow the
    /// outputs as int arguments.
    shaped: Vec<usize>,
}

type Variants = Mutex<HashMap<(usize, u64), Arc<Variant>>>;

fn variants() -> &'static Variants {
    static VARIANTS: OnceLock<Variants> = OnceLock::new();
    VARIANTS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Runs `spec` on `stream` (a GPU stream) as a precompiled kernel.
pub(crate) fn launch(spec: &Launch, stream: &Stream) -> Result<Vec<Array>, Exception> {
    let key = (spec.body as *const Body as usize, signature_hash(spec));
    let found = variants()
        .lock()
        .map_err(|_| Exception::custom("kernel cache: a thread panicked holding it"))?
        .get(&key)
        .cloned();
    let variant = match found {
        Some(v) => v,
        None => {
            // Compiling can take seconds: not under the lock.
            let made = Arc::new(make(spec, key.1)?);
            variants()
                .lock()
                .map_err(|_| Exception::custom("kernel cache: a thread panicked holding it"))?
                .entry(key)
                .or_insert(made)
                .clone()
        }
    };
    call(&variant, spec, stream)
}

fn call(variant: &Variant, spec: &Launch, stream: &Stream) -> Result<Vec<Array>, Exception> {
    let what = |step: &str| format!("CUDA kernel {}: {step}", spec.body.name);
    let mut shapes = Vec::new();
    let mut ndims = Vec::with_capacity(spec.outputs.len());
    let mut dtypes = Vec::with_capacity(spec.outputs.len());
    for (shape, dtype) in spec.outputs {
        shapes.extend_from_slice(shape);
        ndims.push(shape.len());
        dtypes.push(super::mlx_dtype(*dtype));
    }
    let scalars: Vec<c_int> = variant
        .shaped
        .iter()
        .flat_map(|&i| spec.inputs[i].shape().iter().copied())
        .collect();
    let binary = &variant.binary;
    let pointers: Vec<mlx_sys::mlx_array> = spec.inputs.iter().map(|a| a.as_ptr()).collect();
    // SAFETY: the pointers are live arrays; the vector takes its own references.
    let inputs = super::ArrayVector(unsafe {
        mlx_sys::mlx_vector_array_new_data(pointers.as_ptr(), pointers.len())
    });
    // SAFETY: creates an empty vector that we own.
    let mut outputs = super::ArrayVector(unsafe { mlx_sys::mlx_vector_array_new() });
    // SAFETY: every pointer is valid for its stated length for the call; MLX
    // copies what it keeps. The kernel checks its indices against the sizes
    // passed to it, as in the `cuda_kernel` path.
    let status = unsafe {
        mlx_sys::flashbar_precompiled_cuda_kernel(
            &mut outputs.0,
            variant.name.as_ptr(),
            binary.as_ptr() as *const c_char,
            binary.len(),
            inputs.0,
            shapes.as_ptr(),
            ndims.as_ptr(),
            dtypes.as_ptr(),
            dtypes.len(),
            scalars.as_ptr(),
            scalars.len(),
            spec.grid.as_ptr(),
            spec.group.as_ptr(),
            stream.as_ptr(),
        )
    };
    if status != 0 {
        return Err(Exception::custom(what("launching failed")));
    }
    super::read_outputs(&outputs, spec.output_names.len(), &what)
}

fn make(spec: &Launch, signature: u64) -> Result<Variant, Exception> {
    let body = spec.body;
    let name = format!("{}_{signature:016x}", body.full_name());
    let (source, shaped) = source(spec, &name)?;
    let runtime = nvrtc::runtime()?;
    let arch = &runtime.arch;
    let file = cache_dir().map(|dir| dir.join(format!("{name}.{arch}.ptx")));
    let cached = file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .filter(|ptx| is_ptx(ptx, &name));
    let binary = match cached {
        Some(binary) => binary,
        None => {
            let target = arch.split('.').next().unwrap_or(arch);
            let binary = runtime
                .nvrtc
                .compile(&source, &name, target, &runtime.includes)
                .map_err(|e| Exception::custom(format!("CUDA kernel {}: {e}", body.name)))?;
            if let Some(file) = &file {
                disk::write_whole(file, &binary);
            }
            binary
        }
    };
    Ok(Variant {
        name: CString::new(name).map_err(|e| Exception::custom(e.to_string()))?,
        binary,
        shaped,
    })
}

/// Whether `ptx` is a whole PTX file for kernel `name` (written by
/// [`disk::write_whole`], so never half a file; this guards against other damage).
fn is_ptx(ptx: &[u8], name: &str) -> bool {
    ptx.ends_with(b"\0")
        && std::str::from_utf8(&ptx[..ptx.len() - 1])
            .is_ok_and(|text| text.contains(&format!(".entry {name}(")))
}
