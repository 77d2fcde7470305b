//! The catalogue of known target/drafter pairs (`catalogue.json` beside this
//! crate, compiled in), and lookups by id or repo.

use crate::error::HubError;
use crate::pull::PullRequest;
use crate::store::Store;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const CATALOGUE_JSON: &str = include_str!("../catalogue.json");

/// A target model and the drafters trained for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CatalogueEntry {
    pub id: String,
    pub name: String,
    pub target: RepoSpec,
    /// The first one is the default.
    pub drafters: Vec<RepoSpec>,
    /// Memory the pair needs to run (weights + working margin).
    pub memory_bytes: u64,
}

/// Where one model's files come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RepoSpec {
    pub id: String,
    /// `owner/name` on the hub; absent for the embedded pair.
    #[serde(default)]
    pub repo: Option<String>,
    /// Folder under `models/default` for the embedded pair.
    #[serde(default)]
    pub embedded: Option<String>,
    pub revision: String,
    /// File names or glob patterns to fetch.
    pub files: Vec<String>,
    pub size_bytes: u64,
    /// Where `size_bytes` comes from ("estimate: ..." when unverified).
    pub source: String,
}

impl RepoSpec {
    /// The model folder, if it is here: the embedded folder under
    /// `embedded_root` (`models/default` of the app), or the downloaded
    /// snapshot in `store`.
    pub fn installed_dir(&self, store: &Store, embedded_root: &Path) -> Option<PathBuf> {
        match (&self.embedded, &self.repo) {
            (Some(folder), _) => Some(embedded_root.join(folder)).filter(|d| d.is_dir()),
            (None, Some(repo)) => store.snapshot_dir(repo, &self.revision),
            (None, None) => None,
        }
    }

    /// What `pull` needs to fetch this model, if it lives on the hub.
    pub fn pull_request(&self) -> Option<PullRequest> {
        self.repo.as_ref().map(|repo| PullRequest {
            repo: repo.clone(),
            revision: self.revision.clone(),
            files: self.files.clone(),
        })
    }
}

/// Every known pair.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Catalogue {
    pub pairs: Vec<CatalogueEntry>,
}

/// What an id names: a pair's target, or one of its drafters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Found<'a> {
    Target(&'a CatalogueEntry),
    Drafter(&'a CatalogueEntry, &'a RepoSpec),
}

impl Catalogue {
    /// The compiled-in catalogue.
    pub fn builtin() -> Catalogue {
        Catalogue::parse(CATALOGUE_JSON).expect("catalogue.json is checked by the tests")
    }

    pub fn parse(json: &str) -> Result<Catalogue, HubError> {
        let catalogue: Catalogue = serde_json::from_str(json)
            .map_err(|e| HubError::Invalid(format!("bad catalogue: {e}")))?;
        catalogue.validate()?;
        Ok(catalogue)
    }

    /// A pair by its id.
    pub fn pair(&self, id: &str) -> Option<&CatalogueEntry> {
        self.pairs.iter().find(|p| p.id == id)
    }

    /// A target or drafter by catalogue id or hub repo id.
    pub fn find(&self, id: &str) -> Option<Found<'_>> {
        let matches = |spec: &RepoSpec| spec.id == id || spec.repo.as_deref() == Some(id);
        for pair in &self.pairs {
            if matches(&pair.target) || pair.id == id {
                return Some(Found::Target(pair));
            }
            if let Some(drafter) = pair.drafters.iter().find(|d| matches(d)) {
                return Some(Found::Drafter(pair, drafter));
            }
        }
        None
    }

    fn validate(&self) -> Result<(), HubError> {
        let mut ids = std::collections::HashSet::new();
        for pair in &self.pairs {
            if !ids.insert(pair.id.as_str()) {
                return Err(HubError::Invalid(format!(
                    "duplicate catalogue id {}",
                    pair.id
                )));
            }
            for spec in std::iter::once(&pair.target).chain(&pair.drafters) {
                if spec.id != pair.id && !ids.insert(spec.id.as_str()) {
                    return Err(HubError::Invalid(format!(
                        "duplicate catalogue id {}",
                        spec.id
                    )));
                }
                if spec.repo.is_some() == spec.embedded.is_some() {
                    return Err(HubError::Invalid(format!(
                        "{}: give exactly one of repo and embedded",
                        spec.id
                    )));
                }
                if let Some(repo) = &spec.repo {
                    crate::store::validate_repo_id(repo)?;
                }
                if spec.files.is_empty() {
                    return Err(HubError::Invalid(format!("{}: no files", spec.id)));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::required_bytes;

    #[test]
    fn builtin_parses_and_finds() {
        let catalogue = Catalogue::builtin();
        assert!(catalogue.pairs.len() >= 3);
        assert!(
            matches!(catalogue.find("qwen3.5-9b-4bit"), Some(Found::Target(p)) if p.id == "qwen3.5-9b-4bit")
        );
        assert!(matches!(
            catalogue.find("z-lab/Qwen3.6-35B-A3B-DFlash"),
            Some(Found::Drafter(p, _)) if p.id == "qwen3.6-35b-a3b-4bit"
        ));
        assert_eq!(catalogue.find("nope/nothing"), None);
    }

    #[test]
    fn memory_follows_the_rule() {
        for pair in Catalogue::builtin().pairs {
            let weights = pair.target.size_bytes + pair.drafters[0].size_bytes;
            assert_eq!(pair.memory_bytes, required_bytes(weights), "{}", pair.id);
        }
    }

    #[test]
    fn embedded_sizes_are_the_files() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
        let pair = Catalogue::builtin().pair("default").cloned().unwrap();
        for spec in std::iter::once(&pair.target).chain(&pair.drafters) {
            let dir = root.join(spec.embedded.as_deref().unwrap());
            let size: u64 = spec
                .files
                .iter()
                .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
                .sum();
            assert_eq!(size, spec.size_bytes, "{}", spec.id);
        }
    }

    #[test]
    fn installed_dirs() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
        let catalogue = Catalogue::builtin();
        let empty = Store::new("/nonexistent/store");
        let pair = catalogue.pair("default").unwrap();
        assert_eq!(
            pair.target.installed_dir(&empty, &root),
            Some(root.join("target"))
        );
        let hub_pair = catalogue.pair("qwen3.5-9b-4bit").unwrap();
        assert_eq!(hub_pair.target.installed_dir(&empty, &root), None);
    }

    #[test]
    fn rejects_duplicates_and_ambiguity() {
        let spec = r#"{"id":"x","repo":"a/b","revision":"main","files":["*"],"size_bytes":1,"source":"s"}"#;
        let dup = format!(
            r#"{{"pairs":[{{"id":"x","name":"n","target":{spec},"drafters":[],"memory_bytes":1}},{{"id":"x","name":"n","target":{spec},"drafters":[],"memory_bytes":1}}]}}"#
        );
        assert!(Catalogue::parse(&dup)
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        let both = spec.replace(r#""repo":"a/b""#, r#""repo":"a/b","embedded":"t""#);
        let bad = format!(
            r#"{{"pairs":[{{"id":"x","name":"n","target":{both},"drafters":[],"memory_bytes":1}}]}}"#
        );
        assert!(Catalogue::parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("exactly one"));
    }
}
