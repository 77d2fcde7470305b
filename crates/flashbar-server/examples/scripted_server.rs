//! The HTTP server over the scripted stand-in model
//! (`flashbar_engine::worker::echo::ScriptedBackend`), for the Python
//! tests of reasoning and tool calls through the official OpenAI client
//! (tests/python/test_thinking_and_tools.py): the embedded model writes
//! neither, so these test our parsing and protocol, not a model.
//!
//! `scripted_server SCRIPT.json`: the script maps the content of a chat's
//! last message to the reply ("" for any other chat). Prints
//! `listening on http://ADDR` (a free port) and serves until Ctrl-C.

use flashbar_engine::worker::echo::scripted_worker;
use flashbar_server::{Server, ServerOptions};
use std::io::Write;
use std::sync::Arc;

fn main() {
    if let Err(error) = run() {
        eprintln!("scripted_server: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: scripted_server SCRIPT.json")?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let script: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let mut replies = Vec::with_capacity(script.len());
    for (key, reply) in script {
        let reply = reply
            .as_str()
            .ok_or_else(|| format!("{path}: the reply to {key:?} is not a string"))?;
        replies.push((key, reply.to_owned()));
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let options = ServerOptions {
            addr: ([127, 0, 0, 1], 0).into(),
            ..ServerOptions::default()
        };
        let worker = Arc::new(scripted_worker(replies, 3));
        let mut server = Server::start(worker, "scripted", options)
            .await
            .map_err(|e| e.to_string())?;
        println!("listening on http://{}", server.local_addr());
        let _ = std::io::stdout().flush();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => server.stop().await,
            () = server.wait() => return Err("the server stopped unexpectedly".to_owned()),
        }
        Ok(())
    })
}
