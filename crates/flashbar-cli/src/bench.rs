//! `flashbar bench`: prefill and decode speed of plain decoding on a model,
//! per prompt, after a warm-up run (GPU kernels compile on first use).

use crate::models::resolve_model;
use anyhow::Context;
use flashbar_engine::{CancelToken, Engine, GenerateRequest, NullSink, Prompt, Speculation};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[arg(long)]
    model: Option<PathBuf>,
    /// A file of prompts, one per line (default: a few built-in ones).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Runs per prompt; the report takes the median.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long)]
    json: bool,
}

const BUILTIN_PROMPTS: [&str; 3] = [
    "def fib(n):",
    "Write a short story about a robot who learns to paint.",
    "import numpy as np\n\ndef softmax(x):",
];

#[derive(serde::Serialize)]
struct PromptReport {
    prompt_tokens: usize,
    completion_tokens: usize,
    prefill_tokens_per_second: f64,
    decode_tokens_per_second: f64,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let backend = flashbar_mlx::device::activate()?;
    let dir = resolve_model(args.model.as_deref())?;
    let engine = Engine::load(&dir)?;
    let prompts: Vec<String> = match &args.prompts {
        Some(file) => std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.replace("\\n", "\n"))
            .collect(),
        None => BUILTIN_PROMPTS.iter().map(|p| p.to_string()).collect(),
    };
    let run_once = |prompt: &str, max_tokens: usize| {
        let mut request = GenerateRequest::new(Prompt::Text(prompt.to_owned()));
        request.max_tokens = max_tokens;
        request.speculation = Speculation::Off;
        engine.generate(&request, &mut NullSink, &CancelToken::default())
    };
    run_once(&prompts[0], 8)?; // warm-up
    let mut reports = Vec::new();
    for prompt in &prompts {
        let mut runs = Vec::new();
        for _ in 0..args.repeats.max(1) {
            runs.push(run_once(prompt, args.max_tokens)?.stats);
        }
        let median = |f: &dyn Fn(&flashbar_engine::Totals) -> f64| {
            let mut values: Vec<f64> = runs.iter().map(f).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        reports.push(PromptReport {
            prompt_tokens: runs[0].prompt_tokens,
            completion_tokens: runs[0].completion_tokens,
            prefill_tokens_per_second: median(&|s| s.prompt_tokens as f64 / s.prompt_seconds),
            decode_tokens_per_second: median(&|s| s.tokens_per_second),
        });
    }
    if args.json {
        let json = serde_json::json!({
            "model": dir,
            "device": backend,
            "prompts": reports,
            "peak_memory_bytes": mlx_rs::memory::peak_memory()?,
        });
        println!("{json}");
    } else {
        println!(
            "model {} on {backend}, peak memory {:.2} GB",
            dir.display(),
            mlx_rs::memory::peak_memory()? as f64 / 1e9
        );
        for r in &reports {
            println!(
                "prompt {:>5} tok: prefill {:>9.1} tok/s | decode {:>3} tok: {:>8.1} tok/s",
                r.prompt_tokens,
                r.prefill_tokens_per_second,
                r.completion_tokens,
                r.decode_tokens_per_second
            );
        }
    }
    Ok(())
}
