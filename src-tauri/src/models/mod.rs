//! Choosing the target and drafter: the engine's doctor checks a pair of
//! folders (the same validation loading does, without allocating weights)
//! so the Models view can show its verdict before the pair is used.

use crate::engine::pair;
use flashbar_engine::doctor;
use serde::Serialize;

#[derive(Debug, Serialize, PartialEq)]
pub struct Verdict {
    pub target: String,
    pub drafter: Option<String>,
    /// Every check passed.
    pub ok: bool,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Finding {
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

/// The doctor's verdict on a pair (empty target: the default pair).
#[tauri::command]
pub async fn models_check(target: String, drafter: String) -> Result<Verdict, String> {
    // Reading checkpoints' headers takes a moment: off the UI's thread.
    tauri::async_runtime::spawn_blocking(move || check(&target, &drafter))
        .await
        .map_err(|e| format!("the check stopped: {e}"))?
}

fn check(target: &str, drafter: &str) -> Result<Verdict, String> {
    let pair = pair::resolve(target, drafter)?;
    let mut findings: Vec<Finding> = doctor::check_target(&pair.target)
        .into_iter()
        .map(|f| Finding {
            check: f.check.to_owned(),
            ok: f.ok,
            detail: f.detail,
        })
        .collect();
    if let Some(drafter) = &pair.drafter {
        let f = doctor::check_drafter(&pair.target, drafter);
        findings.push(Finding {
            check: f.check.to_owned(),
            ok: f.ok,
            detail: f.detail,
        });
    }
    Ok(Verdict {
        target: pair.target.display().to_string(),
        drafter: pair.drafter.map(|d| d.display().to_string()),
        ok: findings.iter().all(|f| f.ok),
        findings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pair_passes_the_doctor() {
        let verdict = check("", "").unwrap();
        assert!(verdict.ok, "{verdict:?}");
        assert!(verdict.findings.iter().any(|f| f.check == "drafter"));
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
