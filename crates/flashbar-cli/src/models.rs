//! Where models are: `--model` folders, or the embedded default.

use anyhow::bail;
use std::path::{Path, PathBuf};

/// Overrides where the embedded default model is looked for.
pub const DEFAULT_MODEL_ENV: &str = "FLASHBAR_DEFAULT_MODEL";

/// The target folder to load: `--model`, else the embedded default
/// (`models/default/target` of this source tree).
pub fn resolve_model(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match model {
        Some(path) => path.to_owned(),
        None => std::env::var_os(DEFAULT_MODEL_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target")
            }),
    };
    if !path.is_dir() {
        bail!(
            "model not found: {} is not a folder (give a local model folder with --model)",
            path.display()
        );
    }
    Ok(path)
}
