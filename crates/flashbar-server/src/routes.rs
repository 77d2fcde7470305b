//! The HTTP routes: `GET /v1/models`, `GET /v1/models/{id}`,
//! `POST /v1/chat/completions`, `POST /v1/completions`, `GET /health`;
//! anything else is a 404 error object.

use crate::api::{self, Head, Kind};
use crate::auth;
use crate::convert::{self, ModelNames, Parsed};
use crate::error::ApiError;
use crate::limits::Limits;
use crate::request_log::{self, LineSink, Record};
use crate::{body, memory, sse};
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use flashbar_engine::worker::{CancelOnDrop, Event, Observer, Worker};
use flashbar_engine::CancelToken;
use serde_json::{json, Value};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// Makes an [`Observer`] for each request's generation.
#[derive(Clone)]
pub struct ObserveRequests(pub Arc<dyn Fn() -> Observer + Send + Sync>);

impl std::fmt::Debug for ObserveRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObserveRequests")
    }
}

/// What every handler sees.
pub struct AppState {
    pub worker: Arc<Worker>,
    pub names: ModelNames,
    /// When the server started (the models list's `created`).
    pub created: u64,
    /// Becomes true (or its sender is dropped) when the server cuts the
    /// answers still running at shutdown.
    pub cut: watch::Receiver<bool>,
    pub limits: Limits,
    /// Makes an observer for each generation, if asked.
    pub observe: Option<ObserveRequests>,
    /// Also gets each request's log line (the app's Server panel).
    pub request_log: Option<LineSink>,
}

impl AppState {
    /// The state, and the sender that cuts running answers.
    pub fn new(
        worker: Arc<Worker>,
        model_id: String,
        limits: Limits,
    ) -> (Arc<AppState>, watch::Sender<bool>) {
        Self::observed(worker, model_id, limits, None, None)
    }

    /// Same, with an observer for each request's generation and a second
    /// destination for the request lines.
    pub fn observed(
        worker: Arc<Worker>,
        model_id: String,
        limits: Limits,
        observe: Option<ObserveRequests>,
        request_log: Option<LineSink>,
    ) -> (Arc<AppState>, watch::Sender<bool>) {
        let (cut_tx, cut) = watch::channel(false);
        let state = AppState {
            worker,
            names: ModelNames { id: model_id },
            created: now(),
            cut,
            limits,
            observe,
            request_log,
        };
        (Arc::new(state), cut_tx)
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh, unguessable-enough response id.
fn new_id(prefix: &str) -> String {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{prefix}-{random:016x}")
}

/// The router; with `api_key`, the `/v1` routes require it (`/health`
/// stays open: it says only whether the engine is busy). Every request,
/// refused ones too, gets a line in the server log (`request_log`).
pub fn router(state: Arc<AppState>, api_key: Option<Arc<str>>) -> Router {
    let lines = state.request_log.clone();
    let mut v1 = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions));
    if let Some(key) = api_key {
        v1 = v1.route_layer(axum::middleware::from_fn_with_state(key, auth::require_key));
    }
    Router::new()
        .route("/health", get(health))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            lines,
            request_log::log_requests,
        ))
}

fn model_object(state: &AppState) -> Value {
    json!({
        "id": state.names.id,
        "object": "model",
        "created": state.created,
        "owned_by": "flashbar",
    })
}

async fn list_models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&state)]}))
}

async fn get_model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state.names.resolve(Some(&id))?;
    Ok(Json(model_object(&state)))
}

async fn health(State(state): State<Arc<AppState>>) -> Json<Value> {
    // One snapshot, so `busy: false, queued: 0` is never read between two
    // jobs; the memory is read after it.
    let activity = state.worker.activity();
    Json(json!({
        "status": "ok",
        "model": state.names.id,
        "busy": activity.busy,
        "queued": activity.queued,
        "queued_peak": state.worker.queued_peak(),
        "queue_capacity": state.worker.capacity(),
        "memory": memory::stats(),
    }))
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::route_not_found(method.as_str(), uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    record: Option<Extension<Record>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = convert::parse_json(&body::read(&headers, body, &state.limits).await?)?;
    let parsed = convert::chat(body, &state.names, state.worker.context_length())?;
    answer(&state, parsed, Kind::Chat, record.map(|r| r.0)).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    record: Option<Extension<Record>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = convert::parse_json(&body::read(&headers, body, &state.limits).await?)?;
    let parsed = convert::completion(body, &state.names, state.worker.context_length())?;
    answer(&state, parsed, Kind::Text, record.map(|r| r.0)).await
}

/// The response header telling how long the request waited for the engine
/// (queue and prompt checks), in milliseconds.
pub const QUEUE_WAIT_HEADER: &str = "x-flashbar-queue-wait-ms";

/// Queues the generation, waits until it starts (so a refused request is
/// still an HTTP error), then answers whole or as a stream. Dropping this
/// future or the stream (client gone) cancels the generation.
async fn answer(
    state: &AppState,
    parsed: Parsed,
    kind: Kind,
    record: Option<Record>,
) -> Result<Response, ApiError> {
    if let Some(record) = &record {
        record.parsed(&parsed.model, parsed.request.speculation);
    }
    let mut response = start_answer(state, parsed, kind, record).await?;
    if let Ok(value) = HeaderValue::from_str(&response.1.to_string()) {
        response.0.headers_mut().insert(QUEUE_WAIT_HEADER, value);
    }
    Ok(response.0)
}

/// The response, and the milliseconds it waited before generating.
async fn start_answer(
    state: &AppState,
    parsed: Parsed,
    kind: Kind,
    record: Option<Record>,
) -> Result<(Response, u128), ApiError> {
    let submitted = Instant::now();
    // The answer's tool calls are parsed only when the request sent tools.
    let tools = parsed
        .request
        .template
        .tools
        .clone()
        .filter(|tools| kind == Kind::Chat && !tools.is_empty());
    let cancel = CancelToken::default();
    let guard = CancelOnDrop(cancel.clone());
    let mut events = state.worker.submit_observed(
        parsed.request,
        cancel,
        state.observe.as_ref().map(|make| (make.0)()),
    )?;
    let stopping = || ApiError::unavailable("the server is shutting down");
    let first = tokio::select! {
        event = events.recv() => event,
        () = crate::listen::cut(state.cut.clone()) => return Err(stopping()),
    };
    match first {
        Some(Event::Started { .. }) => {}
        Some(Event::Failed(error)) => return Err(error.into()),
        _ => return Err(ApiError::internal("the engine stopped")),
    }
    let waited = submitted.elapsed().as_millis();
    let head = Head {
        id: new_id(match kind {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        }),
        created: now(),
        model: parsed.model,
    };
    if parsed.stream {
        let stream = sse::respond(
            kind,
            head,
            events,
            guard,
            sse::Asked {
                include_usage: parsed.include_usage,
                tools,
            },
            state.cut.clone(),
            record,
        );
        return Ok((stream, waited));
    }
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            () = crate::listen::cut(state.cut.clone()) => return Err(stopping()),
        };
        let Some(event) = event else { break };
        match event {
            Event::Started { .. } | Event::Text(_) | Event::Reasoning(_) => {}
            Event::Failed(error) => return Err(error.into()),
            Event::Done(outcome) => {
                if let Some(record) = &record {
                    record.done(&outcome);
                }
                let body = match kind {
                    Kind::Chat => api::chat_completion(&head, &outcome, tools.as_deref()),
                    Kind::Text => api::text_completion(&head, &outcome),
                };
                return Ok((Json(body).into_response(), waited));
            }
        }
    }
    Err(ApiError::internal("the engine stopped"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{to_bytes, Body};
    use axum::http::Request;
    use flashbar_engine::worker::echo::echo_worker;
    use tower::ServiceExt;

    fn app(key: Option<&str>) -> Router {
        let (state, cut) = AppState::new(
            Arc::new(echo_worker(4, 0)),
            "echo".into(),
            Limits::default(),
        );
        std::mem::forget(cut); // never cut
        router(state, key.map(Arc::from))
    }

    async fn call(app: Router, request: Request<Body>) -> (u16, String) {
        let response = app.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    fn post(path: &str, body: &str) -> Request<Body> {
        Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap()
    }

    #[tokio::test]
    async fn chat_whole_and_streamed() {
        let body = r#"{"model":"echo","messages":[{"role":"user","content":"x"}],"max_tokens":2}"#;
        let response = app(None)
            .oneshot(post("/v1/chat/completions", body))
            .await
            .unwrap();
        let waited = response.headers()[QUEUE_WAIT_HEADER].to_str().unwrap();
        assert!(waited.parse::<u64>().is_ok(), "{waited}");
        let (status, text) = call(app(None), post("/v1/chat/completions", body)).await;
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "w0 w1 ");
        assert_eq!(v["usage"]["completion_tokens"], 2);
        assert!(v["flashbar"].is_object());

        let body = r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"stream":true,
            "stream_options":{"include_usage":true}}"#;
        let (status, text) = call(app(None), post("/v1/chat/completions", body)).await;
        assert_eq!(status, 200);
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("data: ")).collect();
        assert_eq!(lines.last(), Some(&"data: [DONE]"));
        let chunks: Vec<Value> = lines[..lines.len() - 1]
            .iter()
            .map(|l| serde_json::from_str(&l[6..]).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 3);
    }

    #[tokio::test]
    async fn errors_are_objects() {
        let (status, text) = call(app(None), post("/v1/chat/completions", "{oops")).await;
        assert_eq!(status, 400);
        assert!(text.contains("\"invalid_request_error\""));
        let body = r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#;
        let (status, text) = call(app(None), post("/v1/chat/completions", body)).await;
        assert_eq!(status, 404);
        assert!(text.contains("model_not_found"));
        let (status, _) = call(app(None), post("/v2/nothing", "{}")).await;
        assert_eq!(status, 404);
        let (status, text) = call(app(None), post("/v1/models", "{}")).await;
        assert_eq!(status, 405);
        assert!(text.contains("\"error\""));
        let huge = format!("{{\"prompt\": \"{}\"}}", "x".repeat(5 << 20));
        let (status, text) = call(app(None), post("/v1/completions", &huge)).await;
        assert_eq!(status, 413);
        assert!(text.contains("\"error\""));
    }

    #[tokio::test]
    async fn the_key_is_required_when_set() {
        let get = |key: Option<&str>| {
            let mut r = Request::get("/v1/models");
            if let Some(key) = key {
                r = r.header("authorization", format!("Bearer {key}"));
            }
            r.body(Body::empty()).unwrap()
        };
        assert_eq!(call(app(Some("k")), get(None)).await.0, 401);
        assert_eq!(call(app(Some("k")), get(Some("bad"))).await.0, 401);
        assert_eq!(call(app(Some("k")), get(Some("k"))).await.0, 200);
        assert_eq!(call(app(None), get(Some("anything"))).await.0, 200);
        let health = Request::get("/health").body(Body::empty()).unwrap();
        let (status, text) = call(app(Some("k")), health).await;
        assert_eq!(status, 200);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["memory"]["active_bytes"].is_u64(), "{text}");
    }
}
