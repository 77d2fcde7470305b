//! A minimal `serve` for bench/soak.py when the full `flashbar` binary is
//! not built: the same Worker + Server over `Engine::load`, on the embedded
//! default pair, without the CLI's other commands (and their dependencies).
//!
//!     cargo run -p flashbar-server --example soak_server -- serve --port P [--queue N]
//!
//! Prints `listening on http://ADDR` like `flashbar serve`; SIGTERM ends it.

use flashbar_engine::Engine;
use flashbar_engine::Worker;
use flashbar_server::{Server, ServerOptions};
use std::path::PathBuf;
use std::sync::Arc;

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port: u16 = flag(&args, "--port").map_or(0, |p| p.parse().expect("--port"));
    let queue: usize = flag(&args, "--queue").map_or(64, |q| q.parse().expect("--queue"));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    let target = flag(&args, "--model").map_or(root.join("target"), PathBuf::from);
    let drafter = flag(&args, "--drafter").map_or(root.join("drafter"), PathBuf::from);
    let worker = Worker::spawn(queue, move || Engine::load(&target, Some(&drafter)))
        .unwrap_or_else(|e| {
            eprintln!("soak_server: {e}");
            std::process::exit(1)
        });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let options = ServerOptions {
            addr: format!("127.0.0.1:{port}").parse().expect("address"),
            ..ServerOptions::default()
        };
        let mut server = Server::start(Arc::new(worker), "default", options)
            .await
            .expect("start");
        println!("listening on http://{}", server.local_addr());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal");
        tokio::select! {
            _ = term.recv() => server.stop().await,
            () = server.wait() => {}
        }
    });
}
