//! `flashbar generate`: one completion of a prompt, streamed to stdout or
//! printed as one JSON object.

use crate::models::resolve_pair;
use anyhow::bail;
use flashbar_engine::{
    Commit, Engine, GenerateRequest, Message, Prompt, SamplingParams, Sink, Speculation,
};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Target model: a local folder (default: the embedded model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// DFlash drafter folder (default: the embedded drafter, with no --model).
    #[arg(long)]
    drafter: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    speculation: SpeculationArg,
    /// Tokens per DFlash verify (default: the drafter's block size).
    #[arg(long)]
    block_size: Option<usize>,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Treat PROMPT as a user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object with the text, token ids and stats.
    #[arg(long)]
    json: bool,
    prompt: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SpeculationArg {
    Auto,
    Dflash,
    Off,
}

/// Writes text deltas to stdout as they come; a closed pipe (`| head`)
/// stops the generation at the next token. A thinking model's reasoning
/// (`--chat`, docs/thinking-and-tools.md) goes to stderr, so stdout holds
/// only the answer.
struct StdoutSink;

impl Sink for StdoutSink {
    fn commit(&mut self, commit: &Commit) -> bool {
        if !commit.reasoning.is_empty() {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(commit.reasoning.as_bytes());
            let _ = err.flush();
        }
        if commit.text.is_empty() {
            return true;
        }
        let mut out = std::io::stdout().lock();
        out.write_all(commit.text.as_bytes())
            .and_then(|()| out.flush())
            .is_ok()
    }
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if args.block_size == Some(0) {
        bail!("--block-size must be at least 1");
    }
    let (target, drafter) = resolve_pair(args.model.as_deref(), args.drafter.as_deref())?;
    let engine = Engine::load(&target, drafter.as_deref())?;
    let prompt = if args.chat {
        Prompt::Messages(vec![Message::new("user", args.prompt)])
    } else {
        Prompt::Text(args.prompt)
    };
    let mut request = GenerateRequest::new(prompt);
    request.max_tokens = args.max_tokens;
    request.stop = args.stop;
    request.block_size = args.block_size;
    request.speculation = match args.speculation {
        SpeculationArg::Auto => Speculation::Auto,
        SpeculationArg::Dflash => Speculation::Dflash,
        SpeculationArg::Off => Speculation::Off,
    };
    request.sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        seed: args.seed,
    };
    if args.json {
        let result = engine.generate(&request, &mut flashbar_engine::NullSink)?;
        let s = &result.stats;
        let json = serde_json::json!({
            "text": result.text,
            "reasoning": result.reasoning,
            "token_ids": result.token_ids,
            "finish_reason": result.finish_reason,
            "stats": {
                "mode": s.mode,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "reasoning_tokens": s.reasoning_tokens,
                "rounds": s.rounds,
                "accepted_tokens": s.accepted_tokens,
                "mean_accept_len": s.mean_accept_len,
                "tokens_per_second": s.tokens_per_second,
            }
        });
        println!("{json}");
    } else {
        engine.generate(&request, &mut StdoutSink)?;
        // A reader that went away (`| head`) is not an error.
        let _ = writeln!(std::io::stdout());
    }
    Ok(())
}
