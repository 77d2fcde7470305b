//! A local stand-in for the Hugging Face hub, for the app's end-to-end test
//! (tests/e2e/run.sh): serves folders as repos over the hub's file protocol
//! with the integration tests' fake hub (`tests/common/fake_hub.rs`:
//! listing, resolve with etag / x-repo-commit / sizes, Range requests),
//! each 16 KiB chunk delayed so a download's progress can be watched.
//!
//! Usage: `fake_hub_server [--chunk-delay-ms N] OWNER/NAME=DIR...`; prints
//! `listening on http://127.0.0.1:PORT`, then serves until killed.

#[path = "../tests/common/fake_hub.rs"]
mod fake_hub;

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut delay = Duration::ZERO;
    let mut repos = HashMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--chunk-delay-ms" {
            let ms = args.next().and_then(|v| v.parse().ok());
            delay = Duration::from_millis(
                ms.unwrap_or_else(|| fail("--chunk-delay-ms needs a number")),
            );
            continue;
        }
        let Some((repo, dir)) = arg.split_once('=') else {
            fail(&format!("{arg:?}: expected OWNER/NAME=DIR"));
        };
        if !std::path::Path::new(dir).is_dir() {
            fail(&format!("{dir} is not a folder"));
        }
        // A stable commit id per repo name.
        let commit = hex::encode(Sha256::digest(repo.as_bytes()))[..40].to_owned();
        repos.insert(
            repo.to_owned(),
            fake_hub::repo_from_dir(dir.as_ref(), &commit),
        );
    }
    if repos.is_empty() {
        fail("usage: fake_hub_server [--chunk-delay-ms N] OWNER/NAME=DIR...");
    }
    let hub = fake_hub::FakeHub::start(repos).await;
    hub.set_faults(fake_hub::Faults {
        chunk_delay: (!delay.is_zero()).then_some(delay),
        ..fake_hub::Faults::default()
    });
    println!("listening on {}", hub.url);
    std::future::pending::<()>().await;
}

fn fail(message: &str) -> ! {
    eprintln!("fake_hub_server: {message}");
    std::process::exit(2);
}
