//! `--model` / `--drafter` may name a catalogue entry (or its hub repo id)
//! instead of a folder: these map such a name to its folder in the local
//! store, or say how to get it.

use anyhow::bail;
use flashbar_hub::catalogue::{Found, RepoSpec};
use flashbar_hub::{Catalogue, Store};
use std::path::{Path, PathBuf};

/// The folder for a `--model` value: itself when it is a folder or not a
/// catalogue name, else the downloaded target.
pub fn target_dir(given: &Path) -> anyhow::Result<PathBuf> {
    let Some(name) = catalogue_name(given) else {
        return Ok(given.to_owned());
    };
    match Catalogue::builtin().find(name) {
        Some(Found::Target(pair)) => spec_dir(&pair.target, name),
        Some(Found::Drafter(..)) => bail!("{name} is a drafter; give it with --drafter"),
        None => Ok(given.to_owned()),
    }
}

/// The folder for a `--drafter` value, likewise.
pub fn drafter_dir(given: &Path) -> anyhow::Result<PathBuf> {
    let Some(name) = catalogue_name(given) else {
        return Ok(given.to_owned());
    };
    match Catalogue::builtin().find(name) {
        Some(Found::Drafter(_, drafter)) => spec_dir(drafter, name),
        // A pair's id as --drafter means its default drafter.
        Some(Found::Target(pair)) => match pair.drafters.first() {
            Some(drafter) => spec_dir(drafter, name),
            None => bail!("{name} has no drafter in the catalogue"),
        },
        None => Ok(given.to_owned()),
    }
}

/// With `--model <catalogue id>` and no `--drafter`: the pair's default
/// drafter, when it has been downloaded.
pub fn default_drafter(model: &Path) -> Option<PathBuf> {
    let name = catalogue_name(model)?;
    match Catalogue::builtin().find(name)? {
        Found::Target(pair) => spec_dir(pair.drafters.first()?, name).ok(),
        Found::Drafter(..) => None,
    }
}

/// A value that could be a catalogue name: not an existing path.
fn catalogue_name(given: &Path) -> Option<&str> {
    if given.exists() {
        return None;
    }
    given.to_str()
}

fn spec_dir(spec: &RepoSpec, name: &str) -> anyhow::Result<PathBuf> {
    let default_target = crate::models::resolve_model(None)?;
    let embedded_root = default_target.parent().unwrap_or(Path::new("."));
    match spec.installed_dir(&Store::from_env(), embedded_root) {
        Some(dir) => Ok(dir),
        None => bail!(
            "{name} ({}) is not downloaded yet: run `flashbar pull {}`",
            spec.repo.as_deref().unwrap_or("embedded"),
            spec.id
        ),
    }
}
