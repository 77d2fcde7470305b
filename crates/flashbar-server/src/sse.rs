//! Streaming answers as server-sent events: chunks sharing one id/created,
//! the chat role in the first delta, the finish reason, an optional usage
//! chunk (`stream_options.include_usage`), then `data: [DONE]`. Dropping the
//! stream (client gone) cancels the generation through its guard.
//! A chat's reasoning streams as `delta.reasoning_content`; with tools, its
//! tool calls as `delta.tool_calls` (the id and name first, then the
//! arguments' chunks) and `finish_reason: "tool_calls"`
//! (`docs/thinking-and-tools.md`).

use crate::api::{self, Head, Kind};
use crate::request_log::Record;
use crate::tool_calls::{Piece, ToolCallParser};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use flashbar_engine::worker::{CancelOnDrop, Event};
use futures_util::stream;
use serde_json::json;
use std::collections::VecDeque;
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

struct State {
    events: UnboundedReceiver<Event>,
    /// Cancels the generation when the stream is dropped.
    _guard: CancelOnDrop,
    head: Head,
    kind: Kind,
    include_usage: bool,
    pending: VecDeque<SseEvent>,
    finished: bool,
    cut: watch::Receiver<bool>,
    record: Option<Record>,
    /// Parses tool calls out of the answer (the request sent tools).
    tools: Option<ToolCallParser>,
}

impl State {
    fn push_pieces(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            let delta = match piece {
                Piece::Content(text) => json!({"content": text}),
                Piece::Call { index, name } => json!({"tool_calls": [{
                    "index": index,
                    "id": api::call_id(),
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}),
                Piece::Arguments { index, chunk } => json!({"tool_calls": [{
                    "index": index,
                    "function": {"arguments": chunk},
                }]}),
            };
            self.pending
                .push_back(data(api::chat_delta(&self.head, delta)));
        }
    }
}

fn data(value: serde_json::Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

/// What the request asked of its stream.
pub struct Asked {
    /// A last chunk with the usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The request's tools: parse tool calls out of the answer.
    pub tools: Option<Vec<serde_json::Value>>,
}

/// The SSE response for a started generation.
pub fn respond(
    kind: Kind,
    head: Head,
    events: UnboundedReceiver<Event>,
    guard: CancelOnDrop,
    asked: Asked,
    cut: watch::Receiver<bool>,
    record: Option<Record>,
) -> Response {
    let mut pending = VecDeque::new();
    if kind == Kind::Chat {
        pending.push_back(data(api::chunk(kind, &head, true, "", None)));
    }
    let state = State {
        events,
        _guard: guard,
        head,
        kind,
        include_usage: asked.include_usage,
        pending,
        finished: false,
        cut,
        record,
        tools: asked.tools.map(ToolCallParser::new),
    };
    let chunks = stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.pending.pop_front() {
                return Some((Ok::<_, Infallible>(event), state));
            }
            if state.finished {
                return None;
            }
            let event = tokio::select! {
                event = state.events.recv() => event,
                // Shutdown cut this answer: end it (the guard cancels).
                () = crate::listen::cut(state.cut.clone()) => return None,
            };
            match event {
                Some(Event::Started { .. }) => {}
                Some(Event::Reasoning(text)) => {
                    let delta = json!({"reasoning_content": text});
                    let chunk = api::chat_delta(&state.head, delta);
                    state.pending.push_back(data(chunk));
                }
                Some(Event::Text(text)) => match &mut state.tools {
                    Some(parser) => {
                        let pieces = parser.push(&text);
                        state.push_pieces(pieces);
                    }
                    None => {
                        let chunk = api::chunk(state.kind, &state.head, false, &text, None);
                        state.pending.push_back(data(chunk));
                    }
                },
                Some(Event::Done(outcome)) => {
                    if let Some(record) = &state.record {
                        record.done(&outcome);
                    }
                    let mut calls = 0;
                    if let Some(parser) = &mut state.tools {
                        let pieces = parser.finish();
                        calls = parser.calls();
                        state.push_pieces(pieces);
                    }
                    let last = if calls > 0 {
                        api::tool_calls_finish_chunk(&state.head)
                    } else {
                        let reason = Some(outcome.finish_reason);
                        api::chunk(state.kind, &state.head, false, "", reason)
                    };
                    state.pending.push_back(data(last));
                    if state.include_usage {
                        let usage = api::usage_chunk(state.kind, &state.head, &outcome);
                        state.pending.push_back(data(usage));
                    }
                    state.pending.push_back(SseEvent::default().data("[DONE]"));
                    state.finished = true;
                }
                Some(Event::Failed(error)) => {
                    // Clients raise on a chunk carrying an error object.
                    state
                        .pending
                        .push_back(data(crate::error::ApiError::from(error).body()));
                    state.finished = true;
                }
                None => {
                    let error = crate::error::ApiError::internal("the engine stopped");
                    state.pending.push_back(data(error.body()));
                    state.finished = true;
                }
            }
        }
    });
    Sse::new(chunks).into_response()
}
