//! `flashbar models`: the catalogue (with what is downloaded) and every model
//! in the local store with its disk usage; `--delete` frees one.

use crate::pull::human;
use flashbar_hub::{Catalogue, Store};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ModelsArgs {
    /// The store to look in (default: the HF cache, as for `flashbar pull`).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Remove this repo (owner/name) from the store.
    #[arg(long, value_name = "REPO_ID")]
    delete: Option<String>,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let store = args.dir.map(Store::new).unwrap_or_else(Store::from_env);
    if let Some(repo) = &args.delete {
        let freed = store.delete(repo)?;
        println!("deleted {repo}: {} freed", human(freed));
        return Ok(());
    }
    let catalogue = Catalogue::builtin();
    let local = store.list()?;
    if args.json {
        let value = serde_json::json!({
            "store": store.root(),
            "catalogue": catalogue.pairs,
            "local": local,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("catalogue:");
    for pair in &catalogue.pairs {
        println!(
            "  {:<24} {} (needs ~{} memory)",
            pair.id,
            pair.name,
            human(pair.memory_bytes)
        );
        for (role, spec) in std::iter::once(("target", &pair.target))
            .chain(pair.drafters.iter().map(|d| ("drafter", d)))
        {
            let status = match (&spec.repo, &spec.embedded) {
                (Some(repo), _) => match store.snapshot_dir(repo, &spec.revision) {
                    Some(_) => "downloaded".to_owned(),
                    None => format!("flashbar pull {}", spec.id),
                },
                _ => "embedded".to_owned(),
            };
            let name = spec.repo.as_deref().unwrap_or("models/default");
            println!(
                "    {role:<8} {name:<40} ~{:<10} {status}",
                human(spec.size_bytes)
            );
        }
    }
    println!("store: {}", store.root().display());
    if local.is_empty() {
        println!("  (empty)");
    }
    for repo in &local {
        let partial = if repo.incomplete_bytes > 0 {
            format!(", {} of unfinished downloads", human(repo.incomplete_bytes))
        } else {
            String::new()
        };
        println!("  {:<48} {}{partial}", repo.repo, human(repo.size_bytes));
        for snapshot in &repo.snapshots {
            let refs = if snapshot.refs.is_empty() {
                String::new()
            } else {
                format!(" ({})", snapshot.refs.join(", "))
            };
            let missing = if snapshot.missing_files > 0 {
                format!(", {} missing", snapshot.missing_files)
            } else {
                String::new()
            };
            println!(
                "    {}{refs}: {} files{missing}",
                &snapshot.commit[..snapshot.commit.len().min(12)],
                snapshot.files
            );
        }
    }
    Ok(())
}
