//! Each limit of [`Limits`], tested over real TCP sockets against a started
//! [`Server`]: oversized bodies and heads, clients that send their head or
//! body too slowly (slowloris), idle connections, the connection cap, and
//! that the server keeps serving others through all of it.

use crate::limits::Limits;
use crate::server::{Server, ServerOptions};
use flashbar_engine::worker::echo::echo_worker;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn small_limits() -> Limits {
    Limits {
        max_body_bytes: 64 << 10,
        max_header_bytes: 8 << 10,
        max_headers: 16,
        header_timeout: Duration::from_millis(800),
        body_timeout: Duration::from_millis(800),
        max_connections: 4,
    }
}

async fn start(limits: Limits) -> Server {
    let options = ServerOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        limits,
        ..ServerOptions::default()
    };
    Server::start(Arc::new(echo_worker(4, 0)), "echo", options)
        .await
        .unwrap()
}

/// Everything the server sends until it closes (or `wait` passes).
async fn read_all(socket: &mut TcpStream, wait: Duration) -> String {
    let mut out = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buffer[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the server closed the socket within `wait`.
async fn closed_within(socket: &mut TcpStream, wait: Duration) -> bool {
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// One plain request on a fresh connection: the status and the body.
async fn request(addr: SocketAddr, raw: &str) -> (u16, String) {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    let text = read_all(&mut socket, Duration::from_secs(5)).await;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn post(body: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn healthy(addr: SocketAddr) -> bool {
    let (status, text) = request(
        addr,
        "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    status == 200 && text.contains("\"status\":\"ok\"")
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_json() {
    let server = start(small_limits()).await;
    let addr = server.local_addr();
    let ok = r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1}"#;
    assert_eq!(request(addr, &post(ok)).await.0, 200);
    // Declared too long: refused before the body is read.
    let big = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(100 << 10)
    );
    let (status, text) = request(addr, &post(&big)).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("\"request_too_large\""), "{text}");
    // Chunked, no length declared: cut when the limit is passed.
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 16 << 10, "y".repeat(16 << 10));
    for _ in 0..6 {
        if socket.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let text = read_all(&mut socket, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("\"error\""), "{text}");
    assert!(healthy(addr).await);
    server.stop().await;
}

#[tokio::test]
async fn heads_over_the_limits_are_431() {
    let server = start(small_limits()).await;
    let addr = server.local_addr();
    let long = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(16 << 10)
    );
    assert_eq!(request(addr, &long).await.0, 431);
    let many: String = (0..40).map(|i| format!("x-h{i}: v\r\n")).collect();
    let many = format!("GET /health HTTP/1.1\r\nhost: x\r\n{many}\r\n");
    assert_eq!(request(addr, &many).await.0, 431);
    assert!(healthy(addr).await);
    server.stop().await;
}

#[tokio::test]
async fn a_head_sent_byte_by_byte_is_cut_off() {
    let server = start(small_limits()).await;
    let addr = server.local_addr();
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    // A head that never ends: one byte every 100 ms.
    let mut cut = false;
    for byte in "GET /health HTTP/1.1\r\nx-slow: "
        .bytes()
        .chain(std::iter::repeat(b'a'))
    {
        if socket.write_all(&[byte]).await.is_err() {
            cut = true;
            break;
        }
        if closed_within(&mut socket, Duration::from_millis(100)).await {
            cut = true;
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never cut off");
    }
    assert!(cut);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(700), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(healthy(addr).await);
    server.stop().await;
}

#[tokio::test]
async fn an_idle_connection_is_closed() {
    let server = start(small_limits()).await;
    let mut socket = TcpStream::connect(server.local_addr()).await.unwrap();
    assert!(closed_within(&mut socket, Duration::from_secs(3)).await);
    server.stop().await;
}

#[tokio::test]
async fn a_body_that_never_completes_is_408() {
    let server = start(small_limits()).await;
    let addr = server.local_addr();
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    // Trickle a byte every 100 ms: each arrives well inside any per-read
    // timeout, but the whole body never does.
    let mut text = String::new();
    for _ in 0..50 {
        if socket.write_all(b" ").await.is_err() {
            break;
        }
        let mut buffer = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(100), socket.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                text.push_str(&String::from_utf8_lossy(&buffer[..n]));
                break;
            }
            Err(_) => {}
        }
    }
    let took = started.elapsed();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"request_timeout\""), "{text}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(healthy(addr).await);
    server.stop().await;
}

#[tokio::test]
async fn connections_past_the_cap_wait_for_a_free_slot() {
    let limits = Limits {
        header_timeout: Duration::from_secs(2),
        ..small_limits()
    };
    let server = start(limits).await;
    let addr = server.local_addr();
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // All slots are held: a fifth client is not served yet...
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    fifth
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let early = read_all(&mut fifth, Duration::from_millis(500)).await;
    assert!(early.is_empty(), "{early}");
    // ...and is once the idle ones are closed for their timeout.
    let late = read_all(&mut fifth, Duration::from_secs(5)).await;
    assert!(late.starts_with("HTTP/1.1 200"), "{late}");
    server.stop().await;
}

#[tokio::test]
async fn a_wrong_key_is_401_over_tcp() {
    let options = ServerOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        api_key: Some("sk-right".into()),
        ..ServerOptions::default()
    };
    let server = Server::start(Arc::new(echo_worker(4, 0)), "echo", options)
        .await
        .unwrap();
    let addr = server.local_addr();
    let get = |key: &str| {
        format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\nconnection: close\r\n\r\n")
    };
    assert_eq!(request(addr, &get("sk-wrong")).await.0, 401);
    assert_eq!(request(addr, &get("sk-righ")).await.0, 401);
    assert_eq!(request(addr, &get("sk-right")).await.0, 200);
    server.stop().await;
}
