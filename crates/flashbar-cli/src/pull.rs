//! `flashbar pull`: download a model (or a catalogue pair: target and its
//! drafter) from the Hugging Face hub or a mirror into the local store, with
//! progress on stderr; Ctrl-C cancels and keeps what arrived for a resume.

use anyhow::{bail, Context};
use flashbar_hub::catalogue::{Found, RepoSpec};
use flashbar_hub::{CancelToken, Catalogue, HubConfig, PullEvent, PullRequest, Store};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct PullArgs {
    /// A hub repo id (owner/name) or a catalogue id (see `flashbar models`).
    repo_id: String,
    /// Branch, tag or commit (default: the catalogue's, else main).
    #[arg(long)]
    revision: Option<String>,
    /// Hub or mirror URL (default: $HF_ENDPOINT, else https://huggingface.co).
    #[arg(long)]
    endpoint: Option<String>,
    /// The store to download into, an HF cache folder (default: $HF_HUB_CACHE,
    /// else $HF_HOME/hub, else ~/.cache/huggingface/hub).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Send your HF token to a non-official endpoint too.
    #[arg(long)]
    send_token_to_mirror: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: PullArgs) -> anyhow::Result<()> {
    let mut config = HubConfig::from_env();
    if let Some(endpoint) = &args.endpoint {
        check_endpoint_url(endpoint)?;
        config = config.with_endpoint(endpoint);
    }
    if let Some(dir) = &args.dir {
        config = config.with_store(Store::new(dir));
    }
    config.send_token_to_mirror = args.send_token_to_mirror;
    let mut requests = requests_for(&args.repo_id)?;
    if let Some(revision) = &args.revision {
        for request in &mut requests {
            request.revision = revision.clone();
        }
    }
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let cancel = CancelToken::new();
    let on_ctrl_c = cancel.clone();
    runtime.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    let printer = Printer::new();
    let mut pulled = Vec::new();
    for request in &requests {
        let on_event = |event: &PullEvent| printer.show(event);
        let result = runtime.block_on(flashbar_hub::pull(&config, request, &on_event, &cancel));
        printer.finish_line();
        pulled.push(result.with_context(|| format!("pull {}", request.repo))?);
    }
    if let [target, drafter] = pulled.as_slice() {
        // A pair was pulled: say now, not at load time, if it cannot run here.
        let report = flashbar_hub::doctor::diagnose(&target.snapshot, Some(&drafter.snapshot));
        match report.first_failure() {
            None => eprintln!("doctor: the pair is usable here"),
            Some(failure) => eprintln!("doctor: {failure} (see flashbar doctor)"),
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&pulled)?);
    } else {
        for repo in &pulled {
            println!(
                "{} {} -> {}",
                repo.repo,
                repo.commit,
                repo.snapshot.display()
            );
        }
    }
    Ok(())
}

/// A pair id pulls the target and its default drafter; a drafter id, the
/// drafter; anything else is taken as a hub repo id.
fn requests_for(name: &str) -> anyhow::Result<Vec<PullRequest>> {
    let from_spec = |spec: &RepoSpec| -> anyhow::Result<PullRequest> {
        match spec.pull_request() {
            Some(request) => Ok(request),
            None => bail!(
                "{} is embedded in Flashbar; there is nothing to pull",
                spec.id
            ),
        }
    };
    match Catalogue::builtin().find(name) {
        Some(Found::Target(pair)) => {
            let mut requests = vec![from_spec(&pair.target)?];
            if let Some(drafter) = pair.drafters.first() {
                requests.push(from_spec(drafter)?);
            }
            Ok(requests)
        }
        Some(Found::Drafter(_, drafter)) => Ok(vec![from_spec(drafter)?]),
        None => Ok(vec![PullRequest::new(name)]),
    }
}

fn check_endpoint_url(endpoint: &str) -> anyhow::Result<()> {
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        bail!("--endpoint {endpoint:?} is not an http(s) URL");
    }
    Ok(())
}

/// Progress on stderr: a redrawn line on a terminal, a line per file otherwise.
struct Printer {
    terminal: bool,
    last: Mutex<Option<Instant>>,
}

impl Printer {
    fn new() -> Self {
        Printer {
            terminal: std::io::stderr().is_terminal(),
            last: Mutex::new(None),
        }
    }

    fn show(&self, event: &PullEvent) {
        let mut err = std::io::stderr().lock();
        match event {
            PullEvent::Resolved {
                repo,
                commit,
                files,
                total_bytes,
                to_download_bytes,
                ..
            } => {
                let _ = writeln!(
                    err,
                    "{repo} @ {}: {files} files, {}, {} to download",
                    &commit[..commit.len().min(12)],
                    human(*total_bytes),
                    human(*to_download_bytes)
                );
            }
            PullEvent::Progress(p) if self.terminal => {
                let mut last = self.last.lock().unwrap();
                if last.is_some_and(|t| t.elapsed() < Duration::from_millis(200)) {
                    return;
                }
                *last = Some(Instant::now());
                let percent = 100.0 * p.done_bytes as f64 / p.total_bytes.max(1) as f64;
                let eta = p.eta_seconds.map_or("?".into(), |s| format!("{s:.0}s"));
                let _ = write!(
                    err,
                    "\r\x1b[2K{percent:5.1}% {} of {}  {}/s  ETA {eta}  {}",
                    human(p.done_bytes),
                    human(p.total_bytes),
                    human(p.bytes_per_second as u64),
                    p.file
                );
            }
            PullEvent::Retrying {
                file,
                attempt,
                wait_ms,
                reason,
            } => {
                let clear = if self.terminal { "\r\x1b[2K" } else { "" };
                let what = if file.is_empty() {
                    String::new()
                } else {
                    format!(" of {file}")
                };
                let _ = writeln!(
                    err,
                    "{clear}retry {attempt}{what} in {wait_ms} ms: {reason}"
                );
            }
            PullEvent::FileDone {
                file,
                size,
                sha256_checked,
            } if !self.terminal => {
                let check = if *sha256_checked {
                    "sha256 ok"
                } else {
                    "size ok"
                };
                let _ = writeln!(err, "{file}: {} ({check})", human(*size));
            }
            _ => {}
        }
    }

    fn finish_line(&self) {
        if self.terminal {
            eprint!("\r\x1b[2K");
        }
    }
}

pub use flashbar_hub::error::human_bytes as human;
