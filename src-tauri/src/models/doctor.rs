//! The doctor's verdict on a pair of folders, from the hub crate's doctor:
//! the folders are complete, the loader's own checks pass (without
//! allocating weights), the drafter fits the target, and the pair fits in
//! this machine's memory. Shown before a pair is used.

use crate::engine::pair;
use flashbar_hub::doctor::{self, Status};
use serde::Serialize;

#[derive(Debug, Serialize, PartialEq, ts_rs::TS)]
pub struct Verdict {
    pub target: String,
    pub drafter: Option<String>,
    /// No check failed (one that could not be made here does not block).
    pub ok: bool,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Serialize, PartialEq, ts_rs::TS)]
pub struct Finding {
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

/// The verdict on two folders (empty target: the default pair).
pub fn check(target: &str, drafter: &str) -> Result<Verdict, String> {
    let pair = pair::resolve(target, drafter)?;
    let report = doctor::diagnose(&pair.target, pair.drafter.as_deref());
    Ok(Verdict {
        target: pair.target.display().to_string(),
        drafter: pair.drafter.map(|d| d.display().to_string()),
        ok: report.ok(),
        findings: report
            .checks
            .into_iter()
            .map(|c| Finding {
                ok: c.status != Status::Fail,
                detail: match c.status {
                    Status::Unknown => format!("not checked here: {}", c.detail),
                    _ => c.detail,
                },
                check: c.name,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pair_passes_the_doctor() {
        let verdict = check("", "").unwrap();
        assert!(verdict.ok, "{verdict:?}");
        for name in ["files", "drafter", "memory"] {
            assert!(verdict.findings.iter().any(|f| f.check == name), "{name}");
        }
    }

    #[test]
    fn a_drafter_used_as_a_target_fails_with_reasons() {
        let drafter = pair::default_pair().drafter.unwrap();
        let verdict = check(drafter.to_str().unwrap(), "").unwrap();
        assert!(!verdict.ok);
        assert!(verdict
            .findings
            .iter()
            .any(|f| !f.ok && !f.detail.is_empty()));
    }
}
