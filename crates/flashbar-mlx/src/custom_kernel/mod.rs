//! Our own GPU kernels, launched through mlx-c's `mlx_fast_cuda_kernel_*` and
//! `mlx_fast_metal_kernel_*` (mlx-rs wraps neither): one launcher for every
//! kernel body in `kernels/` (kernels/README.md says how MLX wraps a body).
//!
//! Errors: if mlx-c refuses a call, its message goes to mlx-rs' error
//! handler, which only mlx-rs itself can read, so the [`Exception`] names the
//! step that failed. Kernel compile errors surface, with the compiler's log,
//! when the outputs are evaluated.

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};
use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{c_int, CStr, CString};
use std::sync::OnceLock;

pub mod baked;
#[cfg(target_os = "linux")]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod disk;
mod ffi;
#[cfg(target_os = "linux")]
mod include;
#[cfg(target_os = "linux")]
mod nvrtc;
#[cfg(target_os = "linux")]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod nvrtc_cache;
#[cfg(all(feature = "cuda", target_os = "linux"))]
mod precompiled;
pub(crate) mod scalars;
#[cfg_attr(not(all(feature = "cuda", target_os = "linux")), allow(dead_code))]
mod source;
#[cfg(not(target_os = "macos"))]
pub(crate) use ffi::Cuda as Active;
pub(crate) use ffi::Kernel;
pub(crate) use ffi::KernelApi;
#[cfg(target_os = "macos")]
pub(crate) use ffi::Metal as Active;
use ffi::{c_string, ArrayVector, Config};
#[cfg(test)]
pub(crate) use ffi::{Cuda, Metal};

/// A kernel body and the name it is registered under.
pub(crate) struct Body {
    pub name: &'static str,
    pub source: &'static str,
    hash: u64,
    /// The source as MLX gets it (comments and indentation dropped), made once.
    compact: OnceLock<CString>,
}

impl Body {
    pub(crate) const fn new(name: &'static str, source: &'static str) -> Body {
        Body {
            name,
            source,
            hash: fnv1a(source),
            compact: OnceLock::new(),
        }
    }

    /// The source without comments, indentation or blank lines. MLX copies,
    /// scans and hashes a custom kernel's whole source on every call (to
    /// build it and to find its compiled module), so a decode step's few
    /// hundred calls pay for every byte (docs/gpu.md, "The cost of a call").
    pub(crate) fn compact_source(&self) -> &CStr {
        self.compact.get_or_init(|| {
            CString::new(compact(self.source)).expect("kernel sources hold no NUL byte")
        })
    }

    /// The kernel's name, with a hash of its source: compiled kernels are
    /// cached by name (on disk by `precompiled`, in each process by MLX), so
    /// an edited source needs a new name.
    pub(crate) fn full_name(&self) -> String {
        format!("flashbar_{}_{:016x}", self.name, self.hash)
    }
}

/// `source` with `//` comments (outside string literals), leading and
/// trailing blanks and empty lines removed; line breaks kept, so
/// preprocessor lines stay lines.
fn compact(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let code = match line.find("//") {
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        };
        let code = code.trim();
        if !code.is_empty() {
            out.push_str(code);
            out.push('\n');
        }
    }
    out
}

/// FNV-1a, 64 bits, at compile time.
const fn fnv1a(text: &str) -> u64 {
    let bytes = text.as_bytes();
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < bytes.len() {
        hash = (hash ^ bytes[i] as u64).wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// One kernel call.
pub(crate) struct Launch<'a> {
    pub body: &'a Body,
    pub input_names: &'a [&'a str],
    pub output_names: &'a [&'a str],
    pub inputs: &'a [&'a Array],
    pub outputs: &'a [(Vec<i32>, Dtype)],
    /// Threads (not blocks) in x, y, z.
    pub grid: [i32; 3],
    pub group: [i32; 3],
    pub template: &'a [(&'a str, i32)],
}

/// Runs `spec` on the current default (or scoped) stream, which must be a GPU one.
pub(crate) fn launch(spec: &Launch) -> Result<Vec<Array>, Exception> {
    let stream = Stream::thread_local_or_default();
    if !on_gpu(&stream) {
        return Err(Exception::custom(format!(
            "{} kernel {}: runs only on a GPU stream (the current default device is not a GPU)",
            Active::NAME,
            spec.body.name
        )));
    }
    #[cfg(all(feature = "cuda", target_os = "linux"))]
    if precompiled::enabled() {
        return precompiled::launch(spec, &stream);
    }
    // One kernel object per body and argument names (and template values,
    // where they are written into the source: `baked`), made on first use:
    // making one scans the whole source for each argument's name. Keyed by
    // hashes, so that a call allocates nothing to find it.
    thread_local! {
        static KERNELS: RefCell<HashMap<(usize, u64, u64), Kernel<Active>>> =
            RefCell::new(HashMap::new());
    }
    let baked = baked::enabled() && !spec.template.is_empty();
    let key = (
        spec.body as *const Body as usize,
        names_hash(spec.input_names, spec.output_names),
        if baked { baked::hash(spec.template) } else { 0 },
    );
    KERNELS.with(|kernels| {
        let mut kernels = kernels.borrow_mut();
        let kernel = match kernels.entry(key) {
            Entry::Occupied(made) => made.into_mut(),
            Entry::Vacant(slot) => slot.insert(Kernel::<Active>::new(
                spec.body,
                spec.input_names,
                spec.output_names,
                if baked { spec.template } else { &[] },
            )?),
        };
        if baked {
            launch_with(
                kernel,
                &Launch {
                    template: &[],
                    ..*spec
                },
                &stream,
            )
        } else {
            launch_with(kernel, spec, &stream)
        }
    })
}

/// FNV-1a over the input names, a separator, then the output names (each
/// name ended by a NUL, which no name holds).
fn names_hash(inputs: &[&str], outputs: &[&str]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut add = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for name in inputs {
        add(name.as_bytes());
        add(&[0]);
    }
    add(&[1, 0]);
    for name in outputs {
        add(name.as_bytes());
        add(&[0]);
    }
    hash
}

#[cfg(test)]
pub(crate) fn launch_on<A: KernelApi>(
    spec: &Launch,
    stream: &Stream,
) -> Result<Vec<Array>, Exception> {
    let kernel = Kernel::<A>::new(spec.body, spec.input_names, spec.output_names, &[])?;
    launch_with(&kernel, spec, stream)
}

fn launch_with<A: KernelApi>(
    kernel: &Kernel<A>,
    spec: &Launch,
    stream: &Stream,
) -> Result<Vec<Array>, Exception> {
    let what = |step: &str| format!("{} kernel {}: {step}", A::NAME, spec.body.name);
    let config = Config::<A>::new().ok_or_else(|| Exception::custom(what("no config")))?;
    let check = |status: c_int, step: &str| {
        if status == 0 {
            Ok(())
        } else {
            Err(Exception::custom(what(&format!("{step} failed"))))
        }
    };
    for (shape, dtype) in spec.outputs {
        // SAFETY: `shape` outlives the call; mlx-c copies it.
        let status =
            unsafe { A::add_output_arg(config.0, shape.as_ptr(), shape.len(), mlx_dtype(*dtype)) };
        check(status, "adding an output")?;
    }
    let ([gx, gy, gz], [tx, ty, tz]) = (spec.grid, spec.group);
    // SAFETY: plain value arguments on a live config.
    check(
        unsafe { A::set_grid(config.0, gx, gy, gz) },
        "setting the grid",
    )?;
    check(
        unsafe { A::set_thread_group(config.0, tx, ty, tz) },
        "setting the thread group",
    )?;
    for (arg, value) in spec.template {
        let status = with_c_name(arg, |arg| {
            // SAFETY: `arg` is a valid C string for the call; mlx-c copies it.
            unsafe { A::add_template_arg_int(config.0, arg.as_ptr(), *value) }
        })?;
        check(status, "adding a template argument")?;
    }

    let pointers: Vec<mlx_sys::mlx_array> = spec.inputs.iter().map(|a| a.as_ptr()).collect();
    // SAFETY: the pointers are live arrays; the vector takes its own references.
    let inputs = ArrayVector(unsafe {
        mlx_sys::mlx_vector_array_new_data(pointers.as_ptr(), pointers.len())
    });
    // SAFETY: creates an empty vector that we own.
    let mut outputs = ArrayVector(unsafe { mlx_sys::mlx_vector_array_new() });
    // SAFETY: every handle is live; each kernel body checks its indices
    // against the sizes of the buffers declared above.
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

    read_outputs(&outputs, spec.output_names.len(), &what)
}

/// `f` on `name` as a C string, made once per name and thread (a decode
/// step names a few template arguments some 400 times).
fn with_c_name<R>(name: &str, f: impl FnOnce(&CStr) -> R) -> Result<R, Exception> {
    thread_local! {
        static NAMES: RefCell<HashMap<Box<str>, CString>> = RefCell::new(HashMap::new());
    }
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if !names.contains_key(name) {
            names.insert(name.into(), c_string(name)?);
        }
        Ok(f(&names[name]))
    })
}

/// The arrays of a launch's output vector, `expected` of them.
fn read_outputs(
    outputs: &ArrayVector,
    expected: usize,
    what: &dyn Fn(&str) -> String,
) -> Result<Vec<Array>, Exception> {
    let check = |status: c_int, step: &str| {
        if status == 0 {
            Ok(())
        } else {
            Err(Exception::custom(what(&format!("{step} failed"))))
        }
    };
    // SAFETY: `outputs` is a live vector filled by a launch.
    let count = unsafe { mlx_sys::mlx_vector_array_size(outputs.0) };
    if count != expected {
        return Err(Exception::custom(what(&format!(
            "returned {count} outputs, expected {expected}"
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

fn mlx_dtype(dtype: Dtype) -> mlx_sys::mlx_dtype {
    match dtype {
        Dtype::Bfloat16 => mlx_sys::mlx_dtype__MLX_BFLOAT16,
        Dtype::Float16 => mlx_sys::mlx_dtype__MLX_FLOAT16,
        Dtype::Int32 => mlx_sys::mlx_dtype__MLX_INT32,
        Dtype::Uint32 => mlx_sys::mlx_dtype__MLX_UINT32,
        _ => mlx_sys::mlx_dtype__MLX_FLOAT32,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_names_key_their_kernel_apart() {
        let key = names_hash(&["q", "k"], &["out"]);
        assert_eq!(key, names_hash(&["q", "k"], &["out"]));
        assert_ne!(
            key,
            names_hash(&["q"], &["k", "out"]),
            "the split between inputs and outputs"
        );
        assert_ne!(
            key,
            names_hash(&["qk"], &["out"]),
            "the split between names"
        );
        assert_ne!(key, names_hash(&["q", "k"], &["y"]));
    }

    #[test]
    fn template_names_reach_mlx_as_c_strings() {
        let first = with_c_name("GROUP", |c| c.to_str().unwrap().to_owned()).unwrap();
        assert_eq!(first, "GROUP");
        assert!(
            with_c_name("A\0B", |_| ()).is_err(),
            "a NUL is refused, not cut"
        );
    }

    #[test]
    fn names_change_with_the_source() {
        let full = |source| Body::new("x", source).full_name();
        assert_eq!(full("a"), full("a"));
        assert_ne!(full("a"), full("b"));
        assert!(full("any body")
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }

    #[test]
    fn output_dtypes_reach_mlx_as_named() {
        assert_eq!(mlx_dtype(Dtype::Bfloat16), mlx_sys::mlx_dtype__MLX_BFLOAT16);
        assert_eq!(mlx_dtype(Dtype::Float16), mlx_sys::mlx_dtype__MLX_FLOAT16);
        assert_eq!(mlx_dtype(Dtype::Float32), mlx_sys::mlx_dtype__MLX_FLOAT32);
        assert_eq!(mlx_dtype(Dtype::Uint32), mlx_sys::mlx_dtype__MLX_UINT32);
    }

    #[test]
    fn a_compact_source_keeps_the_code_and_drops_the_comments() {
        let source = "// heading\n\n  #if A == 1  // why\n  asm(\"a // b\");\n#endif\n";
        assert_eq!(compact(source), "#if A == 1\nasm(\"a // b\");\n#endif\n");
        let qmm = include_str!("../../../../kernels/cuda/qmm.cu");
        let small = compact(qmm);
        assert!(
            small.len() * 10 < qmm.len() * 7,
            "{} of {} bytes",
            small.len(),
            qmm.len()
        );
        assert!(small.lines().all(|l| !l.starts_with("//") && l == l.trim()));
        // Every statement survives: the same count of `;` outside comments.
        let code = |s: &str| -> usize {
            s.lines()
                .map(|l| l.split("//").next().unwrap_or("").matches(';').count())
                .sum()
        };
        assert_eq!(code(qmm), code(&small));
    }
}
