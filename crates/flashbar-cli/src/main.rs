//! `flashbar`: the command line over Flashbar's engine.
//!
//! Every failure ends as one line on stderr and a non-zero exit status.

mod bench;
mod doctor;
mod generate;
mod logging;
mod models;
mod models_cmd;
mod pull;
mod serve;
mod smoke;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "flashbar",
    version,
    about = "Local LLMs, made faster with DFlash"
)]
struct Cli {
    /// Log to stderr at this level (error, warn, info, debug, trace) or
    /// filter (`info,flashbar_hub=debug`); default RUST_LOG, else warn.
    /// `serve --log-level info` prints one line per request.
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Complete a prompt with a model (the embedded one by default).
    Generate(generate::GenerateArgs),
    /// Serve the model over a local OpenAI-compatible HTTP endpoint.
    Serve(serve::ServeArgs),
    /// Check that a model can be used, and say why not.
    Doctor(doctor::DoctorArgs),
    /// Download a model (or a catalogue pair) from the Hugging Face hub.
    Pull(pull::PullArgs),
    /// List the catalogue and the downloaded models, with disk usage.
    Models(models_cmd::ModelsArgs),
    /// Measure prefill and decode speed on a model.
    Bench(bench::BenchArgs),
    /// Check that MLX computes correctly here, on every device it offers.
    Smoke(smoke::SmokeArgs),
}

fn main() -> ExitCode {
    // A bug must still end as one line for the user, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        let first_line = message.lines().next().unwrap_or_default();
        eprintln!("flashbar: internal error: {first_line}");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print as usual; a bad flag is one line.
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            let rendered = error.to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            eprintln!(
                "flashbar: {} (see flashbar --help)",
                first.trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    if let Err(error) = logging::init(cli.log_level.as_deref()) {
        eprintln!("flashbar: {error}");
        return ExitCode::from(2);
    }
    let outcome = match cli.command {
        Command::Generate(args) => generate::run(args).map(|()| ExitCode::SUCCESS),
        Command::Serve(args) => serve::run(args).map(|()| ExitCode::SUCCESS),
        Command::Doctor(args) => doctor::run(args).map(|()| ExitCode::SUCCESS),
        Command::Pull(args) => pull::run(args).map(|()| ExitCode::SUCCESS),
        Command::Models(args) => models_cmd::run(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::run(args).map(|()| ExitCode::SUCCESS),
        Command::Smoke(args) => smoke::run(args),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("flashbar: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each said once: a cause whose text
/// the message before it already holds (an error type that prints its
/// source in its own message) is not repeated. anyhow's `{:#}` repeats it:
/// "x.incomplete: No space left on device (os error 28): No space left on
/// device (os error 28)" (docs/reliability.md, "Disk full").
fn one_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;

    /// An error that prints its source in its own message too.
    #[derive(Debug)]
    struct Echoes {
        path: String,
        source: std::io::Error,
    }

    impl std::fmt::Display for Echoes {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}: {}", self.path, self.source)
        }
    }

    impl std::error::Error for Echoes {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let io = std::io::Error::from_raw_os_error(28);
        let error = anyhow::Error::new(Echoes {
            path: "x.incomplete".into(),
            source: io,
        })
        .context("pull a/b");
        let line = one_line(&error);
        assert_eq!(line.matches("os error 28").count(), 1, "{line}");
        assert!(line.starts_with("pull a/b: x.incomplete: "), "{line}");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&plain), "outer: inner");
    }
}
