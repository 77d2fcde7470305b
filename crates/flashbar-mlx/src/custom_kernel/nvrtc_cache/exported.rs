//! The NVRTC calls libmlx makes, defined by the CUDA binary
//! (`flashbar-cli`'s build script exports them, so libmlx's calls land here
//! before the real NVRTC): each goes through the cache.
#![allow(non_snake_case, clippy::missing_safety_doc)]
use super::{Cache, Nvrtc, Program};
use std::ffi::{c_char, c_int};
use std::path::PathBuf;
use std::sync::OnceLock;

/// NVRTC_ERROR_INTERNAL_ERROR: no real NVRTC was found.
const INTERNAL: c_int = 11;

/// `FLASHBAR_NVRTC_CACHE`: unset, `1` or `on`, the cache lives in
/// `$XDG_CACHE_HOME/flashbar/nvrtc` (or `~/.cache/...`); `0` or `off`,
/// every call goes straight to NVRTC; else it names the folder. On by
/// default since it held on a GPU (docs/gpu.md, "The NVRTC cache").
fn folder() -> Option<PathBuf> {
    super::super::disk::folder("FLASHBAR_NVRTC_CACHE", "nvrtc", true)
}

fn cache() -> Option<&'static Cache> {
    static CACHE: OnceLock<Option<Cache>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            // RTLD_NEXT finds the library after this binary that defines
            // the calls (libnvrtc); failing that, libnvrtc by name.
            let real = Nvrtc::from_handle(libc::RTLD_NEXT).or_else(|_| {
                let handle = super::super::nvrtc::open(&[
                    "libnvrtc.so.13",
                    "libnvrtc.so.12",
                    "libnvrtc.so",
                ])?;
                Nvrtc::from_handle(handle)
            });
            real.ok().map(|real| Cache::new(real, folder()))
        })
        .as_ref()
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcCreateProgram(
    program: *mut Program,
    source: *const c_char,
    name: *const c_char,
    count: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> c_int {
    cache().map_or(INTERNAL, |c| {
        c.create(program, source, name, count, headers, include_names)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcAddNameExpression(program: Program, name: *const c_char) -> c_int {
    cache().map_or(INTERNAL, |c| c.add_name(program, name))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcCompileProgram(
    program: Program,
    count: c_int,
    options: *const *const c_char,
) -> c_int {
    cache().map_or(INTERNAL, |c| c.compile(program, count, options))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetLoweredName(
    program: Program,
    name: *const c_char,
    out: *mut *const c_char,
) -> c_int {
    cache().map_or(INTERNAL, |c| c.lowered(program, name, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBINSize(program: Program, out: *mut usize) -> c_int {
    cache().map_or(INTERNAL, |c| c.code_size(program, true, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBIN(program: Program, out: *mut c_char) -> c_int {
    cache().map_or(INTERNAL, |c| c.code(program, true, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTXSize(program: Program, out: *mut usize) -> c_int {
    cache().map_or(INTERNAL, |c| c.code_size(program, false, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTX(program: Program, out: *mut c_char) -> c_int {
    cache().map_or(INTERNAL, |c| c.code(program, false, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLogSize(program: Program, out: *mut usize) -> c_int {
    cache().map_or(INTERNAL, |c| c.log_size(program, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLog(program: Program, out: *mut c_char) -> c_int {
    cache().map_or(INTERNAL, |c| c.log(program, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvrtcDestroyProgram(program: *mut Program) -> c_int {
    cache().map_or(INTERNAL, |c| c.destroy(program))
}
