//! The one resolver from what a user names to the folders that load: a
//! folder, a catalogue pair's id, a catalogue model's id or hub repo id
//! (its downloaded snapshot), or nothing (the embedded default pair). The
//! CLI's `--model` / `--drafter`, the app's settings and the server's model
//! id all go through it.

use crate::catalogue::{Catalogue, Found, RepoSpec};
use crate::store::Store;
use std::path::{Path, PathBuf};

/// A target folder and, optionally, its drafter's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    pub target: PathBuf,
    pub drafter: Option<PathBuf>,
}

impl Pair {
    /// The name the server gives the target: its folder's name, or for a
    /// snapshot in the hub cache (`models--owner--name/snapshots/<commit>`)
    /// the repo's `owner/name`.
    pub fn model_id(&self) -> String {
        model_id(&self.target)
    }
}

/// Where names are looked up.
pub struct Resolver<'a> {
    pub catalogue: &'a Catalogue,
    pub store: &'a Store,
    /// The embedded default target's folder; its default drafter is the
    /// `drafter/` beside it, and embedded catalogue entries live there too.
    pub embedded_target: &'a Path,
}

impl Resolver<'_> {
    /// The pair to load. An empty or missing target is the embedded pair;
    /// a given drafter always wins; with a catalogue target and no
    /// drafter, the pair's default drafter once it is downloaded; with a
    /// folder and no drafter, none.
    pub fn pair(&self, target: Option<&Path>, drafter: Option<&Path>) -> Result<Pair, String> {
        let target = target.filter(|p| !p.as_os_str().is_empty());
        let drafter = drafter.filter(|p| !p.as_os_str().is_empty());
        let target_dir = match target {
            None => self.embedded_target.to_owned(),
            Some(name) => self.target(name)?,
        };
        if !target_dir.is_dir() {
            return Err(format!(
                "model not found: {} is not a folder",
                target_dir.display()
            ));
        }
        let drafter = match (drafter, target) {
            (Some(name), _) => Some(self.drafter(name)?),
            (None, None) => Some(self.embedded_root().join("drafter"))
                .filter(|dir| dir.join("config.json").is_file()),
            (None, Some(name)) => self.default_drafter(name),
        };
        Ok(Pair {
            target: target_dir,
            drafter,
        })
    }

    /// A target's folder: `given` itself when it exists or names nothing
    /// in the catalogue, else the catalogue model's folder.
    fn target(&self, given: &Path) -> Result<PathBuf, String> {
        match self.lookup(given) {
            None => Ok(given.to_owned()),
            Some((name, Found::Target(pair))) => self.installed(&pair.target, name),
            Some((name, Found::Drafter(..))) => {
                Err(format!("{name} is a drafter; give it as the drafter"))
            }
        }
    }

    fn drafter(&self, given: &Path) -> Result<PathBuf, String> {
        let dir = match self.lookup(given) {
            None => given.to_owned(),
            Some((name, Found::Drafter(_, drafter))) => self.installed(drafter, name)?,
            // A pair's id as the drafter means its default drafter.
            Some((name, Found::Target(pair))) => match pair.drafters.first() {
                Some(drafter) => self.installed(drafter, name)?,
                None => return Err(format!("{name} has no drafter in the catalogue")),
            },
        };
        if !dir.is_dir() {
            return Err(format!(
                "drafter not found: {} is not a folder",
                dir.display()
            ));
        }
        Ok(dir)
    }

    fn default_drafter(&self, target: &Path) -> Option<PathBuf> {
        match self.lookup(target)? {
            (name, Found::Target(pair)) => self.installed(pair.drafters.first()?, name).ok(),
            (_, Found::Drafter(..)) => None,
        }
    }

    /// The catalogue entry `given` names (and the name), unless it is an
    /// existing path.
    fn lookup<'p>(&self, given: &'p Path) -> Option<(&'p str, Found<'_>)> {
        if given.exists() {
            return None;
        }
        let name = given.to_str()?;
        Some((name, self.catalogue.find(name)?))
    }

    fn installed(&self, spec: &RepoSpec, name: &str) -> Result<PathBuf, String> {
        spec.installed_dir(self.store, self.embedded_root())
            .ok_or_else(|| {
                format!(
                    "{name} ({}) is not downloaded yet: download it in the app's Models view or run `flashbar pull {}`",
                    spec.repo.as_deref().unwrap_or("embedded"),
                    spec.id
                )
            })
    }

    fn embedded_root(&self) -> &Path {
        self.embedded_target.parent().unwrap_or(Path::new("."))
    }
}

/// [`Pair::model_id`] of a target folder.
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

    fn embedded() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target")
    }

    fn resolve(target: Option<&str>, drafter: Option<&str>) -> Result<Pair, String> {
        let (target, drafter) = (target.map(Path::new), drafter.map(Path::new));
        let home = tempfile::tempdir().unwrap();
        let store = Store::new(home.path().to_owned());
        let embedded = embedded();
        let resolver = Resolver {
            catalogue: &Catalogue::builtin(),
            store: &store,
            embedded_target: &embedded,
        };
        resolver.pair(target, drafter)
    }

    #[test]
    fn nothing_named_is_the_embedded_pair_with_its_drafter() {
        for empty in [None, Some("")] {
            let pair = resolve(empty, None).unwrap();
            assert_eq!(pair.target, embedded());
            assert!(pair.drafter.unwrap().join("config.json").is_file());
        }
        // Its catalogue id gives the same folders.
        let by_id = resolve(Some("default"), Some("default")).unwrap();
        assert!(by_id.target.join("config.json").is_file());
        assert!(by_id.drafter.is_some());
    }

    #[test]
    fn a_folder_is_itself_and_brings_no_drafter_unless_given() {
        let target = embedded();
        let pair = resolve(target.to_str(), None).unwrap();
        assert_eq!((pair.target, pair.drafter), (target.clone(), None));
        let drafter = target.parent().unwrap().join("drafter");
        let pair = resolve(target.to_str(), drafter.to_str()).unwrap();
        assert_eq!(pair.drafter, Some(drafter));
    }

    #[test]
    fn bad_names_are_one_line_errors() {
        let error = resolve(Some("/no/such/model"), None).unwrap_err();
        assert_eq!(error, "model not found: /no/such/model is not a folder");
        let target = embedded();
        let error = resolve(target.to_str(), Some("/no/drafter")).unwrap_err();
        assert_eq!(error, "drafter not found: /no/drafter is not a folder");
        // A known pair that is not downloaded says how to get it.
        let error = resolve(Some("qwen3.5-9b-4bit"), None).unwrap_err();
        assert!(error.contains("flashbar pull qwen3.5-9b-4bit"), "{error}");
        assert!(!error.contains('\n'));
    }

    #[test]
    fn a_hub_snapshot_is_named_after_its_repo() {
        let snapshot = Path::new("/nowhere/hub/models--me--tiny-model/snapshots/0123abc");
        assert_eq!(model_id(snapshot), "me/tiny-model");
        assert_eq!(model_id(Path::new("/nowhere/my-model")), "my-model");
    }
}
