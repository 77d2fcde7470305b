//! Which target + drafter to load: the one chosen in the settings, else the
//! default pair shipped with Flashbar (`models/default/{target,drafter}`),
//! so the app works offline on first launch. An installed app carries that
//! pair among its bundle resources (docs/bundle.md) and finds it there.

use flashbar_hub::{Catalogue, Resolver, Store};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Overrides where the default pair's target is looked for (as the CLI).
pub const DEFAULT_MODEL_ENV: &str = "FLASHBAR_DEFAULT_MODEL";

pub use flashbar_hub::resolve::model_id;
pub use flashbar_hub::Pair;

/// Where a bundle carries the default pair's target, below the app's
/// resource folder (`bundle.resources` in tauri.conf.json).
pub const BUNDLED_TARGET: &str = "models/default/target";

/// The app's resource folder, set once at start-up.
static RESOURCE_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Records Tauri's resource folder (`/usr/lib/Flashbar` for the installed
/// .deb, `Flashbar.app/Contents/Resources` on macOS, the cargo output folder
/// for a build run in place), where [`default_pair`] looks first.
pub fn set_resource_dir(dir: PathBuf) {
    let _ = RESOURCE_DIR.set(dir);
}

/// The default pair: `$FLASHBAR_DEFAULT_MODEL`, else the bundled one, else
/// this source tree's `models/default/target`, with the `drafter/` beside
/// it when present. The path is made absolute and free of `..` where the
/// folder exists, so the Models view shows where it really is.
pub fn default_pair() -> Pair {
    let target = default_target(
        std::env::var_os(DEFAULT_MODEL_ENV).map(PathBuf::from),
        RESOURCE_DIR.get().map(PathBuf::as_path),
    );
    let target = std::fs::canonicalize(&target).unwrap_or(target);
    let drafter = target
        .parent()
        .map(|root| root.join("drafter"))
        .filter(|dir| dir.join("config.json").is_file());
    Pair { target, drafter }
}

/// The default target: `overridden`, else the bundle's copy below
/// `resources` when it holds one, else the source tree's.
fn default_target(overridden: Option<PathBuf>, resources: Option<&Path>) -> PathBuf {
    overridden
        .or_else(|| {
            resources
                .map(|dir| dir.join(BUNDLED_TARGET))
                .filter(|target| target.join("config.json").is_file())
        })
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default/target"))
}

/// The chosen pair through the hub's resolver (empty strings mean "not
/// chosen": the default pair; a catalogue id works as in the CLI).
pub fn resolve(target: &str, drafter: &str) -> Result<Pair, String> {
    let embedded = default_pair().target;
    let resolver = Resolver {
        catalogue: &Catalogue::builtin(),
        store: &Store::from_env(),
        embedded_target: &embedded,
    };
    let given = |s: &str| Some(PathBuf::from(s.trim()));
    resolver.pair(given(target).as_deref(), given(drafter).as_deref())
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
    fn a_bundled_pair_comes_before_the_source_tree() {
        let source = default_target(None, None);
        assert!(source.join("config.json").is_file(), "{source:?}");
        // A resource folder holding the pair, as an installed bundle has it.
        let resources = tempfile::tempdir().unwrap();
        let bundled = resources.path().join(BUNDLED_TARGET);
        std::fs::create_dir_all(&bundled).unwrap();
        std::fs::write(bundled.join("config.json"), "{}").unwrap();
        assert_eq!(default_target(None, Some(resources.path())), bundled);
        // One without it (a build run in place) falls back to the source tree.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(default_target(None, Some(empty.path())), source);
        // $FLASHBAR_DEFAULT_MODEL wins over both.
        let chosen = PathBuf::from("/chosen/target");
        assert_eq!(
            default_target(Some(chosen.clone()), Some(resources.path())),
            chosen
        );
    }

    #[test]
    fn the_bundle_carries_the_default_pair_where_it_is_looked_for() {
        let config = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tauri.conf.json"));
        let config: serde_json::Value = serde_json::from_slice(&config.unwrap()).unwrap();
        let resources = &config["bundle"]["resources"];
        let target = resources["../models/default/target/"].as_str();
        assert_eq!(target, Some(format!("{BUNDLED_TARGET}/").as_str()));
        // The drafter beside it, where default_pair looks for one.
        let drafter = Path::new(BUNDLED_TARGET).with_file_name("drafter");
        let drafter = format!("{}/", drafter.display());
        assert_eq!(
            resources["../models/default/drafter/"].as_str(),
            Some(drafter.as_str())
        );
    }

    #[test]
    fn the_default_pair_is_shown_without_dot_dot() {
        let pair = default_pair();
        for dir in std::iter::once(&pair.target).chain(pair.drafter.as_ref()) {
            assert!(dir.is_absolute(), "{}", dir.display());
            assert!(
                !dir.components()
                    .any(|c| c == std::path::Component::ParentDir),
                "{}",
                dir.display()
            );
        }
        assert!(pair.drafter.is_some(), "the source tree's drafter is found");
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
