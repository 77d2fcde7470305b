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
