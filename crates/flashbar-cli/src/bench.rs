//! `flashbar bench`: prefill and decode speed of plain decoding on a model,
//! per prompt, after a warm-up run (GPU kernels compile on first use); with
//! `--drafter`, DFlash side by side with its speedup; with `--verify-cost`,
//! the time of one block verify over one decode step.

use crate::models::resolve_model;
use anyhow::Context;
use flashbar_engine::{
    Engine, GenerateRequest, Generation, Mode, Prompt, RoundStats, Sink, Speculation, Totals,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[arg(long)]
    model: Option<PathBuf>,
    /// DFlash drafter folder: also measure speculative decoding.
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Measure verify(block) / decode(1) instead of generating.
    #[arg(long)]
    verify_cost: bool,
    /// Tokens per verify for --verify-cost.
    #[arg(long, default_value_t = 16)]
    block: usize,
    /// Context length before the timed step, for --verify-cost.
    #[arg(long, default_value_t = 128)]
    context_tokens: usize,
    /// A file of prompts, one per line (default: a few built-in ones).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Fixed DFlash block size (default: adapted to recent acceptance).
    #[arg(long)]
    block_size: Option<usize>,
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
    /// The tokens plain decoding generated (the last repeat).
    token_ids: Vec<u32>,
    /// Every step of plain decoding's last run, beside the modes' rounds.
    plain_rounds: Vec<RoundStats>,
    /// Speculation "dflash" (every round) and "auto" (the gate decides).
    #[serde(skip_serializing_if = "Option::is_none")]
    dflash: Option<SpecReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    auto: Option<SpecReport>,
}

#[derive(serde::Serialize)]
struct SpecReport {
    decode_tokens_per_second: f64,
    mean_accept_len: f64,
    /// tok/s over plain decoding's tok/s, measured side by side in this run.
    speedup: f64,
    /// The same over the last half of the repeats (an even count of them:
    /// both orders of the modes alike): where the gate ends up once it has
    /// calibrated and judged (its first probe is in the first half).
    end_speedup: f64,
    /// Every round of the last run: the metrics stream the app charts.
    rounds: Vec<RoundStats>,
    /// Every round of the first run, the prompt's first answer in this
    /// mode: beside `rounds`, where a cold cost per new shape shows.
    first_rounds: Vec<RoundStats>,
    /// The tokens of the last run (lossless: the same as plain decoding's).
    token_ids: Vec<u32>,
}

/// Keeps the rounds of a run.
#[derive(Default)]
struct RoundLog(Vec<RoundStats>);

impl Sink for RoundLog {
    fn round(&mut self, stats: &RoundStats) -> bool {
        self.0.push(stats.clone());
        true
    }
}

/// One mode's runs of a prompt: every run's totals, the tokens and rounds
/// of its last run and the rounds of its first.
#[derive(Default)]
struct ModeRuns {
    totals: Vec<Totals>,
    token_ids: Vec<u32>,
    rounds: Vec<RoundStats>,
    first_rounds: Vec<RoundStats>,
}

impl ModeRuns {
    fn record(&mut self, run: Generation, log: RoundLog) {
        if self.totals.is_empty() {
            self.first_rounds = log.0.clone();
        }
        self.totals.push(run.stats);
        self.token_ids = run.token_ids;
        self.rounds = log.0;
    }
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.block_size == Some(0) {
        anyhow::bail!("--block-size must be at least 1");
    }
    let backend = flashbar_mlx::device::activate()?;
    let dir = resolve_model(args.model.as_deref())?;
    if let Some(d) = args.drafter.as_deref().filter(|d| !d.is_dir()) {
        anyhow::bail!("drafter not found: {} is not a folder", d.display());
    }
    let engine = Engine::load(&dir, args.drafter.as_deref())?;
    // MLX's peak after each stage, to find what holds a run's peak
    // (docs/gpu.md, "Left to do": the peak memory).
    let peak_after_load = mlx_rs::memory::peak_memory()?;
    if args.verify_cost {
        if args.block < 1 || args.context_tokens < 1 {
            anyhow::bail!("--block and --context-tokens must be at least 1");
        }
        let cost =
            engine.measure_verify_cost(args.context_tokens, args.block, args.repeats.max(5))?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"model": dir, "device": backend, "verify_cost": cost})
            );
        } else {
            println!(
                "model {} on {backend}, context {} tokens\n\
                 decode 1 token: {:.3} ms | verify {} tokens (taps + tape): {:.3} ms | ratio {:.2}\n\
                 verify + rollback to {}: {:.3} ms | ratio {:.2}\n\
                 host part (graph built and queued): decode {:.3} ms | verify {:.3} ms\n\
                 of it, the graph built (before MLX queues it): decode {:.3} ms | verify {:.3} ms",
                dir.display(), cost.prompt_tokens, cost.decode_ms, cost.block, cost.verify_ms,
                cost.ratio, cost.block / 2, cost.verify_rollback_ms, cost.ratio_with_rollback,
                cost.decode_queued_ms, cost.verify_queued_ms, cost.decode_built_ms,
                cost.verify_built_ms
            );
            if let (Some(draft), Some(queued)) = (cost.draft_ms, cost.draft_queued_ms) {
                println!(
                    "draft {} tokens: {draft:.3} ms (host part {queued:.3} ms)",
                    cost.block
                );
            }
        }
        return Ok(());
    }
    let prompts: Vec<String> = match &args.prompts {
        Some(file) => std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.replace("\\n", "\n"))
            .collect(),
        None => BUILTIN_PROMPTS.iter().map(|p| p.to_string()).collect(),
    };
    let run_logged = |prompt: &str, max_tokens: usize, speculation, log: &mut RoundLog| {
        let mut request = GenerateRequest::new(Prompt::Text(prompt.to_owned()));
        request.max_tokens = max_tokens;
        request.speculation = speculation;
        request.block_size = args.block_size;
        engine.generate(&request, log)
    };
    let run_once = |prompt: &str, max_tokens: usize, speculation| {
        run_logged(prompt, max_tokens, speculation, &mut RoundLog::default())
    };
    run_once(&prompts[0], 8, Speculation::Off)?; // warm-up
    let peak_after_warmup = mlx_rs::memory::peak_memory()?;
    if engine.drafter().is_some() {
        run_once(&prompts[0], 8, Speculation::Dflash)?;
    }
    let mut reports = Vec::new();
    for prompt in &prompts {
        let (mut plain, mut fast, mut auto) = Default::default();
        // Interleaved, so drift (heat, other load) hits every mode alike,
        // and in an order that turns around every repeat (plain, DFlash,
        // auto; then auto, DFlash, plain): the first steps after a DFlash
        // run are slower (docs/performance.md, "The order of the modes"),
        // so plain decoding and auto each follow DFlash in half the repeats.
        let modes: &[Speculation] = if engine.drafter().is_some() {
            &[Speculation::Off, Speculation::Dflash, Speculation::Auto]
        } else {
            &[Speculation::Off]
        };
        for repeat in 0..args.repeats.max(1) {
            let order: Vec<Speculation> = if repeat % 2 == 0 {
                modes.to_vec()
            } else {
                modes.iter().rev().copied().collect()
            };
            for speculation in order {
                let mut log = RoundLog::default();
                let run = run_logged(prompt, args.max_tokens, speculation, &mut log)?;
                let runs: &mut ModeRuns = match speculation {
                    Speculation::Off => &mut plain,
                    Speculation::Dflash => &mut fast,
                    Speculation::Auto => &mut auto,
                };
                runs.record(run, log);
            }
        }
        let median_of = |runs: &[Totals], f: &dyn Fn(&Totals) -> f64| {
            let mut values: Vec<f64> = runs.iter().map(f).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let median = |f: &dyn Fn(&Totals) -> f64| median_of(&plain.totals, f);
        // Decode speed over all repeats (tokens after the first / time):
        // steadier than a median when runs of different modes interleave.
        let pooled = |runs: &[Totals]| {
            let tokens: usize = runs
                .iter()
                .map(|s| s.completion_tokens.saturating_sub(1))
                .sum();
            let seconds: f64 = runs.iter().map(|s| s.decode_seconds).sum();
            if seconds > 0.0 {
                tokens as f64 / seconds
            } else {
                0.0
            }
        };
        let plain_speed = pooled(&plain.totals);
        // The last repeats, an even count near half of them (2 of 3 to 5, 4
        // of 6 or 7), so they hold as many repeats of each order as of the
        // other; one repeat alone counts as its own last half.
        let last_half = |runs: &[Totals]| {
            let count = ((runs.len() / 2 + 1) & !1).min(runs.len()).max(1);
            pooled(&runs[runs.len() - count..])
        };
        let plain_end_speed = last_half(&plain.totals);
        let report = |runs: ModeRuns| {
            (!runs.totals.is_empty()).then(|| {
                let speed = pooled(&runs.totals);
                SpecReport {
                    decode_tokens_per_second: speed,
                    mean_accept_len: median_of(&runs.totals, &|s| s.mean_accept_len),
                    speedup: speed / plain_speed,
                    end_speedup: last_half(&runs.totals) / plain_end_speed,
                    rounds: runs.rounds,
                    first_rounds: runs.first_rounds,
                    token_ids: runs.token_ids,
                }
            })
        };
        let (dflash, auto) = (report(fast), report(auto));
        reports.push(PromptReport {
            prompt_tokens: plain.totals[0].prompt_tokens,
            completion_tokens: plain.totals[0].completion_tokens,
            prefill_tokens_per_second: median(&|s| s.prompt_tokens as f64 / s.prompt_seconds),
            decode_tokens_per_second: plain_speed,
            token_ids: plain.token_ids,
            plain_rounds: plain.rounds,
            dflash,
            auto,
        });
    }
    if args.json {
        let json = serde_json::json!({
            "model": dir,
            "device": backend,
            "prompts": reports,
            "peak_memory_bytes": mlx_rs::memory::peak_memory()?,
            "peak_memory_after_load_bytes": peak_after_load,
            "peak_memory_after_warmup_bytes": peak_after_warmup,
        });
        println!("{json}");
    } else {
        println!(
            "model {} on {backend}, peak memory {:.2} GB (after the load {:.2} GB, after a \
             plain warm-up answer {:.2} GB)",
            dir.display(),
            mlx_rs::memory::peak_memory()? as f64 / 1e9,
            peak_after_load as f64 / 1e9,
            peak_after_warmup as f64 / 1e9
        );
        for r in &reports {
            println!(
                "prompt {:>5} tok: prefill {:>9.1} tok/s | decode {:>3} tok: {:>8.1} tok/s",
                r.prompt_tokens,
                r.prefill_tokens_per_second,
                r.completion_tokens,
                r.decode_tokens_per_second
            );
            for (name, report) in [("dflash", &r.dflash), ("auto", &r.auto)] {
                if let Some(d) = report {
                    let dflash_rounds = d.rounds.iter().filter(|s| s.mode == Mode::Dflash).count();
                    println!(
                        "    {name:<6}: {:>8.1} tok/s, mean accept {:.2}, {dflash_rounds} of {} rounds drafted, \
                         {:.2}x plain ({:.2}x over the last half of the repeats)",
                        d.decode_tokens_per_second,
                        d.mean_accept_len,
                        d.rounds.len(),
                        d.speedup,
                        d.end_speedup
                    );
                }
            }
        }
    }
    Ok(())
}
