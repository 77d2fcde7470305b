//! `flashbar`: the command line over Flashbar's engine.
//!
//! Every failure ends as one line on stderr and a non-zero exit status.

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Smoke(args) => smoke::run(args),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("flashbar: {error:#}");
            ExitCode::FAILURE
        }
    }
}
