//! Linux: compile mlx-c with `cc` against a pinned MLX wheel's libmlx.
//!
//! The wheel is unpacked under `target/<profile>/mlx-wheels/`, and its `mlx/`
//! and bundled-library folders are linked beside the binaries, where the
//! workspace's rpath (`.cargo/config.toml`: `$ORIGIN/mlx/lib`, and one folder
//! up for tests) finds them, so nothing needs LD_LIBRARY_PATH.

use crate::blas;
use crate::wheel::{self, Wheel};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Links the CPU wheel, or the CUDA one with the `cuda` feature.
pub fn build_and_link(mlx_c: &Path, out_dir: &Path, mlx_version: &str) {
    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    let profile_dir = profile_dir(out_dir);
    let store = profile_dir.join("mlx-wheels");
    // Only the CPU wheel ships headers; both wheels are the same MLX version.
    let cpu_root = wheel::unpacked(&wheel::CPU, &store);
    let (lib_wheel, lib_root) = if cuda {
        (&wheel::CUDA13, wheel::unpacked(&wheel::CUDA13, &store))
    } else {
        (&wheel::CPU, cpu_root.clone())
    };
    place_beside_binaries(lib_wheel, &lib_root, &profile_dir, cuda);
    compile_mlx_c(mlx_c, &cpu_root.join("mlx/include"));

    // The CPU build links (and `cargo test` / `cargo run` put on
    // LD_LIBRARY_PATH) the folder of links beside the binaries, not the
    // wheel's own: a libmlx loaded from the wheel finds the wheel's
    // reference BLAS, so tests would run another BLAS than the binaries.
    let lib_dir = if cuda {
        lib_root.join("mlx/lib")
    } else {
        profile_dir.join("mlx/lib")
    };
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    // Metadata for dependents (DEP_MLX_LIB_DIR, DEP_MLX_INCLUDE, DEP_MLX_VERSION).
    println!("cargo:lib_dir={}", lib_dir.display());
    println!("cargo:include={}", cpu_root.join("mlx/include").display());
    println!("cargo:version={mlx_version}");
    warn_without_rpath();
}

/// Compiler flags bindgen needs to read mlx-c's headers on this target.
pub fn bindgen_clang_args() -> Vec<String> {
    if needs_half_shim() {
        vec![
            "-include".to_owned(),
            shim_dir().join("half.h").display().to_string(),
        ]
    } else {
        Vec::new()
    }
}

fn compile_mlx_c(mlx_c: &Path, mlx_include: &Path) {
    let mut sources: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .expect("mlx-c source dir")
        .map(|entry| entry.expect("readable dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cpp"))
        .collect();
    sources.sort();
    // With the `cuda` feature, the one call mlx-c does not bind (the shim's
    // comment says why).
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        sources.push(shim_dir().join("precompiled_kernel.cpp"));
    }
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .warnings(false)
        .flag_if_supported("-w")
        .include(mlx_c)
        .include(mlx_include)
        .files(&sources);
    force_include(&mut build, "format_polyfill.h");
    if needs_half_shim() {
        force_include(&mut build, "half.h");
    }
    build.compile("mlxc");
    println!("cargo:rerun-if-changed={}", shim_dir().display());
}

fn force_include(build: &mut cc::Build, shim: &str) {
    let path = shim_dir().join(shim);
    build
        .flag("-include")
        .flag(path.to_str().expect("a UTF-8 path"));
}

/// mlx-c's half.h declares float16/bfloat16 accessors only on aarch64; MLX
/// has both types on every target, so elsewhere our shim declares them.
fn needs_half_shim() -> bool {
    env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("aarch64")
}

fn shim_dir() -> PathBuf {
    PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("shim")
}

/// `OUT_DIR` is `<profile>/build/mlx-sys-<hash>/out`; binaries live in `<profile>`.
fn profile_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .nth(3)
        .expect("OUT_DIR sits three folders below the profile folder")
        .to_path_buf()
}

/// Links `mlx/` and the wheel's library folder into the profile folder, and for
/// CUDA the `nvidia` wheels folder that libmlx's RPATH names (`../../nvidia`).
fn place_beside_binaries(wheel: &Wheel, root: &Path, profile_dir: &Path, cuda: bool) {
    if cuda {
        symlink_fresh(&root.join("mlx"), &profile_dir.join("mlx"));
        symlink_fresh(
            &root.join(wheel.libs_dir),
            &profile_dir.join(wheel.libs_dir),
        );
    } else {
        // Real folders of links: libmlx's RPATH (`$ORIGIN/../../<libs>`)
        // resolves `..` physically, so a linked `mlx/` would lead back into
        // the unpacked wheel and its reference BLAS.
        let openblas = blas::openblas();
        link_each(&root.join("mlx"), &profile_dir.join("mlx"), &|_| None);
        link_each(&root.join("mlx/lib"), &profile_dir.join("mlx/lib"), &|_| {
            None
        });
        link_each(
            &root.join(wheel.libs_dir),
            &profile_dir.join(wheel.libs_dir),
            &|file| openblas.clone().filter(|_| blas::is_wheel_blas(file)),
        );
    }
    if cuda {
        match nvidia_wheels_dir() {
            Some(dir) => {
                symlink_fresh(&dir, &root.join("nvidia"));
                symlink_fresh(&dir, &profile_dir.join("nvidia"));
            }
            None => println!(
                "cargo:warning=no Python `nvidia` package found; before running, link the \
                 folder of the nvidia-* CUDA 13 wheels at {}",
                profile_dir.join("nvidia").display()
            ),
        }
    }
}

fn nvidia_wheels_dir() -> Option<PathBuf> {
    let output = Command::new("python3")
        .args(["-c", "import nvidia; print(nvidia.__path__[0])"])
        .output()
        .ok()?;
    let path = String::from_utf8(output.stdout).ok()?;
    let path = PathBuf::from(path.trim());
    (output.status.success() && path.is_dir()).then_some(path)
}

/// Makes `dir` a real folder holding a link to each entry of `source`
/// (`replace` may name another target for an entry).
fn link_each(source: &Path, dir: &Path, replace: &dyn Fn(&str) -> Option<PathBuf>) {
    if fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
        let _ = fs::remove_file(dir);
    }
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let entries = fs::read_dir(source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    for entry in entries {
        let name = entry.expect("readable dir entry").file_name();
        let file = name.to_string_lossy();
        let target = replace(&file).unwrap_or_else(|| source.join(&name));
        let link = dir.join(&name);
        if fs::symlink_metadata(&link).is_ok_and(|m| m.is_dir()) {
            continue; // `mlx/lib`, made by its own call
        }
        symlink_fresh(&target, &link);
    }
}

fn symlink_fresh(target: &Path, link: &Path) {
    if fs::read_link(link).is_ok_and(|current| current == target) {
        return;
    }
    let _ = fs::remove_file(link);
    let _ = fs::remove_dir_all(link);
    std::os::unix::fs::symlink(target, link).unwrap_or_else(|e| {
        panic!(
            "cannot link {} -> {}: {e}",
            link.display(),
            target.display()
        )
    });
}

fn warn_without_rpath() {
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if !flags.contains("rpath") {
        println!(
            "cargo:warning=RUSTFLAGS replaced the workspace's rpath (.cargo/config.toml); \
             binaries will not find libmlx.so unless you add -Wl,-rpath,$ORIGIN/mlx/lib"
        );
    }
}
