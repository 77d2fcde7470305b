//! A `flashbar serve` child process and plain HTTP/1.1 over a TCP socket,
//! shared by the tests that kill or starve a real server.

// Each test binary uses a different part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub fn models() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default")
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

/// A started server, SIGKILLed when dropped.
pub struct Serve {
    pub child: Child,
    pub port: u16,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `flashbar serve --port PORT ARGS` and waits (up to a minute) for
/// its `listening on` line; Err(stderr) when it exits first.
pub fn serve(port: u16, args: &[&str], env: &[(&str, &str)]) -> Result<Serve, String> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flashbar"));
    command
        .args(["serve", "--port", &port.to_string()])
        .args(args)
        .env("FLASHBAR_DEVICE", "cpu")
        .env_remove("FLASHBAR_MEMORY_BUDGET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    if line.starts_with("listening on http://") {
        return Ok(Serve { child, port });
    }
    let _ = child.kill();
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    Err(String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A request sent; the socket, to read the answer from.
pub fn send(port: u16, method: &str, path: &str, body: &str) -> TcpStream {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    write!(
        socket,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket
}

/// (status, body) of a whole answer.
pub fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut socket = send(port, method, path, body);
    let mut text = String::new();
    socket.read_to_string(&mut text).unwrap();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A chat request body with one user message.
pub fn chat(content: &str, max_tokens: usize, stream: bool) -> String {
    serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
    .to_string()
}
