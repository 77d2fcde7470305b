//! The cache against the NVIDIA wheel's real NVRTC (no GPU needed).
use super::*;
use crate::custom_kernel::nvrtc::wheel;

const GOOD: &str = "namespace n { __global__ void k(float* y) { y[0] = 1.0f; } }\n";

/// What MLX does with a program: create, name, compile, read the lowered
/// name, the code and the log, destroy. Returns the status, the lowered
/// name, the cubin and the log.
fn as_mlx_does(cache: &Cache, source: &str, options: &[&str]) -> (c_int, String, Vec<u8>, String) {
    let source = CString::new(source).unwrap();
    let name = CString::new("n::k").unwrap();
    let options: Vec<CString> = options.iter().map(|o| CString::new(*o).unwrap()).collect();
    let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let mut program: Program = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the calls; buffers are sized by
    // the size calls.
    unsafe {
        let file = CString::new("k.cu").unwrap();
        let status = cache.create(
            &mut program,
            source.as_ptr(),
            file.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        assert_eq!(status, SUCCESS);
        assert_eq!(cache.add_name(program, name.as_ptr()), SUCCESS);
        let status = cache.compile(program, pointers.len() as c_int, pointers.as_ptr());
        let mut size = 0usize;
        assert_eq!(cache.log_size(program, &mut size), SUCCESS);
        let mut log = vec![0u8; size.max(1)];
        assert_eq!(cache.log(program, log.as_mut_ptr() as *mut c_char), SUCCESS);
        let log = CStr::from_bytes_until_nul(&log)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let (mut lowered, mut cubin) = (String::new(), Vec::new());
        if status == SUCCESS {
            let mut out: *const c_char = std::ptr::null();
            assert_eq!(cache.lowered(program, name.as_ptr(), &mut out), SUCCESS);
            lowered = CStr::from_ptr(out).to_string_lossy().into_owned();
            assert_eq!(cache.code_size(program, true, &mut size), SUCCESS);
            cubin = vec![0u8; size];
            assert_eq!(
                cache.code(program, true, cubin.as_mut_ptr() as *mut c_char),
                SUCCESS
            );
        }
        assert_eq!(cache.destroy(&mut program), SUCCESS);
        (status, lowered, cubin, log)
    }
}

/// The second compile of the same program is answered from disk with
/// what the first produced; other options, or no cache folder, compile.
#[test]
fn a_program_seen_before_is_answered_from_disk() {
    // SAFETY: a live handle.
    let real = Nvrtc::from_handle(wheel().0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(real, Some(dir.path().to_owned()));
    let sm90 = ["--gpu-architecture=sm_90"];
    let first = as_mlx_does(&cache, GOOD, &sm90);
    assert_eq!(first.0, SUCCESS, "{}", first.3);
    assert_eq!(first.1, "_ZN1n1kEPf");
    assert!(first.2.starts_with(b"\x7fELF"));
    assert_eq!(cache.compiled.load(Ordering::Relaxed), 1);
    let again = as_mlx_does(&cache, GOOD, &sm90);
    assert_eq!(
        cache.compiled.load(Ordering::Relaxed),
        1,
        "answered from disk"
    );
    assert_eq!(
        (again.0, &again.1, &again.2, again.3.as_str()),
        (SUCCESS, &first.1, &first.2, "")
    );
    // Another process (a fresh cache on the same folder) reads it too.
    let next = Cache::new(real, Some(dir.path().to_owned()));
    assert_eq!(as_mlx_does(&next, GOOD, &sm90).2, first.2);
    assert_eq!(next.compiled.load(Ordering::Relaxed), 0);
    // Other options are another entry.
    as_mlx_does(&cache, GOOD, &["--gpu-architecture=sm_90", "-lineinfo"]);
    assert_eq!(cache.compiled.load(Ordering::Relaxed), 2);
    // Without a folder, everything goes straight through.
    let through = Cache::new(real, None);
    assert_eq!(as_mlx_does(&through, GOOD, &sm90).2, first.2);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// A failed compile keeps NVRTC's log and leaves nothing on disk; a
/// damaged entry is compiled again.
#[test]
fn failures_are_not_cached_and_damage_is_recompiled() {
    // SAFETY: a live handle.
    let real = Nvrtc::from_handle(wheel().0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(real, Some(dir.path().to_owned()));
    let sm90 = ["--gpu-architecture=sm_90"];
    let bad = as_mlx_does(
        &cache,
        "namespace n { __global__ void k(float* y) { y[0] = z; } }\n",
        &sm90,
    );
    assert_ne!(bad.0, SUCCESS);
    assert!(bad.3.contains("identifier \"z\" is undefined"), "{}", bad.3);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let good = as_mlx_does(&cache, GOOD, &sm90);
    let entry = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, &bytes[..bytes.len() - 3]).unwrap();
    assert_eq!(as_mlx_does(&cache, GOOD, &sm90).2, good.2);
    assert_eq!(
        cache.compiled.load(Ordering::Relaxed),
        3,
        "the bad, the first, the damaged"
    );
    assert_eq!(
        std::fs::read(&entry).unwrap(),
        bytes,
        "and written whole again"
    );
}
