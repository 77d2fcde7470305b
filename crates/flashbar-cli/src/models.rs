//! Where models are: `--model` / `--drafter` folders or catalogue ids, or
//! the embedded default pair (`models/default/{target,drafter}`).

use anyhow::bail;
use std::path::{Path, PathBuf};

/// Overrides where the embedded default model is looked for.
pub const DEFAULT_MODEL_ENV: &str = "FLASHBAR_DEFAULT_MODEL";

/// The target folder to load: `--model`, else the embedded default
/// (`models/default/target` of this source tree).
pub fn resolve_model(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match model {
        Some(path) => crate::catalogue_ids::target_dir(path)?,
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

/// The target and drafter to load: as given; with no `--model`, the default
/// target and (unless `--drafter` is given) the drafter beside it, if any.
pub fn resolve_pair(
    model: Option<&Path>,
    drafter: Option<&Path>,
) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let target = resolve_model(model)?;
    let drafter = match (drafter, model) {
        (Some(dir), _) => {
            let dir = &crate::catalogue_ids::drafter_dir(dir)?;
            if !dir.is_dir() {
                bail!("drafter not found: {} is not a folder", dir.display());
            }
            Some(dir.to_owned())
        }
        (None, None) => target
            .parent()
            .map(|root| root.join("drafter"))
            .filter(|dir| dir.join("config.json").is_file()),
        (None, Some(model)) => crate::catalogue_ids::default_drafter(model),
    };
    Ok((target, drafter))
}
