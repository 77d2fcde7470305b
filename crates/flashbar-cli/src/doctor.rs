//! `flashbar doctor`: can this model be used here, and if not, why.

use crate::models::resolve_pair;
use anyhow::bail;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Target model folder (default: the embedded model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// DFlash drafter folder.
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Print the findings as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let (dir, drafter) = resolve_pair(args.model.as_deref(), args.drafter.as_deref())?;
    let mut findings = flashbar_engine::doctor::check_target(&dir);
    if let Some(drafter) = &drafter {
        findings.push(flashbar_engine::doctor::check_drafter(&dir, drafter));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&findings)?);
    } else {
        println!("model: {}", dir.display());
        for f in &findings {
            println!(
                "{:<14} {:<4} {}",
                f.check,
                if f.ok { "ok" } else { "FAIL" },
                f.detail
            );
        }
    }
    match findings.iter().find(|f| !f.ok) {
        Some(failed) => bail!("{}: {}", failed.check, failed.detail),
        None => Ok(()),
    }
}
