//! On macOS every binary must build MLX with Metal and Accelerate, also when
//! built alone (`cargo run -p flashbar-app`, `npm run app`, `npm run smoke`),
//! not only in a `--workspace` build, where mlx-sys, a workspace member,
//! brings its default features along. Asks cargo's resolver, so it runs on
//! any machine: no macOS toolchain or target is needed.

use std::path::Path;
use std::process::Command;

const TARGET: &str = "aarch64-apple-darwin";

/// The features mlx-sys is built with for `package` alone on `target`.
fn mlx_sys_features(package: &str, target: &str) -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        // --locked: the lockfile as committed (cargo may still fetch the
        // manifests of macOS-only crates that no Linux build downloaded).
        .args(["tree", "--locked", "--manifest-path"])
        .arg(&manifest)
        .args(["-e", "normal", "-p", package, "--target", target])
        .args(["-i", "mlx-sys", "--depth", "0", "--format", "{p}|{f}"])
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find(|line| line.starts_with("mlx-sys v"))
        .unwrap_or_else(|| panic!("no mlx-sys in the tree of {package}:\n{stdout}"));
    let (_, features) = line.split_once('|').expect("the format has a `|`");
    features
        .split(',')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_app_and_the_cli_build_mlx_with_metal_and_accelerate_on_macos() {
    for package in ["flashbar-app", "flashbar-cli"] {
        let features = mlx_sys_features(package, TARGET);
        for wanted in ["metal", "accelerate"] {
            assert!(
                features.iter().any(|f| f == wanted),
                "{package} built alone for {TARGET} resolves mlx-sys without `{wanted}` \
                 (features: {features:?})"
            );
        }
    }
}

#[test]
fn linux_builds_take_neither_feature() {
    // The same query on Linux: the macOS-only features stay off there, which
    // also shows that the query reads the target's own resolution.
    let features = mlx_sys_features("flashbar-cli", "x86_64-unknown-linux-gnu");
    assert!(
        !features.iter().any(|f| f == "metal" || f == "accelerate"),
        "{features:?}"
    );
}
