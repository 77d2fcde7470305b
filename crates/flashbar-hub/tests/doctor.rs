//! The doctor gives reasons, never panics: incomplete folders, a drafter that
//! does not fit, a pair that does not fit in memory.

use flashbar_hub::doctor::{diagnose_with_budget, Report, Status};
use flashbar_hub::memory::MemoryBudget;
use std::path::{Path, PathBuf};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default")
}

fn plenty() -> MemoryBudget {
    MemoryBudget {
        bytes: Some(1 << 40),
        source: "test budget".into(),
    }
}

fn status(report: &Report, name: &str) -> (Status, String) {
    let check = report
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check in {report:?}"));
    (check.status, check.detail.clone())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn the_embedded_pair_passes() {
    let report = diagnose_with_budget(
        &models().join("target"),
        Some(&models().join("drafter")),
        &plenty(),
    );
    assert!(report.ok(), "{report:#?}");
    for name in [
        "files",
        "drafter files",
        "weights",
        "tokenizer",
        "drafter",
        "memory",
    ] {
        assert_eq!(status(&report, name).0, Status::Ok, "{name}");
    }
}

#[test]
fn memory_that_is_too_small_or_unknown() {
    let target = models().join("target");
    let small = MemoryBudget {
        bytes: Some(1000),
        source: "a tiny test budget".into(),
    };
    let report = diagnose_with_budget(&target, None, &small);
    let (state, detail) = status(&report, "memory");
    assert_eq!(state, Status::Fail);
    assert!(
        detail.contains("a tiny test budget") && detail.contains("only"),
        "{detail}"
    );
    assert!(!report.ok());
    assert!(report
        .first_failure()
        .unwrap()
        .starts_with("memory: needs about"));

    let unknown = MemoryBudget {
        bytes: None,
        source: "this machine cannot say".into(),
    };
    let report = diagnose_with_budget(&target, None, &unknown);
    let (state, detail) = status(&report, "memory");
    assert_eq!(state, Status::Unknown);
    assert!(detail.contains("cannot say"), "{detail}");
    assert!(report.ok(), "an unknown budget does not block");
}

#[test]
fn an_incomplete_target_names_what_is_missing() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("target");
    copy_dir(&models().join("target"), &dir);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let report = diagnose_with_budget(&dir, None, &plenty());
    let (state, detail) = status(&report, "files");
    assert_eq!(state, Status::Fail);
    assert!(
        detail.contains("tokenizer.json") && detail.contains("model.safetensors"),
        "{detail}"
    );
    assert!(!report.ok());
}

#[cfg(unix)]
#[test]
fn a_dangling_store_link_is_an_unfinished_download() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("snapshot");
    copy_dir(&models().join("target"), &dir);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::os::unix::fs::symlink("../../blobs/gone", dir.join("model.safetensors")).unwrap();
    let report = diagnose_with_budget(&dir, None, &plenty());
    let (state, detail) = status(&report, "files");
    assert_eq!(state, Status::Fail);
    assert!(
        detail.contains("model.safetensors") && detail.contains("pull it again"),
        "{detail}"
    );
}

#[test]
fn a_drafter_that_does_not_fit_says_why() {
    let temp = tempfile::tempdir().unwrap();
    let drafter = temp.path().join("drafter");
    copy_dir(&models().join("drafter"), &drafter);
    let config_path = drafter.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["dflash_config"]["target_layer_ids"] = serde_json::json!([0, 2, 7]);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let report = diagnose_with_budget(&models().join("target"), Some(&drafter), &plenty());
    let (state, detail) = status(&report, "drafter");
    assert_eq!(state, Status::Fail);
    assert!(detail.contains("tap layer 7"), "{detail}");
    assert_eq!(status(&report, "drafter files").0, Status::Ok);
}

#[test]
fn a_missing_folder_is_a_reason_not_a_panic() {
    let report = diagnose_with_budget(
        Path::new("/nonexistent/model"),
        Some(Path::new("/nonexistent/drafter")),
        &plenty(),
    );
    let (state, detail) = status(&report, "files");
    assert_eq!(state, Status::Fail);
    assert!(detail.contains("not a folder"), "{detail}");
    assert_eq!(status(&report, "drafter files").0, Status::Fail);
}
