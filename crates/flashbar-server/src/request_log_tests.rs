//! The server log through the real router: one line per request, whole,
//! streamed, refused, unknown; what it holds and what it never holds.

use crate::limits::Limits;
use crate::request_log::{LineSink, RequestLine, TARGET};
use crate::routes::{router, AppState};
use axum::body::{to_bytes, Body};
use axum::http::Request;
use flashbar_engine::worker::echo::echo_worker;
use std::io::Write;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

const KEY: &str = "sk-very-secret-key-1234";
const PROMPT: &str = "my private question about zebras";

fn app(lines: &Arc<Mutex<Vec<RequestLine>>>) -> axum::Router {
    let kept = Arc::clone(lines);
    let sink = LineSink(Arc::new(move |line: &RequestLine| {
        kept.lock().unwrap().push(line.clone());
    }));
    let (state, cut) = AppState::observed(
        Arc::new(echo_worker(4, 0)),
        "echo".into(),
        Limits::default(),
        None,
        Some(sink),
    );
    std::mem::forget(cut); // never cut
    router(state, Some(Arc::from(KEY)))
}

fn chat(stream: bool, key: &str) -> Request<Body> {
    let body = format!(
        r#"{{"model":"echo","messages":[{{"role":"user","content":"{PROMPT}"}}],
            "max_tokens":3,"stream":{stream},"speculation":"off"}}"#
    );
    Request::post("/v1/chat/completions?api_key=never-logged")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Body::from(body))
        .unwrap()
}

/// Everything the tracing events of TARGET print, as the log file would.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn each_request_gets_one_line_without_keys_or_text() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let lines = Arc::new(Mutex::new(Vec::new()));

    for (sent, request) in [chat(false, KEY), chat(true, KEY), chat(false, "wrong-key")]
        .into_iter()
        .enumerate()
    {
        let response = app(&lines).oneshot(request).await.unwrap();
        // The line waits for the body's end: a streamed answer's tokens are in it.
        assert_eq!(lines.lock().unwrap().len(), sent);
        let _ = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        assert_eq!(lines.lock().unwrap().len(), sent + 1);
    }
    let unknown = Request::get("/v2/what%0Aever").body(Body::empty()).unwrap();
    let _ = app(&lines).oneshot(unknown).await.unwrap();

    let lines = lines.lock().unwrap().clone();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (line, stream) in lines[..2].iter().zip([false, true]) {
        assert_eq!(line.method, "POST");
        assert_eq!(line.path, "/v1/chat/completions", "no query string");
        assert_eq!(line.status, 200, "stream {stream}");
        assert_eq!(line.model.as_deref(), Some("echo"));
        assert_eq!(line.completion_tokens, Some(3));
        assert!(line.prompt_tokens.is_some_and(|n| n > 0));
        assert_eq!(line.speculation, Some(flashbar_engine::Speculation::Off));
        // The echo backend does not decode: no mode, nothing drafted.
        assert_eq!(line.mode, None);
        assert_eq!(line.accepted_drafts, Some(0));
    }
    assert_eq!(lines[2].status, 401);
    assert_eq!(lines[2].model, None, "a refused request was never parsed");
    assert_eq!(lines[3].status, 404);
    assert_eq!(lines[3].path, "/v2/what%0Aever");

    let printed = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = printed.lines().filter(|l| l.contains(TARGET)).collect();
    assert_eq!(logged.len(), 4, "{printed}");
    assert!(
        logged[0].contains("POST /v1/chat/completions 200 model=echo"),
        "{printed}"
    );
    for secret in [KEY, "wrong-key", "never-logged", "zebras", "Bearer"] {
        assert!(!printed.contains(secret), "{secret} in the log: {printed}");
    }
}
