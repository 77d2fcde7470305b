//! macOS: build mlx-c and MLX (Metal + Accelerate) with mlx-c's own CMake
//! project, as upstream mlx-sys does, and link the static libraries.
//!
//! MLX compiles its Metal kernels into `mlx.metallib` and bakes that file's
//! path into the library. The file is written outside `target/` (default
//! `~/.mlx/lib/<key>/`, or `MLX_RS_METAL_PATH`, the variable upstream reads),
//! so a `cargo clean` or an installed binary does not lose it. MLX looks
//! beside the executable first: where an app bundle would carry a copy.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Names the metallib folder: one per MLX / mlx-c pair and kernel build.
const METALLIB_KEY: &str = "flashbar-mlx-0.32.2-mlx-c-0.7.0";

pub fn build_and_link(mlx_c: &Path) {
    let feature = |name: &str| env::var_os(format!("CARGO_FEATURE_{name}")).is_some();
    let metal = feature("METAL");
    let metal_jit = feature("METAL_JIT");
    let accelerate = feature("ACCELERATE");
    let on_off = |on: bool| if on { "ON" } else { "OFF" };
    let mut config = cmake::Config::new(mlx_c);
    config
        .define("MLX_BUILD_METAL", on_off(metal))
        .define("MLX_METAL_JIT", on_off(metal_jit))
        .define("MLX_BUILD_ACCELERATE", on_off(accelerate))
        .define("MLX_C_BUILD_EXAMPLES", "OFF");
    let metallib_dir = metal.then(|| metallib_dir(metal_jit));
    if let Some(dir) = &metallib_dir {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        config.define("MLX_METAL_PATH", dir);
    }
    let dst = config.build();
    let build = dst.join("build");
    println!("cargo:rustc-link-search=native={}/lib", build.display());
    println!("cargo:rustc-link-search=native={}", build.display());
    println!(
        "cargo:rustc-link-search=native={}/_deps/mlx-build",
        build.display()
    );
    println!(
        "cargo:rustc-link-search=native={}/_deps/mlx-build/mlx/io",
        build.display()
    );
    for library in ["mlxc", "mlx", "gguflib"] {
        println!("cargo:rustc-link-lib=static={library}");
    }
    // MLX builds its distributed backend jaccl only with macOS SDK 26.2 and
    // later; mlx_distributed_* needs it when it is there.
    if let Some(jaccl) = find_file(&build, "libjaccl.a") {
        let dir = jaccl.parent().expect("a file has a folder");
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static=jaccl");
    }
    println!("cargo:rustc-link-lib=c++");
    println!("cargo:rustc-link-lib=dylib=objc");
    println!("cargo:rustc-link-lib=framework=Foundation");
    if metal {
        println!("cargo:rustc-link-lib=framework=Metal");
    }
    if accelerate {
        println!("cargo:rustc-link-lib=framework=Accelerate");
    }
    // MLX checks the OS version with `__builtin_available`, which calls
    // ___isPlatformVersionAtLeast: in clang's runtime, not in the std of
    // every Rust this workspace allows (rust-version 1.85).
    if let Some(dir) = clang_runtime_dir() {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static=clang_rt.osx");
    }
    if let Some(dir) = metallib_dir {
        let metallib = dir.join("mlx.metallib");
        if !metallib.is_file() {
            println!(
                "cargo:warning=MLX built no {}; Metal will fail at run time",
                metallib.display()
            );
        }
    }
}

fn metallib_dir(jit: bool) -> PathBuf {
    println!("cargo:rerun-if-env-changed=MLX_RS_METAL_PATH");
    if let Some(dir) = env::var_os("MLX_RS_METAL_PATH") {
        return PathBuf::from(dir);
    }
    let home = env::var_os("HOME").expect("HOME is set (or set MLX_RS_METAL_PATH)");
    // A JIT build's metallib holds only a few kernels: never share it.
    let key = if jit {
        format!("{METALLIB_KEY}-jit")
    } else {
        METALLIB_KEY.to_owned()
    };
    Path::new(&home).join(".mlx/lib").join(key)
}

/// `lib/darwin` in the resource folder of the clang that `xcrun` finds.
fn clang_runtime_dir() -> Option<PathBuf> {
    let output = Command::new("xcrun")
        .args(["clang", "-print-resource-dir"])
        .output()
        .ok()?;
    let resource = String::from_utf8(output.stdout).ok()?;
    let dir = Path::new(resource.trim()).join("lib/darwin");
    (output.status.success() && dir.join("libclang_rt.osx.a").is_file()).then_some(dir)
}

/// The first file called `name` below `dir`.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let path = entry.path();
        let file_type = entry.file_type().ok()?;
        if file_type.is_file() && entry.file_name() == name {
            return Some(path);
        }
        if file_type.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        }
    }
    None
}
