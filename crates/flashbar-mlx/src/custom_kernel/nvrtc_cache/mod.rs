//! A disk cache under MLX's own NVRTC calls (docs/gpu.md, "The kernel
//! cache"): MLX 0.32.2 compiles every custom kernel again in each process
//! (13-25 s a start on the H200) and its cheap-call path cannot be given a
//! compiled kernel. So the CUDA binary defines the NVRTC calls MLX makes
//! (`exported`, below), and this cache answers `nvrtcCompileProgram` from
//! disk when it has seen the same source, headers, name expressions,
//! options and NVRTC version before; otherwise the real NVRTC compiles and
//! the result is stored. Every other call goes to the real NVRTC, or, for a
//! program answered from disk, is answered from the stored entry.
//!
//! On by default (it held on an H100: docs/gpu.md, "The NVRTC cache");
//! `FLASHBAR_NVRTC_CACHE=0` sends every call straight through, a folder
//! moves the cache there.

use super::nvrtc::Nvrtc;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

pub(crate) type Program = *mut c_void;
const SUCCESS: c_int = 0;
/// NVRTC_ERROR_INVALID_INPUT.
const INVALID_INPUT: c_int = 3;

/// What a compile left: the machine code (cubin) or PTX, and the lowered
/// name of each name expression.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    cubin: bool,
    code: Vec<u8>,
    lowered: Vec<(CString, CString)>,
}

/// One live program: what its key is made of, and the entry that answered
/// its compile, if the disk did.
#[derive(Default)]
struct State {
    key: Vec<u8>,
    names: Vec<CString>,
    served: Option<Entry>,
}

pub(crate) struct Cache {
    real: Nvrtc,
    dir: Option<PathBuf>,
    programs: Mutex<HashMap<usize, State>>,
    /// Compiles the real NVRTC ran (for tests and logs).
    pub compiled: AtomicUsize,
}

impl Cache {
    /// `dir`: where entries live; `None` passes every call through.
    pub(crate) fn new(real: Nvrtc, dir: Option<PathBuf>) -> Cache {
        Cache {
            real,
            dir,
            programs: Mutex::new(HashMap::new()),
            compiled: AtomicUsize::new(0),
        }
    }

    fn state<R>(&self, program: Program, f: impl FnOnce(&mut State) -> R) -> Option<R> {
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        programs.get_mut(&(program as usize)).map(f)
    }

    /// `nvrtcCreateProgram`.
    ///
    /// # Safety
    /// NVRTC's contract: valid pointers, `count` headers and include names.
    pub(crate) unsafe fn create(
        &self,
        program: *mut Program,
        source: *const c_char,
        name: *const c_char,
        count: c_int,
        headers: *const *const c_char,
        include_names: *const *const c_char,
    ) -> c_int {
        let status = (self.real.create)(program, source, name, count, headers, include_names);
        if status == SUCCESS && self.dir.is_some() && !source.is_null() {
            let mut key = Vec::new();
            let mut add = |p: *const c_char| {
                if !p.is_null() {
                    key.extend_from_slice(CStr::from_ptr(p).to_bytes());
                }
                key.push(0);
            };
            add(source);
            for i in 0..count.max(0) as usize {
                add(if headers.is_null() {
                    std::ptr::null()
                } else {
                    *headers.add(i)
                });
                add(if include_names.is_null() {
                    std::ptr::null()
                } else {
                    *include_names.add(i)
                });
            }
            let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
            programs.insert(
                *program as usize,
                State {
                    key,
                    ..State::default()
                },
            );
        }
        status
    }

    /// `nvrtcAddNameExpression`.
    ///
    /// # Safety
    /// NVRTC's contract.
    pub(crate) unsafe fn add_name(&self, program: Program, name: *const c_char) -> c_int {
        if !name.is_null() {
            let name = CStr::from_ptr(name).to_owned();
            self.state(program, |s| s.names.push(name));
        }
        (self.real.add_name)(program, name)
    }

    /// `nvrtcCompileProgram`: from disk when the same inputs were compiled
    /// before, else by the real NVRTC, and stored.
    ///
    /// # Safety
    /// NVRTC's contract: `count` valid option strings.
    pub(crate) unsafe fn compile(
        &self,
        program: Program,
        count: c_int,
        options: *const *const c_char,
    ) -> c_int {
        let file = self.dir.as_ref().and_then(|dir| {
            let (major, minor) = self.real.version();
            self.state(program, |s| {
                let mut hash = Sha256::new();
                hash.update(format!("nvrtc {major}.{minor}\0"));
                hash.update(&s.key);
                for name in &s.names {
                    hash.update(name.as_bytes_with_nul());
                }
                for i in 0..count.max(0) as usize {
                    hash.update(CStr::from_ptr(*options.add(i)).to_bytes_with_nul());
                }
                let digest: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
                dir.join(format!("{digest}.nvrtc"))
            })
        });
        let Some(file) = file else {
            return (self.real.compile)(program, count, options);
        };
        if let Some(entry) = read(&file) {
            let names = self.state(program, |s| s.names.clone()).unwrap_or_default();
            // The entry must answer every name MLX will ask for.
            if names
                .iter()
                .all(|n| entry.lowered.iter().any(|(m, _)| m == n))
            {
                self.state(program, |s| s.served = Some(entry));
                return SUCCESS;
            }
        }
        let status = (self.real.compile)(program, count, options);
        self.compiled.fetch_add(1, Ordering::Relaxed);
        if status == SUCCESS {
            if let Some(entry) = self.take_entry(program) {
                write(&file, &entry);
            }
        }
        status
    }

    /// The real program's outputs after a successful compile.
    unsafe fn take_entry(&self, program: Program) -> Option<Entry> {
        let names = self.state(program, |s| s.names.clone())?;
        let mut lowered = Vec::with_capacity(names.len());
        for name in names {
            let mut out: *const c_char = std::ptr::null();
            if (self.real.lowered)(program, name.as_ptr(), &mut out) != SUCCESS || out.is_null() {
                return None;
            }
            lowered.push((name, CStr::from_ptr(out).to_owned()));
        }
        let fetch = |size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
                     get: unsafe extern "C" fn(Program, *mut c_char) -> c_int|
         -> Option<Vec<u8>> {
            let mut n = 0usize;
            if size(program, &mut n) != SUCCESS || n == 0 {
                return None;
            }
            let mut code = vec![0u8; n];
            (get(program, code.as_mut_ptr() as *mut c_char) == SUCCESS).then_some(code)
        };
        let (cubin, code) = match fetch(self.real.cubin_size, self.real.cubin) {
            Some(code) => (true, code),
            None => (false, fetch(self.real.ptx_size, self.real.ptx)?),
        };
        Some(Entry {
            cubin,
            code,
            lowered,
        })
    }

    /// `nvrtcGetLoweredName`.
    ///
    /// # Safety
    /// NVRTC's contract; the name stays valid until the program is destroyed.
    pub(crate) unsafe fn lowered(
        &self,
        program: Program,
        name: *const c_char,
        out: *mut *const c_char,
    ) -> c_int {
        if !name.is_null() && !out.is_null() {
            let wanted = CStr::from_ptr(name);
            let found = self.state(program, |s| {
                s.served.as_ref().map(|e| {
                    e.lowered
                        .iter()
                        .find(|(n, _)| n.as_c_str() == wanted)
                        .map(|(_, l)| l.as_ptr())
                })
            });
            match found {
                Some(Some(Some(pointer))) => {
                    *out = pointer;
                    return SUCCESS;
                }
                Some(Some(None)) => return INVALID_INPUT,
                _ => {}
            }
        }
        (self.real.lowered)(program, name, out)
    }

    /// `nvrtcGetCUBINSize` (`cubin`) or `nvrtcGetPTXSize`.
    ///
    /// # Safety
    /// NVRTC's contract.
    pub(crate) unsafe fn code_size(&self, program: Program, cubin: bool, out: *mut usize) -> c_int {
        match self.served(program, cubin, |code| code.len()) {
            Some(Some(n)) => {
                *out = n;
                SUCCESS
            }
            Some(None) => INVALID_INPUT,
            None if cubin => (self.real.cubin_size)(program, out),
            None => (self.real.ptx_size)(program, out),
        }
    }

    /// `nvrtcGetCUBIN` (`cubin`) or `nvrtcGetPTX`.
    ///
    /// # Safety
    /// NVRTC's contract: `out` holds the size `code_size` gave.
    pub(crate) unsafe fn code(&self, program: Program, cubin: bool, out: *mut c_char) -> c_int {
        let copied = self.served(program, cubin, |code| {
            std::ptr::copy_nonoverlapping(code.as_ptr(), out as *mut u8, code.len())
        });
        match copied {
            Some(Some(())) => SUCCESS,
            Some(None) => INVALID_INPUT,
            None if cubin => (self.real.cubin)(program, out),
            None => (self.real.ptx)(program, out),
        }
    }

    /// `None`: not answered from disk; `Some(None)`: answered, but the entry
    /// holds the other kind of code.
    fn served<R>(
        &self,
        program: Program,
        cubin: bool,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<Option<R>> {
        self.state(program, |s| {
            s.served
                .as_ref()
                .map(|e| (e.cubin == cubin).then(|| f(&e.code)))
        })
        .flatten()
    }

    /// `nvrtcGetProgramLogSize`: an answered program has an empty log.
    ///
    /// # Safety
    /// NVRTC's contract.
    pub(crate) unsafe fn log_size(&self, program: Program, out: *mut usize) -> c_int {
        if self.state(program, |s| s.served.is_some()) == Some(true) {
            *out = 1;
            return SUCCESS;
        }
        (self.real.log_size)(program, out)
    }

    /// `nvrtcGetProgramLog`.
    ///
    /// # Safety
    /// NVRTC's contract.
    pub(crate) unsafe fn log(&self, program: Program, out: *mut c_char) -> c_int {
        if self.state(program, |s| s.served.is_some()) == Some(true) {
            *out = 0;
            return SUCCESS;
        }
        (self.real.log)(program, out)
    }

    /// `nvrtcDestroyProgram`.
    ///
    /// # Safety
    /// NVRTC's contract.
    pub(crate) unsafe fn destroy(&self, program: *mut Program) -> c_int {
        if !program.is_null() {
            let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
            programs.remove(&(*program as usize));
        }
        (self.real.destroy)(program)
    }
}

/// Entry file: "FBNV1", kind byte, name count (u32 LE), then each name and
/// lowered name as u32 LE length + bytes, then the code's length (u64 LE)
/// and bytes.
fn write(file: &Path, entry: &Entry) {
    let mut out = b"FBNV1".to_vec();
    out.push(u8::from(entry.cubin));
    out.extend((entry.lowered.len() as u32).to_le_bytes());
    for (name, lowered) in &entry.lowered {
        for s in [name.as_bytes(), lowered.as_bytes()] {
            out.extend((s.len() as u32).to_le_bytes());
            out.extend_from_slice(s);
        }
    }
    out.extend((entry.code.len() as u64).to_le_bytes());
    out.extend_from_slice(&entry.code);
    super::disk::write_whole(file, &out);
}

fn read(file: &Path) -> Option<Entry> {
    let bytes = std::fs::read(file).ok()?;
    let mut at = bytes.strip_prefix(b"FBNV1")?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (at.get(..n)?, at.get(n..)?);
        at = tail;
        Some(head)
    };
    let cubin = take(1)?[0] == 1;
    let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
    let mut lowered = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let mut pair = [CString::default(), CString::default()];
        for s in &mut pair {
            let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            *s = CString::new(take(n)?).ok()?;
        }
        let [name, low] = pair;
        lowered.push((name, low));
    }
    let n = u64::from_le_bytes(take(8)?.try_into().ok()?) as usize;
    let code = take(n)?.to_vec();
    (at.is_empty()).then_some(Entry {
        cubin,
        code,
        lowered,
    })
}

#[cfg(feature = "cuda")]
pub mod exported;
#[cfg(test)]
mod tests;
