//! Load on a real `flashbar serve` (the binary, on the embedded model, on
//! a real TCP port): 100 concurrent streaming clients, a third of them
//! hanging up at points chosen by a fixed seed (before reading anything,
//! or after the k-th streamed event). Every other stream completes with the
//! same text a lone request gets, the queue never holds more than its
//! bound (`/health`'s `queued` and `queued_peak`), `/health` answers
//! throughout, and MLX's active memory returns to its idle floor
//! (docs/reliability.md, "Load").

mod serve_common;

use serde_json::Value;
use serve_common::{free_port, request, send, serve};
use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 100;
const QUEUE: usize = 64;
/// Short answers keep 100 of them quick on a CPU in a debug build; the
/// hang-up points still fall before, inside and after the stream.
const MAX_TOKENS: usize = 4;
const PROMPTS: [&str; 4] = [
    "def add(a, b):",
    "Write a loop.",
    "import os",
    "class Point:",
];

/// Where a client hangs up: `None` reads to the end.
fn hang_up_points() -> Vec<Option<usize>> {
    // xorshift from a fixed seed: the same plan on every machine.
    let mut state = 0x0123_4567_89ab_cdefu64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..CLIENTS)
        .map(|i| {
            let r = next();
            // Every third client: 0 (right after sending) up to MAX_TOKENS
            // events (about the end of the stream).
            (i % 3 == 0).then(|| (r % (MAX_TOKENS as u64 + 1)) as usize)
        })
        .collect()
}

/// A `/v1/completions` body. (Completions rather than chat: in a debug
/// build rendering the chat template costs about 0.35 s a request here,
/// which would make most of this test's time and test nothing more.)
/// Speculation is forced to DFlash, so the path each request takes does not
/// depend on measured round times (with `auto` the gate decides from them),
/// and the reference requests warm the very path every client takes.
fn completion(prompt: &str, stream: bool) -> String {
    serde_json::json!({
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
        "speculation": "dflash",
    })
    .to_string()
}

fn health(port: u16) -> Value {
    let (status, body) = request(port, "GET", "/health", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// What one client saw.
#[derive(Debug)]
enum Seen {
    /// The whole stream: its text, and how many 429s it met first.
    Completed {
        text: String,
        refused: usize,
    },
    HungUp,
}

/// One streaming client: retries while the queue is full (429), then reads
/// the stream to `[DONE]`, or hangs up after `hang_up` events.
fn client(port: u16, prompt: &str, hang_up: Option<usize>) -> Seen {
    let body = completion(prompt, true);
    let mut refused = 0;
    loop {
        let socket = send(port, "POST", "/v1/completions", &body);
        if hang_up == Some(0) {
            return Seen::HungUp; // dropped: closed before any answer
        }
        let mut reader = BufReader::new(socket);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).unwrap();
        if status_line.contains(" 429 ") {
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            refused += 1;
            // As a client told 429 should: back off, then ask again.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert!(status_line.contains(" 200 "), "{status_line}");
        let mut text = String::new();
        let mut events = 0;
        let mut finished = false;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap() == 0 {
                panic!("the stream ended without [DONE] after {events} events: {text:?}");
            }
            let Some(data) = line.trim_end().strip_prefix("data: ") else {
                continue; // headers, chunk sizes, blank separators
            };
            if data == "[DONE]" {
                assert!(finished, "[DONE] before a finish_reason");
                return Seen::Completed { text, refused };
            }
            let chunk: Value = serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("an event that is not JSON ({e}): {data}"));
            let choice = &chunk["choices"][0];
            if let Some(delta) = choice["text"].as_str() {
                text.push_str(delta);
            }
            if choice["finish_reason"].is_string() {
                finished = true;
            }
            events += 1;
            if hang_up == Some(events) {
                return Seen::HungUp; // reader (and socket) dropped mid-stream
            }
        }
    }
}

/// The whole answer of a lone, non-streamed request.
fn reference(port: u16, prompt: &str) -> String {
    let (status, body) = request(port, "POST", "/v1/completions", &completion(prompt, false));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    answer["choices"][0]["text"].as_str().unwrap().to_owned()
}

fn active_bytes(health: &Value) -> u64 {
    health["memory"]["active_bytes"].as_u64().unwrap()
}

/// The server's resident memory (Linux), for the report only.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_hundred_streaming_clients_a_third_hanging_up() {
    let port = free_port();
    let server = serve(port, &["--queue", &QUEUE.to_string()], &[]).unwrap();
    // Each prompt once alone: the texts every stream must match, and MLX's
    // one-time allocations made, so what is left is the idle floor.
    let expected: Vec<String> = PROMPTS.iter().map(|p| reference(port, p)).collect();
    let idle = health(port);
    let idle_active = active_bytes(&idle);
    let idle_rss = rss_kib(server.child.id());

    // /health, asked again and again while the load runs.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut answers = 0usize;
            let mut busy_seen = false;
            while !stop.load(Ordering::SeqCst) {
                let h = health(port);
                let queued = h["queued"].as_u64().unwrap() as usize;
                assert!(queued <= QUEUE, "queued {queued} > {QUEUE}: {h}");
                busy_seen |= h["busy"] == true;
                answers += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
            (answers, busy_seen)
        })
    };

    let plan = hang_up_points();
    let clients: Vec<_> = plan
        .iter()
        .enumerate()
        .map(|(i, &hang_up)| {
            let prompt = PROMPTS[i % PROMPTS.len()];
            std::thread::spawn(move || client(port, prompt, hang_up))
        })
        .collect();
    let seen: Vec<Seen> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    let (answers, busy_seen) = poller.join().unwrap();

    let mut completed = 0;
    let mut refused_total = 0;
    for (i, (seen, hang_up)) in seen.iter().zip(&plan).enumerate() {
        match (seen, hang_up) {
            (Seen::Completed { text, refused }, None) => {
                assert_eq!(
                    text,
                    &expected[i % PROMPTS.len()],
                    "client {i}: another text than a lone request's"
                );
                completed += 1;
                refused_total += refused;
            }
            (Seen::HungUp, Some(_)) => {}
            // A stream shorter than its hang-up point completes first.
            (Seen::Completed { .. }, Some(_)) => {}
            (other, _) => panic!("client {i}: {other:?}"),
        }
    }
    assert_eq!(completed, plan.iter().filter(|p| p.is_none()).count());
    assert!(
        answers > 0 && busy_seen,
        "/health was not asked during the load"
    );

    // Hung-up generations are cancelled, not left running: the engine
    // goes idle (a deadline only so a hang fails instead of blocking CI).
    let deadline = Instant::now() + Duration::from_secs(120);
    let after = loop {
        let h = health(port);
        if h["busy"] == false && h["queued"] == 0 {
            break h;
        }
        assert!(Instant::now() < deadline, "never idle again: {h}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let peak = after["queued_peak"].as_u64().unwrap() as usize;
    assert!(peak <= QUEUE, "queued_peak {peak} > {QUEUE}");
    let after_active = active_bytes(&after);
    eprintln!(
        "{completed} streams completed, {} hung up, {refused_total} 429s retried, \
         queued_peak {peak}, /health answered {answers} times; MLX active {idle_active} -> \
         {after_active} bytes; RSS {idle_rss:?} -> {:?} KiB",
        CLIENTS - completed,
        rss_kib(server.child.id())
    );
    // Every generation's KV cache and activations are freed when it ends,
    // hung up or not: what stays live is the weights, as before the load.
    // Polled, with a deadline so that a leak fails: two fresh-clone CI runs
    // read 215 KB and 283 KB above the floor in the idle answer itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut settled = after_active;
    while settled != idle_active && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        settled = active_bytes(&health(port));
    }
    if settled != after_active {
        eprintln!("MLX active memory settled at {settled} bytes after the idle answer");
    }
    assert_eq!(
        settled, idle_active,
        "MLX active memory did not return to the idle floor"
    );
    // And the server still serves.
    assert_eq!(reference(port, PROMPTS[0]), expected[0]);
    drop(server);
}
