//! Which target + drafter to load: the one chosen in the settings, else the
//! default pair shipped with Flashbar (`models/default/{target,drafter}`),
//! so the app works offline on first launch.

use std::path::{Path, PathBuf};

/// Overrides where the default pair's target is looked for (as the CLI).
pub const DEFAULT_MODEL_ENV: &str = "FLASHBAR_DEFAULT_MODEL";

/// A target folder and, optionally, its drafter folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    pub target: PathBuf,
    pub drafter: Option<PathBuf>,
}

/// The default pair: `$FLASHBAR_DEFAULT_MODEL` or this source tree's
/// `models/default/target`, with the `drafter/` beside it when present.
pub fn default_pair() -> Pair {
    let target = std::env::var_os(DEFAULT_MODEL_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default/target"));
    let drafter = target
        .parent()
        .map(|root| root.join("drafter"))
        .filter(|dir| dir.join("config.json").is_file());
    Pair { target, drafter }
}

/// The chosen pair (empty strings mean "not chosen"), else the default.
pub fn resolve(target: &str, drafter: &str) -> Result<Pair, String> {
    if target.trim().is_empty() {
        return Ok(default_pair());
    }
    let target = PathBuf::from(target);
    if !target.is_dir() {
        return Err(format!(
            "model not found: {} is not a folder",
            target.display()
        ));
    }
    let drafter = match drafter.trim() {
        "" => None,
        dir => {
            let dir = PathBuf::from(dir);
            if !dir.is_dir() {
                return Err(format!(
                    "drafter not found: {} is not a folder",
                    dir.display()
                ));
            }
            Some(dir)
        }
    };
    Ok(Pair { target, drafter })
}

/// A short name for the model (its folder's name; for a snapshot in the
/// HF cache, `models--owner--name/snapshots/<commit>`, the repo's
/// `owner/name`), used as the server's model id.
pub fn model_id(target: &Path) -> String {
    let dir = std::fs::canonicalize(target).unwrap_or_else(|_| target.to_owned());
    fn name(p: Option<&Path>) -> Option<std::borrow::Cow<'_, str>> {
        p.and_then(Path::file_name).map(|n| n.to_string_lossy())
    }
    if name(dir.parent()).as_deref() == Some("snapshots") {
        if let Some(repo) = name(dir.parent().and_then(Path::parent)) {
            if let Some(repo) = repo.strip_prefix("models--") {
                return repo.replacen("--", "/", 1);
            }
        }
    }
    name(Some(&dir))
        .map(|n| n.into_owned())
        .unwrap_or_else(|| "default".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pair_is_the_embedded_one_with_its_drafter() {
        let pair = resolve("", "").unwrap();
        assert!(pair.target.join("config.json").is_file(), "{pair:?}");
        assert!(pair.drafter.is_some());
    }

    #[test]
    fn a_hub_snapshot_is_named_after_its_repo() {
        let snapshot = Path::new("/nowhere/hub/models--me--tiny-model/snapshots/0123abc");
        assert_eq!(model_id(snapshot), "me/tiny-model");
        assert_eq!(model_id(Path::new("/nowhere/my-model")), "my-model");
    }

    #[test]
    fn a_missing_folder_is_a_one_line_error() {
        let error = resolve("/no/such/model", "").unwrap_err();
        assert_eq!(error, "model not found: /no/such/model is not a folder");
        let target = default_pair().target;
        let error = resolve(target.to_str().unwrap(), "/no/drafter").unwrap_err();
        assert!(error.starts_with("drafter not found"), "{error}");
    }
}
