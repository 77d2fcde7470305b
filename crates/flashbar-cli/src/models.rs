//! Where models are: `--model` / `--drafter` folders or catalogue ids, or
//! the embedded default pair (`models/default/{target,drafter}`), through
//! the hub's one resolver (`flashbar_hub::resolve`).

use anyhow::anyhow;
use flashbar_hub::{Catalogue, Resolver, Store};
use std::path::{Path, PathBuf};

/// Overrides where the embedded default model is looked for.
pub const DEFAULT_MODEL_ENV: &str = "FLASHBAR_DEFAULT_MODEL";

/// The embedded default target: `$FLASHBAR_DEFAULT_MODEL`, else this
/// source tree's `models/default/target`.
fn embedded_target() -> PathBuf {
    std::env::var_os(DEFAULT_MODEL_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target")
        })
}

/// The target folder to load: `--model`, else the embedded default.
pub fn resolve_model(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    Ok(resolve_pair(model, None)?.0)
}

/// The target and drafter to load: as given; with no `--model`, the default
/// target and (unless `--drafter` is given) the drafter beside it; with a
/// catalogue id, its downloaded folders.
pub fn resolve_pair(
    model: Option<&Path>,
    drafter: Option<&Path>,
) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let embedded = embedded_target();
    let resolver = Resolver {
        catalogue: &Catalogue::builtin(),
        store: &Store::from_env(),
        embedded_target: &embedded,
    };
    let pair = resolver.pair(model, drafter).map_err(|e| anyhow!(e))?;
    Ok((pair.target, pair.drafter))
}
