//! The chat: the UI sends a conversation, the engine worker streams the
//! answer back as `chat:token` events (one per committed token: its id,
//! `from_draft` and the reasoning and answer text it released), one
//! `chat:round` per decoding round (the metrics panel), then `chat:done`
//! or `chat:error`. `chat_stop` cancels a running or queued answer.
//! Requests to the local server report their rounds too ([`HttpRounds`]).

use crate::engine::EngineHandle;
use crate::settings::SettingsHandle;
use flashbar_engine::{
    CancelToken, Commit, EngineError, Event, FinishReason, GenerateRequest, Message, Prompt,
    RoundStats, SamplingParams, Sink, Totals,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tauri::{AppHandle, Emitter, Manager, State};

/// Longest answer the UI may ask for.
const MAX_TOKENS_LIMIT: usize = 8192;

/// What the UI sends.
#[derive(Debug, Deserialize, ts_rs::TS)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub system: String,
    #[serde(default)]
    pub temperature: f32,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    #[serde(default)]
    #[ts(type = "number")]
    pub seed: u64,
    /// The chat's thinking switch: passed to the chat template as its
    /// `enable_thinking` keyword argument, as the server's
    /// `chat_template_kwargs` pass it; None leaves the template's default
    /// (docs/thinking-and-tools.md).
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

fn default_max_tokens() -> usize {
    256
}

/// Running / queued answers, by job id, so they can be stopped.
#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    cancels: Mutex<HashMap<u64, CancelToken>>,
}

/// `chat:token`: one committed token; `id` is None for text held back
/// (UTF-8, a possible stop sequence) and released at the end.
#[derive(Clone, Serialize, ts_rs::TS)]
pub(crate) struct TokenEvent<'a> {
    #[ts(type = "number")]
    job: u64,
    id: Option<u32>,
    from_draft: bool,
    /// A thinking model's reasoning (docs/thinking-and-tools.md).
    reasoning: &'a str,
    text: &'a str,
}

/// `chat:round`: one decoding round of answer `job` (or [`HTTP_JOB`]).
#[derive(Clone, Serialize, ts_rs::TS)]
pub(crate) struct RoundEvent<'a> {
    #[ts(type = "number")]
    job: u64,
    #[serde(flatten)]
    stats: &'a RoundStats,
}

/// `chat:done`: an answer finished.
#[derive(Clone, Serialize, ts_rs::TS)]
pub(crate) struct DoneEvent<'a> {
    #[ts(type = "number")]
    job: u64,
    finish_reason: FinishReason,
    reasoning: &'a str,
    text: &'a str,
    stats: &'a Totals,
}

/// `chat:error`: an answer failed.
#[derive(Clone, Serialize, ts_rs::TS)]
pub(crate) struct ErrorEvent {
    #[ts(type = "number")]
    job: u64,
    error: String,
}

/// `chat:reloaded`: the pair had been unloaded while idle and was loaded
/// again for `job`, taking `ms`.
#[derive(Clone, Serialize, ts_rs::TS)]
pub(crate) struct ReloadedEvent {
    #[ts(type = "number")]
    job: u64,
    #[ts(type = "number")]
    ms: u64,
}

/// Emits each token / round as it happens, on the engine thread.
struct Observer {
    app: AppHandle,
    job: u64,
}

impl Sink for Observer {
    fn commit(&mut self, commit: &Commit) -> bool {
        let event = TokenEvent {
            job: self.job,
            id: commit.token,
            from_draft: commit.from_draft,
            reasoning: commit.reasoning,
            text: commit.text,
        };
        let _ = self.app.emit("chat:token", event);
        true
    }

    fn round(&mut self, stats: &RoundStats) -> bool {
        emit_round(&self.app, self.job, stats);
        true
    }
}

/// Who else sees each round and the end of each generation, besides the
/// UI's events (the tray's live speed); set up by the app's `run`.
pub struct Watch {
    pub round: fn(&AppHandle, &RoundStats),
    pub idle: fn(&AppHandle),
}

fn idle(app: &AppHandle) {
    if let Some(watch) = app.try_state::<Watch>() {
        (watch.idle)(app);
    }
}

/// Job id of the rounds of requests to the local server.
pub const HTTP_JOB: u64 = 0;

/// Sends one round to the metrics panel (`chat:round`); `job` is a chat
/// answer's id, or [`HTTP_JOB`].
pub fn emit_round(app: &AppHandle, job: u64, stats: &RoundStats) {
    let event = RoundEvent { job, stats };
    let _ = app.emit("chat:round", event);
    if let Some(watch) = app.try_state::<Watch>() {
        (watch.round)(app, stats);
    }
}

/// Sees the rounds of a request to the local server, for the metrics
/// panel (its text goes to the HTTP client only).
pub struct HttpRounds(pub AppHandle);

impl Sink for HttpRounds {
    fn round(&mut self, stats: &RoundStats) -> bool {
        emit_round(&self.0, HTTP_JOB, stats);
        true
    }
}

/// The worker drops a job's sink when its generation ends, however it
/// ends: the tray's speed goes back to idle then.
impl Drop for HttpRounds {
    fn drop(&mut self) {
        idle(&self.0);
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        idle(&self.app);
    }
}

/// Checks the request and turns it into the engine's.
fn build_request(
    request: ChatRequest,
    settings: &crate::settings::Settings,
) -> Result<GenerateRequest, String> {
    if request.messages.is_empty() {
        return Err("the conversation is empty".into());
    }
    if request.max_tokens == 0 || request.max_tokens > MAX_TOKENS_LIMIT {
        return Err(format!(
            "max tokens must be between 1 and {MAX_TOKENS_LIMIT}"
        ));
    }
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.system.trim().is_empty() {
        messages.push(Message::new("system", request.system));
    }
    for message in request.messages {
        if !matches!(message.role.as_str(), "user" | "assistant" | "system") {
            return Err(format!("unknown message role {:?}", message.role));
        }
        messages.push(message);
    }
    let mut generate = GenerateRequest::new(Prompt::Messages(messages));
    generate.sampling = SamplingParams {
        temperature: request.temperature,
        seed: request.seed,
        ..SamplingParams::default()
    };
    generate.sampling.validate().map_err(|error| match error {
        EngineError::InvalidParam { message, .. } => message,
        other => other.to_string(),
    })?;
    generate.max_tokens = request.max_tokens;
    generate.speculation = settings.speculation;
    if let Some(on) = request.enable_thinking {
        generate
            .template
            .kwargs
            .insert("enable_thinking".into(), serde_json::Value::Bool(on));
    }
    Ok(generate)
}

/// Queues an answer; returns its job id (events carry it).
#[tauri::command]
pub fn chat_send(
    app: AppHandle,
    engine: State<'_, EngineHandle>,
    jobs: State<'_, Jobs>,
    settings: State<'_, SettingsHandle>,
    request: ChatRequest,
) -> Result<u64, String> {
    let worker = engine
        .worker()
        .ok_or_else(|| format!("the model is not loaded ({})", engine.status().state))?;
    let request = build_request(request, &settings.get())?;
    let job = jobs.next.fetch_add(1, Ordering::SeqCst) + 1;
    let cancel = CancelToken::default();
    let observer = Observer {
        app: app.clone(),
        job,
    };
    let mut events = worker
        .submit_observed(request, cancel.clone(), Some(Box::new(observer)))
        .map_err(|error| error.to_string())?;
    lock(&jobs.cancels).insert(job, cancel);
    tauri::async_runtime::spawn(async move {
        // Text comes through the observer; here only the end matters.
        let mut last = None;
        while let Some(event) = events.recv().await {
            match event {
                Event::Done(generation) => {
                    last = Some(Ok(generation));
                    break;
                }
                Event::Failed(error) => {
                    last = Some(Err(error.to_string()));
                    break;
                }
                Event::Started {
                    reloaded_ms: Some(ms),
                    ..
                } => {
                    // The pair had been unloaded while idle.
                    let _ = app.emit("chat:reloaded", ReloadedEvent { job, ms });
                }
                Event::Started { .. } | Event::Text(_) | Event::Reasoning(_) => {}
            }
        }
        lock(&app.state::<Jobs>().cancels).remove(&job);
        match last {
            Some(Ok(generation)) => {
                let done = DoneEvent {
                    job,
                    finish_reason: generation.finish_reason,
                    reasoning: &generation.reasoning,
                    text: &generation.text,
                    stats: &generation.stats,
                };
                let _ = app.emit("chat:done", done);
            }
            Some(Err(message)) => {
                let _ = app.emit(
                    "chat:error",
                    ErrorEvent {
                        job,
                        error: message,
                    },
                );
            }
            None => {
                let error = "the engine stopped".to_owned();
                let _ = app.emit("chat:error", ErrorEvent { job, error });
            }
        }
    });
    Ok(job)
}

/// Stops an answer (running or queued); false if it already ended.
#[tauri::command]
pub fn chat_stop(jobs: State<'_, Jobs>, job: u64) -> bool {
    match lock(&jobs.cancels).get(&job) {
        Some(cancel) => {
            cancel.cancel();
            true
        }
        None => false,
    }
}

/// Cancels every answer (before the model is replaced or the app quits).
pub fn stop_all(app: &AppHandle) {
    for cancel in lock(&app.state::<Jobs>().cancels).values() {
        cancel.cancel();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    fn request(json: serde_json::Value) -> Result<GenerateRequest, String> {
        let request: ChatRequest = serde_json::from_value(json).unwrap();
        build_request(request, &Settings::default())
    }

    #[test]
    fn the_system_prompt_leads_the_conversation() {
        let built = request(serde_json::json!({
            "messages": [{"role": "user", "content": "hi"}],
            "system": "be brief", "temperature": 0.7, "max_tokens": 12
        }))
        .unwrap();
        let Prompt::Messages(messages) = built.prompt else {
            panic!("a chat is sent as messages");
        };
        assert_eq!(messages[0].role, "system");
        assert_eq!(messages[1].content, "hi");
        assert_eq!(built.max_tokens, 12);
        assert_eq!(built.sampling.temperature, 0.7);
    }

    #[test]
    fn the_thinking_switch_reaches_the_template_kwargs() {
        let user = serde_json::json!([{"role": "user", "content": "hi"}]);
        for on in [false, true] {
            let built =
                request(serde_json::json!({"messages": user, "enable_thinking": on})).unwrap();
            assert_eq!(
                built.template.kwargs.get("enable_thinking"),
                Some(&serde_json::Value::Bool(on))
            );
        }
        // Unset (left out or null): the template's own default.
        for json in [
            serde_json::json!({"messages": user}),
            serde_json::json!({"messages": user, "enable_thinking": null}),
        ] {
            assert!(request(json).unwrap().template.kwargs.is_empty());
        }
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let user = serde_json::json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (
                serde_json::json!({"messages": []}),
                "the conversation is empty",
            ),
            (
                serde_json::json!({"messages": user, "temperature": 3.0}),
                "temperature must be in [0, 2], got 3",
            ),
            (
                serde_json::json!({"messages": user, "max_tokens": 0}),
                "max tokens must be between 1 and 8192",
            ),
            (
                serde_json::json!({"messages": [{"role": "tool", "content": "x"}]}),
                "unknown message role \"tool\"",
            ),
        ];
        for (json, reason) in cases {
            assert_eq!(request(json).unwrap_err(), reason);
        }
    }
}
