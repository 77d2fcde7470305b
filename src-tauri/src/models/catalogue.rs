//! The catalogue as the Models view lists it: every known pair (the hub
//! crate's built-in `catalogue.json`, plus the pairs of the JSON file named
//! by `FLASHBAR_CATALOGUE`, if set) with sizes, the memory it needs and
//! whether each model is already on this machine.

use flashbar_hub::{Catalogue, CatalogueEntry, RepoSpec, Store};
use serde::Serialize;
use std::path::Path;

/// Names a JSON file (`{"pairs": [...]}`, the built-in file's format) whose
/// pairs are added to the built-in ones: a user's own pairs, or a test's.
pub const EXTRA_CATALOGUE_ENV: &str = "FLASHBAR_CATALOGUE";

/// One pair as the UI shows it.
#[derive(Debug, Serialize, PartialEq, ts_rs::TS)]
pub struct PairInfo {
    pub id: String,
    pub name: String,
    /// Memory the pair needs to run.
    #[ts(type = "number")]
    pub memory_bytes: u64,
    /// Whether that fits this machine's budget (None: unknown here).
    pub fits: Option<bool>,
    pub target: ModelInfo,
    /// The default drafter (the catalogue's first).
    pub drafter: Option<ModelInfo>,
    /// Both models are here: the pair can be chosen.
    pub local: bool,
    /// Shipped with the app (nothing to download or delete).
    pub embedded: bool,
}

#[derive(Debug, Serialize, PartialEq, ts_rs::TS)]
pub struct ModelInfo {
    pub id: String,
    /// `owner/name` on the hub; None for an embedded model.
    pub repo: Option<String>,
    #[ts(type = "number")]
    pub size_bytes: u64,
    /// The size is an estimate (the hub gives the exact one on download).
    pub estimate: bool,
    /// Its folder, when it is on this machine.
    pub path: Option<String>,
}

/// The built-in catalogue plus `$FLASHBAR_CATALOGUE`'s pairs.
pub fn load() -> Result<Catalogue, String> {
    load_with(std::env::var_os(EXTRA_CATALOGUE_ENV).filter(|f| !f.is_empty()))
}

/// The built-in catalogue plus the pairs in `extra`.
fn load_with(extra: Option<std::ffi::OsString>) -> Result<Catalogue, String> {
    let mut catalogue = Catalogue::builtin();
    let Some(file) = extra else {
        return Ok(catalogue);
    };
    let text = std::fs::read_to_string(&file).map_err(|e| {
        format!(
            "cannot read the catalogue {}: {e}",
            Path::new(&file).display()
        )
    })?;
    let extra = Catalogue::parse(&text).map_err(|e| format!("{}: {e}", file.to_string_lossy()))?;
    catalogue.pairs.extend(extra.pairs);
    // Parsed again as a whole: ids must stay unique across both files.
    let merged = serde_json::to_string(&catalogue).map_err(|e| e.to_string())?;
    Catalogue::parse(&merged).map_err(|e| e.to_string())
}

/// A pair by id, or a one-line error.
pub fn find(catalogue: &Catalogue, id: &str) -> Result<CatalogueEntry, String> {
    catalogue
        .pair(id)
        .cloned()
        .ok_or_else(|| format!("no pair {id:?} in the catalogue"))
}

/// What the UI lists, with what is installed in `store`.
pub fn describe(
    catalogue: &Catalogue,
    store: &Store,
    embedded_root: &Path,
    budget: Option<u64>,
) -> Vec<PairInfo> {
    catalogue
        .pairs
        .iter()
        .map(|pair| {
            let model = |spec: &RepoSpec| ModelInfo {
                id: spec.id.clone(),
                repo: spec.repo.clone(),
                size_bytes: spec.size_bytes,
                estimate: spec.source.starts_with("estimate"),
                path: spec
                    .installed_dir(store, embedded_root)
                    .map(|p| p.display().to_string()),
            };
            let target = model(&pair.target);
            let drafter = pair.drafters.first().map(model);
            let local = target.path.is_some() && drafter.as_ref().is_none_or(|d| d.path.is_some());
            PairInfo {
                id: pair.id.clone(),
                name: pair.name.clone(),
                memory_bytes: pair.memory_bytes,
                fits: budget.map(|b| pair.memory_bytes <= b),
                embedded: pair.target.embedded.is_some(),
                target,
                drafter,
                local,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn embedded_root() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default")
    }

    #[test]
    fn the_embedded_pair_is_local_and_hub_pairs_are_not() {
        let store = Store::new("/nonexistent/store");
        let pairs = describe(
            &Catalogue::builtin(),
            &store,
            &embedded_root(),
            Some(2 << 30),
        );
        let default = pairs.iter().find(|p| p.id == "default").unwrap();
        assert!(default.local && default.embedded);
        assert_eq!(default.fits, Some(true));
        let big = pairs.iter().find(|p| p.id == "qwen3.5-9b-4bit").unwrap();
        assert!(!big.local && !big.embedded);
        assert_eq!(big.fits, Some(false), "9 GB does not fit in 2 GiB");
        assert!(big.target.estimate);
        assert_eq!(
            big.target.repo.as_deref(),
            Some("mlx-community/Qwen3.5-9B-4bit")
        );
    }

    #[test]
    fn extra_pairs_are_added_and_ids_stay_unique() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("extra.json");
        let pair = |id: &str| {
            format!(
                r#"{{"pairs":[{{"id":"{id}","name":"n","memory_bytes":1,"drafters":[],
                "target":{{"id":"{id}","repo":"a/b","revision":"main","files":["*"],"size_bytes":1,"source":"s"}}}}]}}"#
            )
        };
        std::fs::write(&file, pair("mine")).unwrap();
        let catalogue = load_with(Some(file.clone().into())).unwrap();
        assert!(catalogue.pair("mine").is_some() && catalogue.pair("default").is_some());
        std::fs::write(&file, pair("default")).unwrap();
        let error = load_with(Some(file.clone().into())).unwrap_err();
        assert!(error.contains("duplicate catalogue id default"), "{error}");
        let missing = load_with(Some(dir.path().join("none.json").into())).unwrap_err();
        assert!(
            missing.starts_with("cannot read the catalogue"),
            "{missing}"
        );
    }

    #[test]
    fn an_unknown_pair_is_a_one_line_error() {
        let error = find(&Catalogue::builtin(), "nope").unwrap_err();
        assert_eq!(error, "no pair \"nope\" in the catalogue");
    }
}
