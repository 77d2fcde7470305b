//! Bindgen over mlx-c's public headers, configured as upstream's bindings are
//! (same Rust target, same blocklist), so `mlx-rs` sees identical items.

use std::path::Path;

pub fn generate(mlx_c: &Path, extra_clang_args: &[String], out: &Path) {
    let header_dir = mlx_c.join("mlx/c");
    let mut headers: Vec<_> = std::fs::read_dir(&header_dir)
        .expect("mlx-c header dir")
        .map(|entry| entry.expect("readable dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "h"))
        .collect();
    headers.sort();

    let mut builder = bindgen::Builder::default()
        .rust_target("1.73.0".parse().expect("a valid rust target"))
        .clang_arg(format!("-I{}", mlx_c.display()))
        .clang_args(extra_clang_args)
        // libc's allocator entry points would clash with std's declarations.
        .blocklist_function("malloc")
        .blocklist_function("realloc")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for header in &headers {
        builder = builder.header(header.to_string_lossy());
    }
    builder
        .generate()
        .expect("bindgen over mlx-c headers")
        .write_to_file(out)
        .expect("write bindings.rs");
}
