//! `flashbar doctor`: can this model (and drafter) be used here, and if not,
//! why: complete folders, the loader's checks, the drafter's fit, memory.

use crate::models::resolve_pair;
use anyhow::bail;
use flashbar_hub::doctor::Status;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Target model: a folder or a catalogue id (default: the embedded model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// DFlash drafter: a folder or a catalogue id.
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Print the findings as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let (dir, drafter) = resolve_pair(args.model.as_deref(), args.drafter.as_deref())?;
    let report = flashbar_hub::doctor::diagnose(&dir, drafter.as_deref());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("model: {}", dir.display());
        if let Some(drafter) = &drafter {
            println!("drafter: {}", drafter.display());
        }
        for check in &report.checks {
            let status = match check.status {
                Status::Ok => "ok",
                Status::Fail => "FAIL",
                Status::Unknown => "?",
            };
            println!("{:<14} {:<4} {}", check.name, status, check.detail);
        }
    }
    match report.first_failure() {
        Some(failure) => bail!("{failure}"),
        None => Ok(()),
    }
}
