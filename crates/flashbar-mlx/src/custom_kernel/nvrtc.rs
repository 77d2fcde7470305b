//! NVRTC through `dlopen`: in CUDA builds the copy libmlx already loaded,
//! compiling a kernel's source to PTX for this GPU with the options MLX's
//! own JIT uses (the driver turns it into machine code at load); in
//! tests, the NVIDIA wheel's copy in the Python environment.
#![cfg_attr(not(feature = "cuda"), allow(dead_code, unused_imports))]

use mlx_rs::error::Exception;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

type Program = *mut c_void;

type Get = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;

/// NVRTC's calls, looked up once in a loaded libnvrtc: the ones MLX makes
/// (which the NVRTC cache stands in front of, `nvrtc_cache`) and ours.
#[derive(Clone, Copy)]
pub(crate) struct Nvrtc {
    pub create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    pub add_name: unsafe extern "C" fn(Program, *const c_char) -> c_int,
    pub compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    pub lowered: unsafe extern "C" fn(Program, *const c_char, *mut *const c_char) -> c_int,
    pub cubin_size: Size,
    pub cubin: Get,
    pub ptx_size: Size,
    pub ptx: Get,
    pub log_size: Size,
    pub log: Get,
    pub destroy: unsafe extern "C" fn(*mut Program) -> c_int,
    pub version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
}

// SAFETY: plain function pointers into a library that is never unloaded.
unsafe impl Send for Nvrtc {}
unsafe impl Sync for Nvrtc {}

impl Nvrtc {
    /// NVRTC from the library `handle`: a `dlopen` handle, or `RTLD_NEXT`
    /// (the library after this binary that defines the calls).
    pub(crate) fn from_handle(handle: *mut c_void) -> Result<Nvrtc, String> {
        // SAFETY: each symbol is looked up by its documented name and cast
        // to its documented C signature.
        unsafe {
            Ok(Nvrtc {
                create: function(handle, "nvrtcCreateProgram")?,
                add_name: function(handle, "nvrtcAddNameExpression")?,
                compile: function(handle, "nvrtcCompileProgram")?,
                lowered: function(handle, "nvrtcGetLoweredName")?,
                cubin_size: function(handle, "nvrtcGetCUBINSize")?,
                cubin: function(handle, "nvrtcGetCUBIN")?,
                ptx_size: function(handle, "nvrtcGetPTXSize")?,
                ptx: function(handle, "nvrtcGetPTX")?,
                log_size: function(handle, "nvrtcGetProgramLogSize")?,
                log: function(handle, "nvrtcGetProgramLog")?,
                destroy: function(handle, "nvrtcDestroyProgram")?,
                version: function(handle, "nvrtcVersion")?,
            })
        }
    }

    /// NVRTC's version, (major, minor).
    pub(crate) fn version(&self) -> (c_int, c_int) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { (self.version)(&mut major, &mut minor) };
        (major, minor)
    }

    /// Compiles `source` (kernel `name`) to PTX for `arch` ("compute_90"),
    /// with MLX's JIT options: the architecture and the include folders.
    /// The PTX ends with its NUL, as the driver reads it. (PTX, not a cubin:
    /// MLX's precompiled call does not load a cubin it is given.)
    pub(crate) fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        includes: &[PathBuf],
    ) -> Result<Vec<u8>, String> {
        let mut options = vec![format!("--gpu-architecture={arch}")];
        options.extend(
            includes
                .iter()
                .map(|dir| format!("--include-path={}", dir.display())),
        );
        let options: Vec<CString> = options
            .into_iter()
            .map(|o| CString::new(o).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let source = CString::new(source).map_err(|e| e.to_string())?;
        let file = CString::new(format!("{name}.cu")).map_err(|e| e.to_string())?;
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: valid C strings for the call; NVRTC copies the source.
        let status = unsafe {
            (self.create)(
                &mut program,
                source.as_ptr(),
                file.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if status != 0 {
            return Err(format!("nvrtcCreateProgram failed ({status})"));
        }
        // SAFETY: `program` is live until destroyed below; the buffers are sized
        // by NVRTC's own size calls.
        let result = unsafe {
            if (self.compile)(program, option_ptrs.len() as c_int, option_ptrs.as_ptr()) != 0 {
                let mut size = 0usize;
                (self.log_size)(program, &mut size);
                let mut log = vec![0u8; size + 1];
                (self.log)(program, log.as_mut_ptr() as *mut c_char);
                let log = String::from_utf8_lossy(&log[..size])
                    .trim_end_matches('\0')
                    .to_owned();
                Err(format!("compile failed: {}", log.trim()))
            } else {
                let mut size = 0usize;
                (self.ptx_size)(program, &mut size);
                let mut ptx = vec![0u8; size];
                if (self.ptx)(program, ptx.as_mut_ptr() as *mut c_char) != 0 {
                    Err("nvrtcGetPTX failed".to_owned())
                } else {
                    Ok(ptx)
                }
            }
        };
        // SAFETY: destroys the program created above, once.
        unsafe { (self.destroy)(&mut program) };
        result
    }
}

/// NVRTC as libmlx loaded it, with this GPU's architecture (CUDA builds).
#[cfg(feature = "cuda")]
pub(crate) struct Runtime {
    pub nvrtc: Nvrtc,
    /// "compute_90.nvrtc13.0": the GPU a kernel's PTX is for and the
    /// compiler that made it, part of a cached kernel's file name.
    pub arch: String,
    /// The folders the kernels' headers (cuda_fp16.h, cuda_bf16.h) and
    /// theirs (CCCL) come from.
    pub includes: Vec<PathBuf>,
}

#[cfg(feature = "cuda")]
pub(crate) fn runtime() -> Result<&'static Runtime, Exception> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(load)
        .as_ref()
        .map_err(|e| Exception::custom(format!("NVRTC: {e}")))
}

#[cfg(feature = "cuda")]
fn load() -> Result<Runtime, String> {
    let nvrtc = Nvrtc::from_handle(open(&["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"])?)?;
    let cuda = open(&["libcuda.so.1", "libcuda.so"])?;
    // SAFETY: each symbol is looked up by its documented name and cast to
    // its documented C signature.
    let (cc_major, cc_minor) = unsafe {
        let init: unsafe extern "C" fn(u32) -> c_int = function(cuda, "cuInit")?;
        let device_get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int =
            function(cuda, "cuDeviceGet")?;
        let attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int =
            function(cuda, "cuDeviceGetAttribute")?;
        let mut device = 0;
        // 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR.
        let (mut major, mut minor) = (0, 0);
        if init(0) != 0
            || device_get(&mut device, 0) != 0
            || attribute(&mut major, 75, device) != 0
            || attribute(&mut minor, 76, device) != 0
        {
            return Err("no CUDA device to compile for".to_owned());
        }
        (major, minor)
    };
    let (major, minor) = nvrtc.version();
    Ok(Runtime {
        arch: format!("compute_{cc_major}{cc_minor}.nvrtc{major}.{minor}"),
        includes: includes(&library_path("libnvrtc")),
        nvrtc,
    })
}

/// The first of `names` that loads, preferring a copy already loaded.
pub(crate) fn open(names: &[&str]) -> Result<*mut c_void, String> {
    for flags in [libc::RTLD_NOW | libc::RTLD_NOLOAD, libc::RTLD_NOW] {
        for name in names {
            let c = CString::new(*name).map_err(|e| e.to_string())?;
            // SAFETY: a valid C string; the handle is never closed.
            let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
            if !handle.is_null() {
                return Ok(handle);
            }
        }
    }
    Err(format!("none of {names:?} loads"))
}

/// Symbol `name` of `handle` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C function-pointer type the symbol has.
unsafe fn function<F: Copy>(handle: *mut c_void, name: &str) -> Result<F, String> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    let raw = symbol(handle, name)?;
    Ok(std::mem::transmute_copy::<*mut c_void, F>(&raw))
}

fn symbol(handle: *mut c_void, name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a live handle and a valid C string.
    let found = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if found.is_null() {
        Err(format!("no symbol {name}"))
    } else {
        Ok(found)
    }
}

/// The path this process loaded a library from (`/proc/self/maps`).
fn library_path(stem: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{stem}.so")))
        })
        .map(PathBuf::from)
}

/// Where the CUDA headers may be, as MLX's JIT looks for them: the CUDA
/// toolkit (`CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda`), the CCCL headers
/// libmlx ships, and the include folder of the NVIDIA wheel NVRTC came from.
fn includes(nvrtc: &Option<PathBuf>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(lib) = library_path("libmlx") {
        if let Some(root) = lib.parent().and_then(Path::parent) {
            dirs.push(root.join("include").join("cccl"));
        }
    }
    if let Some(dir) = std::env::var_os("MLX_CCCL_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            dirs.push(PathBuf::from(home).join("include"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    if let Some(root) = nvrtc
        .as_ref()
        .and_then(|l| l.parent())
        .and_then(Path::parent)
    {
        dirs.push(root.join("include"));
    }
    dirs.retain(|d| d.is_dir());
    dirs
}

/// The NVIDIA wheel's NVRTC in the Python environment (scripts/setup.sh,
/// tests/python/requirements.txt), for tests on a machine without a GPU:
/// the library's handle and the wheel's include folder (cuda_fp16.h, ...).
#[cfg(test)]
pub(crate) fn wheel() -> (*mut c_void, PathBuf) {
    let root = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/lib"))
        .expect("the Python environment (scripts/setup.sh)")
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/nvidia/cu13"))
        .find(|p| p.is_dir())
        .expect("the nvidia-cuda-nvrtc wheel (tests/python/requirements.txt)");
    let load = |name: &str, flags| {
        let path = CString::new(root.join("lib").join(name).display().to_string()).unwrap();
        // SAFETY: a valid C string; the handle is never closed.
        let handle = unsafe { libc::dlopen(path.as_ptr(), flags) };
        assert!(!handle.is_null(), "{name} does not load");
        handle
    };
    // libnvrtc loads its builtins by name: load them first, globally.
    load(
        "libnvrtc-builtins.so.13.0",
        libc::RTLD_NOW | libc::RTLD_GLOBAL,
    );
    (load("libnvrtc.so.13", libc::RTLD_NOW), root.join("include"))
}
