//! `flashbar serve` against what could take the process down: a model
//! folder whose chat template loops forever or writes gigabytes (one clear
//! error per request, the server keeps answering), and a pair that does not
//! fit in the memory budget (refused before its weights are read, with the
//! numbers; when it fits, MLX's limit is the budget).

mod serve_common;

use serve_common::{chat, free_port, models, request, serve};

/// The default target with `template` as its chat template (weights linked).
fn target_with_template(template: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = models().join("target");
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        let to = dir.path().join(entry.file_name());
        if entry.file_name() == "model.safetensors" {
            std::os::unix::fs::symlink(entry.path(), to).unwrap();
        } else {
            std::fs::copy(entry.path(), to).unwrap();
        }
    }
    let path = dir.path().join("tokenizer_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["chat_template"] = template.into();
    std::fs::write(path, config.to_string()).unwrap();
    dir
}

fn error_message(body: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    value["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message: {body}"))
        .to_owned()
}

#[test]
fn a_runaway_chat_template_fails_its_request_and_the_server_keeps_answering() {
    // What the first message asks for: an endless loop, a giant output, or
    // a normal prompt.
    let template = "{% if messages[0].content == 'loop' %}\
        {% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}\
        {% elif messages[0].content == 'big' %}\
        {% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}\
        {% else %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:{% endif %}";
    let model = target_with_template(template);
    let port = free_port();
    let model_arg = model.path().to_str().unwrap();
    let _server = serve(port, &["--model", model_arg], &[]).unwrap();
    let path = "/v1/chat/completions";
    for _ in 0..2 {
        let (status, body) = request(port, "POST", path, &chat("loop", 4, false));
        assert_eq!(status, 500, "{body}");
        let message = error_message(&body);
        assert!(message.starts_with("chat template: "), "{message}");
        assert!(message.contains("fuel"), "{message}");

        let (status, body) = request(port, "POST", path, &chat("big", 4, true));
        assert_eq!(status, 500, "{body}");
        let message = error_message(&body);
        assert!(message.contains("byte limit"), "{message}");

        let (status, body) = request(port, "POST", path, &chat("hello", 3, false));
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = request(port, "GET", "/health", "");
    assert_eq!(status, 200, "{body}");
}

/// A private copy of the default pair with the target's weights replaced
/// by garbage: loading them would fail with a checkpoint error.
fn pair_with_corrupt_weights() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    for entry in std::fs::read_dir(models().join("target")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
    }
    let weights = target.join("model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len() as usize;
    std::fs::write(&weights, vec![0xffu8; len]).unwrap();
    (dir, target)
}

#[test]
fn a_pair_over_the_memory_budget_is_refused_with_the_numbers() {
    let (_dir, target) = pair_with_corrupt_weights();
    let drafter = models().join("drafter");
    let args = [
        "--model",
        target.to_str().unwrap(),
        "--drafter",
        drafter.to_str().unwrap(),
    ];
    let budget = [("FLASHBAR_MEMORY_BUDGET", "64M")];
    let stderr = match serve(free_port(), &args, &budget) {
        Ok(_) => panic!("served a pair over the budget"),
        Err(stderr) => stderr,
    };
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The memory check comes before the weights are read (they are garbage).
    assert!(
        stderr.contains("not enough memory: the model and drafter need about 1.0"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "of weights + margin) but only 64.0 MiB is available (FLASHBAR_MEMORY_BUDGET)"
        ),
        "{stderr}"
    );

    // Without the override, the same folder fails on its weights instead.
    let stderr = match serve(free_port(), &args, &[]) {
        Ok(_) => panic!("served garbage weights"),
        Err(stderr) => stderr,
    };
    assert!(!stderr.contains("not enough memory"), "{stderr}");
}

#[test]
fn a_pair_that_fits_runs_under_an_mlx_limit_of_the_budget() {
    let port = free_port();
    let _server = serve(port, &[], &[("FLASHBAR_MEMORY_BUDGET", "3G")]).unwrap();
    let (status, body) = request(port, "GET", "/health", "");
    assert_eq!(status, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["memory"]["limit_bytes"], 3u64 << 30, "{body}");
}
