//! Faults that are real, not simulated (docs/reliability.md): a disk that
//! fills up mid-pull (a tmpfs the test mounts, filled by another writer), a
//! model folder written onto a full disk, and a model folder changed under
//! a running `flashbar serve`.

#[path = "../../flashbar-hub/tests/common/fake_hub.rs"]
mod fake_hub;
mod serve_common;
mod tmpfs;

use fake_hub::{FakeHub, FakeRepo, Fault, Faults, Gate};
use serve_common::{chat, free_port, request, serve};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const WEIGHTS_SIZE: usize = 4 << 20;

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn small_repo() -> FakeRepo {
    fake_hub::small_repo(COMMIT, WEIGHTS_SIZE)
}

fn pull_command(hub: &FakeHub, store: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flashbar"));
    command
        .args(["pull", "tiny/target", "--endpoint", &hub.url, "--dir"])
        .arg(store)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The last line of stderr, which must be the failure, said once.
fn failure_line(output: &Output) -> String {
    assert!(!output.status.success(), "it succeeded: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr.lines().last().unwrap_or_default().to_owned();
    assert!(line.starts_with("flashbar: "), "{stderr}");
    assert!(!line.contains("internal error"), "a panic: {stderr}");
    // No part of the message repeated (the OS error said twice, once by
    // the error and once by its source).
    let parts: Vec<&str> = line.split(": ").collect();
    for (i, part) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(part),
            "{part:?} said twice in {line:?}"
        );
    }
    line
}

/// The number right before `word` in `line` ("... needs 123 more bytes").
fn number_before(line: &str, word: &str) -> u64 {
    let head = &line[..line
        .find(word)
        .unwrap_or_else(|| panic!("{word:?} in {line:?}"))];
    head.split_whitespace().last().unwrap().parse().unwrap()
}

#[test]
fn a_pull_onto_a_disk_that_fills_up_says_so_once_and_resumes_with_the_right_bytes() {
    // 8 MiB: room for the 4 MiB pull when it starts (it checks first).
    let disk = tmpfs_or_skip!(8 << 20);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let repo = small_repo();
    let weights = repo.files[1].bytes.clone();
    let hub = runtime.block_on(FakeHub::start(HashMap::from([(
        "tiny/target".to_owned(),
        repo.clone(),
    )])));
    // config.json whole, then the weights pause after 1 MiB while another
    // writer takes the rest of the disk.
    let (gate, reached) = Gate::new();
    hub.set_faults(Faults {
        script: VecDeque::from([Fault::None, Fault::Gate(1 << 20, gate.clone())]),
        ..Faults::default()
    });
    let store = disk.path().join("hub");
    let child = pull_command(&hub, &store).spawn().unwrap();
    reached
        .recv_timeout(Duration::from_secs(120))
        .expect("the pull reached the weights");
    // The hub sent 1 MiB and waits: once the pull wrote all of it, another
    // writer takes every byte left on the disk.
    let blobs = store.join("models--tiny--target/blobs");
    let partial = blobs.join(format!("{}.incomplete", sha256(&weights)));
    let written = || std::fs::metadata(&partial).map_or(0, |m| m.len());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while written() < 1 << 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "stuck at {}",
            written()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let filler = disk.fill();
    gate.release();
    let output = child.wait_with_output().unwrap();
    let line = failure_line(&output);
    eprintln!("{line}");
    assert!(line.contains("is full"), "{line}");
    assert!(!line.contains("os error"), "{line}");

    let kept = written();
    assert!(kept >= 1 << 20 && kept < WEIGHTS_SIZE as u64, "{kept}");
    assert!(std::fs::read(&partial).unwrap() == weights[..kept as usize]);
    // The message says how much more the rest needs, and what is kept.
    assert_eq!(
        number_before(&line, "more bytes"),
        WEIGHTS_SIZE as u64 - kept
    );
    let config_size = repo.files[0].bytes.len() as u64;
    assert_eq!(number_before(&line, "bytes downloaded"), kept + config_size);
    assert!(!blobs.join(sha256(&weights)).exists(), "a final blob");

    // Space freed: the next pull resumes from the kept bytes and ends right.
    std::fs::remove_file(filler).unwrap();
    hub.clear_seen();
    let output = pull_command(&hub, &store).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let snapshot = store.join(format!("models--tiny--target/snapshots/{COMMIT}"));
    for file in &repo.files {
        let pulled = std::fs::read(snapshot.join(&file.path)).unwrap();
        assert_eq!(sha256(&pulled), file.sha256(), "{}", file.path);
    }
    assert_eq!(
        hub.get_ranges("model.safetensors"),
        [Some(format!("bytes={kept}-"))]
    );
}

fn embedded_target() -> std::path::PathBuf {
    serve_common::models().join("target")
}

/// Copies a folder's files, smallest first (so on a full disk it is the
/// weights that are cut short).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    let mut files: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(from)?
        .map(|e| {
            let path = e?.path();
            Ok((std::fs::metadata(&path)?.len(), path))
        })
        .collect::<std::io::Result<_>>()?;
    files.sort();
    for (_, path) in files {
        std::fs::copy(&path, to.join(path.file_name().unwrap()))?;
    }
    Ok(())
}

#[test]
fn a_model_folder_copied_onto_a_full_disk_is_a_clear_error() {
    // 4 MiB, for a 14 MiB model: the copy of the weights stops with ENOSPC
    // and leaves them cut short, as `cp` onto a full disk does.
    let disk = tmpfs_or_skip!(4 << 20);
    let target = disk.path().join("target");
    let copied = copy_dir(&embedded_target(), &target);
    let error = copied.expect_err("14 MiB fit on a 4 MiB disk");
    assert_eq!(error.raw_os_error(), Some(28), "{error}");
    for args in [
        vec!["generate", "--max-tokens", "4", "hi", "--model"],
        vec!["doctor", "--model"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_flashbar"))
            .args(&args)
            .arg(&target)
            .env("FLASHBAR_DEVICE", "cpu")
            .output()
            .unwrap();
        let line = failure_line(&output);
        eprintln!("{}: {line}", args[0]);
        assert!(line.contains("model.safetensors"), "{line}");
    }
}

/// What the server answers a chat request; the process must still be up.
fn chat_once(port: u16) -> (u16, String) {
    request(port, "POST", "/v1/chat/completions", &chat("hi", 6, false))
}

fn content(body: &str) -> String {
    let answer: serde_json::Value = serde_json::from_str(body).unwrap();
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"))
        .to_owned()
}

/// Weights, config and tokenizer truncated to nothing, or deleted, under a
/// running server, after its first request or before any: the weights are
/// read when the model loads (Checkpoint::load), the tokenizer and config
/// are parsed then too, so every later request gets the same answer as
/// before the change, and the process stays up and answers /health.
/// (Before the weights were read at load, a folder truncated before the
/// first request failed that request and every later one with MLX's
/// "[read] Unable to read from file".)
#[test]
fn a_model_folder_changed_under_a_running_server() {
    enum Change {
        Truncate,
        Delete,
    }
    let mut expected: Option<String> = None;
    for (change, warm) in [
        (Change::Truncate, true),
        (Change::Delete, true),
        (Change::Truncate, false),
        (Change::Delete, false),
    ] {
        let folder = tempfile::tempdir().unwrap();
        let target = folder.path().join("target");
        copy_dir(&embedded_target(), &target).unwrap();
        let port = free_port();
        let mut server = serve(port, &["--model", target.to_str().unwrap()], &[]).unwrap();
        if warm {
            let (status, body) = chat_once(port);
            assert_eq!(status, 200, "{body}");
            let answer = content(&body);
            assert_eq!(expected.get_or_insert(answer.clone()), &answer);
        }
        for entry in std::fs::read_dir(&target).unwrap() {
            let path = entry.unwrap().path();
            match change {
                Change::Truncate => {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .unwrap()
                        .set_len(0)
                        .unwrap();
                }
                Change::Delete => std::fs::remove_file(&path).unwrap(),
            }
        }
        let what = format!(
            "{} {} the first request",
            match change {
                Change::Truncate => "truncated",
                Change::Delete => "deleted",
            },
            if warm { "after" } else { "before" }
        );
        for _ in 0..2 {
            let (status, body) = chat_once(port);
            assert_eq!(status, 200, "{what}: {body}");
            assert_eq!(Some(content(&body)), expected, "{what}");
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "{what}: the server died"
            );
            let (status, body) = request(port, "GET", "/health", "");
            assert_eq!(status, 200, "{what}: {body}");
        }
    }
}
