//! Whether a target (and its drafter) can run here, as reasons, never panics:
//! the folders are complete, the loader's own checks pass (reused from
//! `flashbar_engine::doctor`), the drafter fits the target, and the pair fits
//! in memory.

use crate::memory::{self, MemoryBudget};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How one check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Fail,
    /// Could not be checked on this machine; `detail` says why.
    Unknown,
}

/// One check and its reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

/// Every check on a pair, and the verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub target: PathBuf,
    pub drafter: Option<PathBuf>,
    pub checks: Vec<Finding>,
}

impl Report {
    /// Usable: no check failed (unknown ones do not block).
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The first failure, as "check: reason".
    pub fn first_failure(&self) -> Option<String> {
        self.checks
            .iter()
            .find(|c| c.status == Status::Fail)
            .map(|c| format!("{}: {}", c.name, c.detail))
    }
}

/// Runs every check, even after a failure, with this machine's memory.
pub fn diagnose(target: &Path, drafter: Option<&Path>) -> Report {
    diagnose_with_budget(target, drafter, &memory::budget())
}

/// Same, against a given memory budget.
pub fn diagnose_with_budget(
    target: &Path,
    drafter: Option<&Path>,
    budget: &MemoryBudget,
) -> Report {
    let mut checks = vec![files_check("files", target, &target_missing(target))];
    if let Some(drafter) = drafter {
        checks.push(files_check(
            "drafter files",
            drafter,
            &drafter_missing(drafter),
        ));
    }
    if target.is_dir() {
        checks.extend(
            flashbar_engine::doctor::check_target(target)
                .into_iter()
                .map(from_engine),
        );
        if let Some(drafter) = drafter {
            checks.push(from_engine(flashbar_engine::doctor::check_drafter(
                target, drafter,
            )));
        }
    }
    checks.push(memory_check(target, drafter, budget));
    Report {
        target: target.to_owned(),
        drafter: drafter.map(Path::to_owned),
        checks,
    }
}

fn from_engine(finding: flashbar_engine::doctor::Finding) -> Finding {
    Finding {
        name: finding.check.to_owned(),
        status: if finding.ok { Status::Ok } else { Status::Fail },
        detail: finding.detail,
    }
}

fn files_check(name: &str, dir: &Path, missing: &Result<Vec<String>, String>) -> Finding {
    let (status, detail) = match missing {
        Err(reason) => (Status::Fail, reason.clone()),
        Ok(missing) if missing.is_empty() => (Status::Ok, format!("complete in {}", dir.display())),
        Ok(missing) => (
            Status::Fail,
            format!(
                "missing {} (an unfinished download? pull it again)",
                missing.join(", ")
            ),
        ),
    };
    Finding {
        name: name.to_owned(),
        status,
        detail,
    }
}

/// Files a target folder must hold: config, every weight shard the index
/// names (or a single `model.safetensors`), the tokenizer.
fn target_missing(dir: &Path) -> Result<Vec<String>, String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a folder", dir.display()));
    }
    let mut missing = absent(dir, &["config.json", "tokenizer.json"]);
    missing.extend(weights_missing(dir)?);
    Ok(missing)
}

/// A drafter folder: config and weights.
fn drafter_missing(dir: &Path) -> Result<Vec<String>, String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a folder", dir.display()));
    }
    let mut missing = absent(dir, &["config.json"]);
    missing.extend(weights_missing(dir)?);
    Ok(missing)
}

fn absent(dir: &Path, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|n| !dir.join(n).is_file())
        .map(|n| n.to_string())
        .collect()
}

fn weights_missing(dir: &Path) -> Result<Vec<String>, String> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text =
            std::fs::read_to_string(&index).map_err(|e| format!("{}: {e}", index.display()))?;
        let parsed: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("model.safetensors.index.json is not JSON: {e}"))?;
        let map = parsed
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or("model.safetensors.index.json has no weight_map")?;
        let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
        shards.sort_unstable();
        shards.dedup();
        if shards
            .iter()
            .any(|s| s.contains("..") || Path::new(s).is_absolute())
        {
            return Err("model.safetensors.index.json names a file outside the folder".into());
        }
        return Ok(absent(dir, &shards));
    }
    Ok(absent(dir, &["model.safetensors"]))
}

/// Bytes of `*.safetensors` in a folder (links followed).
pub use flashbar_mlx::memory_guard::weight_bytes;

fn memory_check(target: &Path, drafter: Option<&Path>, budget: &MemoryBudget) -> Finding {
    let weights = weight_bytes(target) + drafter.map_or(0, weight_bytes);
    let needed = memory::required_bytes(weights);
    let (status, detail) = match budget.bytes {
        None => (
            Status::Unknown,
            format!("needs about {} but {}", gib(needed), budget.source),
        ),
        Some(have) if needed <= have => (
            Status::Ok,
            format!(
                "needs about {} of {} ({})",
                gib(needed),
                gib(have),
                budget.source
            ),
        ),
        Some(have) => (
            Status::Fail,
            format!(
                "needs about {} ({} of weights + margin) but only {} ({})",
                gib(needed),
                gib(weights),
                gib(have),
                budget.source
            ),
        ),
    };
    Finding {
        name: "memory".into(),
        status,
        detail,
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
