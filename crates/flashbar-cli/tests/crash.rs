//! Crash safety with real processes and real SIGKILLs: `flashbar pull`
//! killed while a weight file is being written resumes on the next run with
//! the right sha256 (and no stale lock), and `flashbar serve` killed in the
//! middle of a streamed answer restarts on the same port and answers.

#[path = "../../flashbar-hub/tests/common/fake_hub.rs"]
mod fake_hub;
mod serve_common;

use fake_hub::{FakeHub, FakeRepo, Faults};
use serve_common::{chat, free_port, request, send, serve};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// The `*.incomplete` file of a pull in progress, once it holds more than
/// `at_least` bytes.
fn partial_download(store: &Path, at_least: u64, wait: Duration) -> Option<(PathBuf, u64)> {
    let blobs = store.join("models--tiny--target/blobs");
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        for entry in std::fs::read_dir(&blobs).into_iter().flatten().flatten() {
            let path = entry.path();
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if path.extension().is_some_and(|e| e == "incomplete") && len > at_least {
                return Some((path, len));
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// 4 MiB of weights, so three pulls stay quick in a debug build.
fn small_repo() -> FakeRepo {
    fake_hub::small_repo(COMMIT, 4 << 20)
}

#[test]
fn a_pull_killed_mid_file_resumes_with_the_right_sha256() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let repo = small_repo();
    let source = repo.files[1].bytes.clone();
    let hub = runtime.block_on(FakeHub::start(HashMap::from([(
        "tiny/target".to_owned(),
        repo.clone(),
    )])));
    // 16 KiB every 4 ms: the weights take about a second, so the kills land
    // while the file is being written.
    hub.set_faults(Faults {
        chunk_delay: Some(Duration::from_millis(4)),
        ..Faults::default()
    });
    let home = tempfile::tempdir().unwrap();
    let store = home.path().join("hub");
    let pull = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flashbar"));
        command
            .args(["pull", "tiny/target", "--endpoint", &hub.url, "--dir"])
            .arg(&store)
            .env("HF_HUB_CACHE", &store)
            .env_remove("HF_ENDPOINT")
            .env_remove("HF_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    };

    // Killed twice, each time further into the same file.
    let mut kept = 0;
    for _ in 0..2 {
        let mut child = pull().spawn().unwrap();
        let (partial, seen) = partial_download(&store, kept + (512 << 10), Duration::from_secs(30))
            .expect("the download reached the weights");
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success());
        let len = std::fs::metadata(&partial).unwrap().len();
        assert!(len >= seen && len > kept, "{len} after {kept}");
        // What survived the kill is exactly the start of the file.
        assert!(len < source.len() as u64, "finished before the kill");
        assert!(std::fs::read(&partial).unwrap() == source[..len as usize]);
        kept = len;
    }

    hub.clear_seen();
    hub.set_faults(Faults::default());
    let output = pull().output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let snapshot = store.join(format!("models--tiny--target/snapshots/{COMMIT}"));
    for file in &repo.files {
        assert_eq!(
            sha256(&snapshot.join(&file.path)),
            file.sha256(),
            "{}",
            file.path
        );
    }
    // The last run asked only for the rest of the weights.
    assert_eq!(
        hub.get_ranges("model.safetensors"),
        [Some(format!("bytes={kept}-"))]
    );
}

#[test]
fn serve_killed_mid_stream_restarts_cleanly_on_the_same_port() {
    let port = free_port();
    let mut server = serve(port, &[], &[]).unwrap();
    let socket = send(
        port,
        "POST",
        "/v1/chat/completions",
        &chat("Tell me a long story about a fox.", 400, true),
    );
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    while !line.starts_with("data: {") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "no stream");
    }
    // Mid-generation: the first tokens are out, the rest are being made.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(reader);

    let server = serve(port, &[], &[]).expect("restarts on the same port");
    let (status, body) = request(port, "POST", "/v1/chat/completions", &chat("hi", 4, false));
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );
    drop(server);
}
