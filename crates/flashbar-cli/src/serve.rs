//! `flashbar serve`: the local OpenAI-compatible endpoint over one loaded
//! model (the embedded pair by default). Prints `listening on http://ADDR`
//! once ready; Ctrl-C (or SIGTERM) shuts it down gracefully.

use crate::models::resolve_pair;
use anyhow::{bail, Context};
use flashbar_engine::Engine;
use flashbar_engine::Worker;
use flashbar_server::{Server, ServerOptions, DEFAULT_HOST, DEFAULT_PORT};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Target model: a local folder (default: the embedded model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// DFlash drafter folder (default: the embedded drafter, with no --model).
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = DEFAULT_HOST)]
    host: IpAddr,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key: KEY`).
    #[arg(long)]
    api_key: Option<String>,
    /// Allow browser calls from this origin (repeatable; `*` for any).
    /// Without it CORS is off.
    #[arg(long = "cors-origin")]
    cors_origins: Vec<String>,
    /// Requests that may wait for the model before 429.
    #[arg(long, default_value_t = flashbar_engine::DEFAULT_QUEUE_CAPACITY)]
    queue: usize,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.queue == 0 {
        bail!("--queue must be at least 1");
    }
    if args.api_key.as_deref() == Some("") {
        bail!("--api-key must not be empty");
    }
    let addr = SocketAddr::new(args.host, args.port);
    // A busy port is reported before the (possibly long) model load.
    if args.port != 0 {
        if let Err(error) = std::net::TcpListener::bind(addr) {
            if error.kind() == std::io::ErrorKind::AddrInUse {
                bail!("{}", flashbar_server::ServerError::PortBusy(addr));
            }
            bail!("cannot listen on {addr}: {error}");
        }
    }
    let (target, drafter) = resolve_pair(args.model.as_deref(), args.drafter.as_deref())?;
    let model_id = flashbar_hub::resolve::model_id(&target);
    // On this (still single) thread first: it may set MLX_ENABLE_TF32,
    // which must happen before other threads exist; Engine::load then
    // activates the engine's own thread.
    flashbar_mlx::device::activate()?;
    let worker = Worker::spawn(args.queue, move || -> anyhow::Result<Engine> {
        Ok(Engine::load(&target, drafter.as_deref())?)
    })?;
    let options = ServerOptions {
        addr,
        api_key: args.api_key,
        cors_origins: args.cors_origins,
        ..ServerOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut server = Server::start(Arc::new(worker), model_id, options).await?;
        println!("listening on http://{}", server.local_addr());
        let _ = std::io::stdout().flush();
        tokio::select! {
            () = shutdown_signal() => {
                eprintln!("flashbar: shutting down");
                server.stop().await;
            }
            () = server.wait() => bail!("the server stopped unexpectedly"),
        }
        Ok(())
    })
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
