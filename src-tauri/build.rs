//! Tauri's build step, with an app manifest of the commands the invoke
//! handler registers: Tauri then checks every app command against the
//! capabilities, so a command nobody granted is refused to the webview.

#[path = "commands.rs"]
mod commands;

fn main() {
    println!("cargo:rerun-if-changed=src/lib.rs");
    let lib_rs = std::fs::read_to_string("src/lib.rs").expect("read src/lib.rs");
    let names = commands::registered(&lib_rs).unwrap_or_else(|e| panic!("{e}"));
    // AppManifest keeps &'static names; the build script ends right after.
    let names: &'static [&'static str] =
        Vec::leak(names.into_iter().map(|name| &*String::leak(name)).collect());
    let manifest = tauri_build::AppManifest::new().commands(names);
    // The .deb installs this binary in /usr/bin and MLX's libraries in
    // /usr/lib/Flashbar/mlx/lib (bundle resources go to /usr/lib/<product>):
    // a second rpath beside the workspace's `$ORIGIN/mlx/lib`
    // (.cargo/config.toml), for this binary only. docs/bundle.md.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!(
            "cargo:rustc-link-arg-bin=flashbar-app=-Wl,-rpath,$ORIGIN/../lib/Flashbar/mlx/lib"
        );
    }
    tauri_build::try_build(tauri_build::Attributes::new().app_manifest(manifest))
        .expect("tauri build step");
}
