//! macOS: build mlx-c and MLX (Metal + Accelerate) with mlx-c's own CMake
//! project, as upstream mlx-sys does, and link the static libraries.

use std::path::Path;

pub fn build_and_link(mlx_c: &Path) {
    let metal = std::env::var_os("CARGO_FEATURE_METAL").is_some();
    let accelerate = std::env::var_os("CARGO_FEATURE_ACCELERATE").is_some();
    let on_off = |on: bool| if on { "ON" } else { "OFF" };
    let dst = cmake::Config::new(mlx_c)
        .define("MLX_BUILD_METAL", on_off(metal))
        .define("MLX_BUILD_ACCELERATE", on_off(accelerate))
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .build();
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
    println!("cargo:rustc-link-lib=c++");
    println!("cargo:rustc-link-lib=dylib=objc");
    println!("cargo:rustc-link-lib=framework=Foundation");
    if metal {
        println!("cargo:rustc-link-lib=framework=Metal");
    }
    if accelerate {
        println!("cargo:rustc-link-lib=framework=Accelerate");
    }
}
