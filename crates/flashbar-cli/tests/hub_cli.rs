//! `flashbar pull`, `flashbar models` and catalogue ids in `--model`, run as
//! users run them, against a real local server speaking the hub's protocol.

#[path = "../../flashbar-hub/tests/common/fake_hub.rs"]
mod fake_hub;

use fake_hub::{repo_from_dir, FakeHub};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default")
}

fn flashbar(args: &[&str], store: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flashbar"))
        .args(args)
        .env("FLASHBAR_DEVICE", "cpu")
        .env("HF_HUB_CACHE", store)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .output()
        .expect("the binary runs")
}

fn one_line_failure(output: &Output) -> String {
    assert!(!output.status.success(), "succeeded: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr:?}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn pull_models_doctor_and_delete() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let hub = runtime.block_on(FakeHub::start(HashMap::from([
        (
            "tiny/target".to_owned(),
            repo_from_dir(&models().join("target"), COMMIT),
        ),
        (
            "tiny/drafter".to_owned(),
            repo_from_dir(&models().join("drafter"), COMMIT),
        ),
    ])));
    let home = tempfile::tempdir().unwrap();
    let store = home.path().join("hub");
    let dir = store.to_str().unwrap();

    for repo in ["tiny/target", "tiny/drafter"] {
        let output = flashbar(
            &["pull", repo, "--endpoint", &hub.url, "--dir", dir],
            &store,
        );
        assert!(output.status.success(), "{output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains(COMMIT), "{stdout}");
    }
    let snapshot = |name: &str| store.join(format!("models--tiny--{name}/snapshots/{COMMIT}"));
    let output = flashbar(
        &[
            "doctor",
            "--model",
            snapshot("target").to_str().unwrap(),
            "--drafter",
            snapshot("drafter").to_str().unwrap(),
        ],
        &store,
    );
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("files") && stdout.contains("memory"),
        "{stdout}"
    );

    let output = flashbar(&["models", "--dir", dir, "--json"], &store);
    assert!(output.status.success(), "{output:?}");
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let local: Vec<&str> = listed["local"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["repo"].as_str().unwrap())
        .collect();
    assert_eq!(local, vec!["tiny/drafter", "tiny/target"]);
    assert!(listed["catalogue"].as_array().unwrap().len() >= 3);

    let stderr = one_line_failure(&flashbar(
        &[
            "pull",
            "nobody/nothing",
            "--endpoint",
            &hub.url,
            "--dir",
            dir,
        ],
        &store,
    ));
    assert!(
        stderr.contains("nobody/nothing") && stderr.contains("not found"),
        "{stderr}"
    );

    let output = flashbar(&["models", "--dir", dir, "--delete", "tiny/target"], &store);
    assert!(output.status.success(), "{output:?}");
    assert!(!store.join("models--tiny--target").exists());
}

#[test]
fn catalogue_ids_as_model_names() {
    let home = tempfile::tempdir().unwrap();
    // The embedded pair by its id.
    let output = flashbar(
        &["doctor", "--model", "default", "--drafter", "default"],
        home.path(),
    );
    assert!(output.status.success(), "{output:?}");
    // A known pair that is not downloaded says how to get it.
    let stderr = one_line_failure(&flashbar(
        &["doctor", "--model", "qwen3.5-9b-4bit"],
        home.path(),
    ));
    assert!(stderr.contains("flashbar pull qwen3.5-9b-4bit"), "{stderr}");
    // Nothing to pull for the embedded pair; a bad endpoint is refused up front.
    let stderr = one_line_failure(&flashbar(&["pull", "default"], home.path()));
    assert!(stderr.contains("embedded"), "{stderr}");
    let stderr = one_line_failure(&flashbar(
        &["pull", "a/b", "--endpoint", "ftp://x"],
        home.path(),
    ));
    assert!(stderr.contains("not an http(s) URL"), "{stderr}");
}

#[test]
fn pulling_a_catalogue_pair_then_using_it_by_id() {
    // The fake hub serves the embedded pair under the 9B entry's repo ids.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let hub = runtime.block_on(FakeHub::start(HashMap::from([
        (
            "mlx-community/Qwen3.5-9B-4bit".to_owned(),
            repo_from_dir(&models().join("target"), COMMIT),
        ),
        (
            "z-lab/Qwen3.5-9B-DFlash".to_owned(),
            repo_from_dir(&models().join("drafter"), COMMIT),
        ),
    ])));
    let home = tempfile::tempdir().unwrap();
    let output = flashbar(
        &["pull", "qwen3.5-9b-4bit", "--endpoint", &hub.url],
        home.path(),
    );
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("mlx-community/Qwen3.5-9B-4bit")
            && stdout.contains("z-lab/Qwen3.5-9B-DFlash"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("doctor: the pair is usable here"),
        "{stderr}"
    );
    // The pair id now names the downloaded target, and brings its drafter.
    let output = flashbar(
        &["doctor", "--model", "qwen3.5-9b-4bit", "--json"],
        home.path(),
    );
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let drafter = report["drafter"].as_str().unwrap();
    assert!(
        drafter.contains("models--z-lab--Qwen3.5-9B-DFlash"),
        "{drafter}"
    );
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"drafter") && names.contains(&"memory"),
        "{names:?}"
    );
    let output = flashbar(&["models"], home.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("downloaded"), "{stdout}");
}

#[test]
fn hf_endpoint_and_hf_token_from_the_environment() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let hub = runtime.block_on(FakeHub::start(HashMap::from([(
        "tiny/drafter".to_owned(),
        repo_from_dir(&models().join("drafter"), COMMIT),
    )])));
    let home = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["pull", "tiny/drafter"];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_flashbar"))
            .args(&args)
            .env("HF_HUB_CACHE", home.path())
            .env("HF_ENDPOINT", &hub.url)
            .env("HF_TOKEN", "hf_user_secret")
            .output()
            .unwrap()
    };
    let output = run(&[]);
    assert!(output.status.success(), "{output:?}");
    assert!(!hub.seen().is_empty());
    assert!(
        hub.seen().iter().all(|s| s.authorization.is_none()),
        "the token went to a mirror: {:?}",
        hub.seen()
    );
    hub.clear_seen();
    let output = run(&["--send-token-to-mirror"]);
    assert!(output.status.success(), "{output:?}");
    assert!(hub
        .seen()
        .iter()
        .all(|s| s.authorization.as_deref() == Some("Bearer hf_user_secret")));
}
