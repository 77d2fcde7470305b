//! The `flashbar` command line as users and scripts call it: the JSON
//! contract, and one-line errors with a non-zero status for bad input.

use std::path::Path;
use std::process::{Command, Output};

fn flashbar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flashbar"))
        .args(args)
        .env("FLASHBAR_DEVICE", "cpu")
        .output()
        .expect("the binary runs")
}

/// Fails unless the command failed with exactly one line on stderr.
fn one_line_failure(output: &Output) -> String {
    assert!(!output.status.success(), "succeeded: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr:?}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{stderr}"
    );
    stderr
}

#[test]
fn generate_json_follows_the_contract() {
    let output = flashbar(&[
        "generate",
        "--json",
        "--max-tokens",
        "6",
        "--speculation",
        "off",
        "def fib(n):",
    ]);
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(json["text"].is_string());
    assert_eq!(json["token_ids"].as_array().unwrap().len(), 6);
    assert_eq!(json["finish_reason"], "length");
    let stats = &json["stats"];
    for key in [
        "mode",
        "prompt_tokens",
        "completion_tokens",
        "rounds",
        "accepted_tokens",
        "mean_accept_len",
        "tokens_per_second",
    ] {
        assert!(!stats[key].is_null(), "stats.{key} missing: {stats}");
    }
    assert_eq!(stats["completion_tokens"], 6);
    assert_eq!(stats["mode"], "ar");
}

#[test]
fn streamed_text_equals_the_json_text() {
    let plain = flashbar(&["generate", "--max-tokens", "12", "def fib(n):"]);
    let json = flashbar(&["generate", "--json", "--max-tokens", "12", "def fib(n):"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let streamed = String::from_utf8(plain.stdout).unwrap();
    assert_eq!(
        streamed.strip_suffix('\n').unwrap(),
        json["text"].as_str().unwrap()
    );
}

/// `flashbar generate --max-tokens 100000 x | head -c 10`: once the reader
/// is gone the generation stops at the next token (it does not run on to
/// the context's 4,096 tokens), and exits cleanly, no panic on the pipe.
#[test]
fn a_closed_stdout_stops_the_generation() {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_flashbar"))
        .args([
            "--log-level",
            "flashbar_engine=debug",
            "generate",
            "--max-tokens",
            "100000",
            "--speculation",
            "off",
            "def fib(n):",
        ])
        .env("FLASHBAR_DEVICE", "cpu")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut head = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    // The pipe's read end is dropped here, as `head -c 10` exits.
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!log.contains("panicked"), "{log}");
    let done = log
        .lines()
        .find(|l| l.contains("generation done"))
        .unwrap_or_else(|| panic!("no 'generation done' in {log}"));
    assert!(done.contains("finish=Cancelled"), "{done}");
    let completion: usize = done
        .split("completion_tokens=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no completion_tokens in {done}"));
    // 10 bytes are a few tokens; a few more may be written before the
    // read end closes, never the thousands the context allows.
    assert!(completion < 200, "{done}");
}

#[test]
fn doctor_passes_on_the_default_model() {
    let output = flashbar(&["doctor"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("weights") && stdout.contains("ok"),
        "{stdout}"
    );
}

#[test]
fn a_missing_model_folder() {
    let stderr = one_line_failure(&flashbar(&[
        "generate",
        "--model",
        "/nonexistent/model",
        "hi",
    ]));
    assert!(stderr.contains("model not found"), "{stderr}");
}

/// A private copy of the default model, to damage.
fn default_model_copy() -> tempfile::TempDir {
    let temp = tempfile::tempdir().unwrap();
    let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default/target");
    for entry in std::fs::read_dir(default).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), temp.path().join(entry.file_name())).unwrap();
    }
    temp
}

/// A change to a config.json.
type ConfigEdit = fn(&mut serde_json::Value);

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(path, config.to_string()).unwrap();
}

#[test]
fn config_problems_fail_generate_with_one_line() {
    let cases: [(&str, ConfigEdit); 3] = [
        ("unsupported model_type \"llama\"", |c| {
            c["model_type"] = "llama".into()
        }),
        ("missing field `num_hidden_layers`", |c| {
            c["text_config"]
                .as_object_mut()
                .unwrap()
                .remove("num_hidden_layers");
        }),
        ("has shape", |c| {
            c["text_config"]["hidden_size"] = 128.into()
        }),
    ];
    for (expected, edit) in cases {
        let temp = default_model_copy();
        edit_config(temp.path(), edit);
        let stderr = one_line_failure(&flashbar(&[
            "generate",
            "--model",
            temp.path().to_str().unwrap(),
            "hi",
        ]));
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
}

#[test]
fn a_prompt_longer_than_the_context() {
    let temp = default_model_copy();
    edit_config(temp.path(), |c| {
        c["text_config"]["max_position_embeddings"] = 4.into()
    });
    let model = temp.path().to_str().unwrap();
    let stderr = one_line_failure(&flashbar(&[
        "generate",
        "--model",
        model,
        "def fib(n): return n",
    ]));
    assert!(stderr.contains("the model's context is 4"), "{stderr}");
}

#[test]
fn a_corrupt_checkpoint_in_generate_and_doctor() {
    let temp = default_model_copy();
    let weights = temp.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let model = temp.path().to_str().unwrap();
    let stderr = one_line_failure(&flashbar(&["generate", "--model", model, "hi"]));
    assert!(stderr.contains("truncated"), "{stderr}");
    let doctor = flashbar(&["doctor", "--model", model]);
    assert!(!doctor.status.success());
    assert!(String::from_utf8_lossy(&doctor.stdout).contains("FAIL"));
}

#[test]
fn an_empty_prompt() {
    let stderr = one_line_failure(&flashbar(&["generate", ""]));
    assert!(stderr.contains("the prompt is empty"), "{stderr}");
}

#[test]
fn a_bad_flag() {
    let stderr = one_line_failure(&flashbar(&["generate", "--temperature", "hot", "hi"]));
    assert!(stderr.contains("--temperature"), "{stderr}");
    let stderr = one_line_failure(&flashbar(&["generate", "--no-such-flag", "hi"]));
    assert!(stderr.contains("--no-such-flag"), "{stderr}");
}

fn default_pair() -> (std::path::PathBuf, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    (root.join("target"), root.join("drafter"))
}

/// A copy of the default drafter whose taps name a layer the target lacks.
fn misfit_drafter(dir: &Path) {
    let (_, drafter) = default_pair();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        drafter.join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(drafter.join("config.json")).unwrap())
            .unwrap();
    config["dflash_config"]["target_layer_ids"] = serde_json::json!([0, 2, 7]);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn a_drafter_that_does_not_fit_is_refused_with_the_reason() {
    let stderr = one_line_failure(&flashbar(&["generate", "--drafter", "/nonexistent", "hi"]));
    assert!(stderr.contains("drafter not found"), "{stderr}");
    let temp = tempfile::tempdir().unwrap();
    misfit_drafter(temp.path());
    let drafter = temp.path().to_str().unwrap();
    let stderr = one_line_failure(&flashbar(&["generate", "--drafter", drafter, "hi"]));
    assert!(
        stderr.contains("does not fit the target: tap layer 7 does not exist"),
        "{stderr}"
    );
    // The doctor explains it too, and fails.
    let output = flashbar(&["doctor", "--drafter", drafter]);
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("drafter") && stdout.contains("tap layer 7"),
        "{stdout}"
    );
}

#[test]
fn generate_with_a_drafter_reports_rounds_and_acceptance() {
    let (target, drafter) = default_pair();
    let (target, drafter) = (target.to_str().unwrap(), drafter.to_str().unwrap());
    let run = |speculation: &str| {
        let output = flashbar(&[
            "generate",
            "--model",
            target,
            "--drafter",
            drafter,
            "--speculation",
            speculation,
            "--max-tokens",
            "12",
            "--json",
            "def fib(n):",
        ]);
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let (fast, plain) = (run("dflash"), run("off"));
    assert_eq!(fast["token_ids"], plain["token_ids"]);
    let stats = &fast["stats"];
    assert_eq!(stats["mode"], "dflash");
    let rounds = stats["rounds"].as_u64().unwrap();
    // The prefill's token is a plain round; every round commits accepted + 1.
    assert!((2..=12).contains(&rounds), "{stats}");
    let accepted = stats["accepted_tokens"].as_u64().unwrap();
    let mean = stats["mean_accept_len"].as_f64().unwrap();
    assert_eq!(mean, 12.0 / rounds as f64, "{stats}");
    assert_eq!(accepted + rounds, 12, "{stats}");
    // The doctor accepts the pair.
    let output = flashbar(&["doctor", "--model", target, "--drafter", drafter]);
    assert!(output.status.success(), "{output:?}");
}

/// `bench --verify-cost` reports decode, verify and (with a drafter) draft
/// times, each with the host's part of it, which cannot exceed the whole.
#[test]
fn verify_cost_reports_the_host_part_and_the_draft() {
    let (target, drafter) = default_pair();
    let (target, drafter) = (target.to_str().unwrap(), drafter.to_str().unwrap());
    let report = |pair: &[&str]| -> serde_json::Value {
        let timing = [
            "--verify-cost",
            "--block",
            "4",
            "--context-tokens",
            "12",
            "--repeats",
            "5",
        ];
        let args: Vec<&str> = ["bench"]
            .iter()
            .chain(pair)
            .chain(&timing)
            .copied()
            .collect();
        let output = flashbar(&[&args[..], &["--json"]].concat());
        assert!(output.status.success(), "{output:?}");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        report["verify_cost"].clone()
    };
    let cost = report(&["--model", target, "--drafter", drafter]);
    let ms = |key: &str| {
        cost[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {cost}"))
    };
    for (part, whole) in [
        ("decode_queued_ms", "decode_ms"),
        ("verify_queued_ms", "verify_ms"),
        ("draft_queued_ms", "draft_ms"),
        // the graph built is part of the host's part
        ("decode_built_ms", "decode_queued_ms"),
        ("verify_built_ms", "verify_queued_ms"),
    ] {
        assert!(
            ms(part) > 0.0 && ms(part) <= ms(whole),
            "{part} / {whole}: {cost}"
        );
    }
    // serde_json's default float parsing may land one ulp off the printed
    // value, so the ratio is compared to a relative 1e-12, not bit for bit.
    let ratio = ms("verify_ms") / ms("decode_ms");
    assert!(
        (ms("ratio") - ratio).abs() <= 1e-12 * ratio,
        "ratio {} vs verify / decode {ratio}: {cost}",
        ms("ratio")
    );
    // Without a drafter there is no draft to time.
    let cost = report(&["--model", target]);
    assert!(cost["draft_ms"].is_null(), "{cost}");
}

/// `bench --drafter` runs plain decoding, forced DFlash and auto on each
/// prompt (in an order that turns around every repeat): all three give
/// plain decoding's tokens, and each reports the rounds of its last run.
#[test]
fn bench_runs_every_mode_and_each_equals_plain_decoding() {
    let (target, drafter) = default_pair();
    let (target, drafter) = (target.to_str().unwrap(), drafter.to_str().unwrap());
    let prompts = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(prompts.path(), "def fib(n):\nclass Stack:\n").unwrap();
    for repeats in ["1", "3"] {
        let output = flashbar(&[
            "bench",
            "--model",
            target,
            "--drafter",
            drafter,
            "--prompts",
            prompts.path().to_str().unwrap(),
            "--max-tokens",
            "12",
            "--repeats",
            repeats,
            "--json",
        ]);
        assert!(output.status.success(), "{output:?}");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let prompts = report["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 2, "{report}");
        for prompt in prompts {
            let plain = &prompt["token_ids"];
            assert_eq!(plain.as_array().unwrap().len(), 12, "{prompt}");
            assert_eq!(prompt["plain_rounds"].as_array().unwrap().len(), 12);
            for mode in ["dflash", "auto"] {
                assert_eq!(&prompt[mode]["token_ids"], plain, "{mode}: {prompt}");
                let committed: u64 = prompt[mode]["rounds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["committed"].as_u64().unwrap())
                    .sum();
                assert_eq!(committed, 12, "{mode}: {prompt}");
                // Over the last half of the repeats (at least one).
                let end = prompt[mode]["end_speedup"].as_f64();
                assert!(end.is_some_and(|x| x > 0.0), "{mode}: {prompt}");
            }
            let forced = prompt["dflash"]["rounds"].as_array().unwrap();
            assert!(forced.iter().any(|r| r["mode"] == "dflash"), "{prompt}");
        }
    }
}

#[test]
fn dflash_without_a_drafter() {
    let (target, _) = default_pair();
    let stderr = one_line_failure(&flashbar(&[
        "generate",
        "--model",
        target.to_str().unwrap(),
        "--speculation",
        "dflash",
        "hi",
    ]));
    assert!(stderr.contains("needs a drafter"), "{stderr}");
}

#[test]
fn serve_on_a_busy_port_is_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let stderr = one_line_failure(&flashbar(&["serve", "--port", &port]));
    assert!(stderr.contains("already in use"), "{stderr}");
}

#[test]
fn serve_with_a_missing_model_is_one_line() {
    let stderr = one_line_failure(&flashbar(&[
        "serve",
        "--port",
        "0",
        "--model",
        "/nonexistent/model",
    ]));
    assert!(stderr.contains("model not found"), "{stderr}");
}
