//! The OpenAI wire format: request bodies (unknown fields are tolerated)
//! and the response objects built from a [`Generation`]: the answer in
//! `content`, a thinking model's reasoning in `reasoning_content`, its
//! tool calls in `tool_calls` (`docs/thinking-and-tools.md`).

use crate::tool_calls::{self, Call};
use flashbar_engine::{FinishReason, Generation, Speculation};
use serde::Deserialize;
use serde_json::{json, Value};
use std::hash::{BuildHasher, Hasher};

/// Fields shared by chat and text completions.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    /// Flashbar's extension: "auto" | "dflash" | "off".
    pub speculation: Option<Speculation>,
    /// Flashbar's extension: tokens per DFlash verify.
    pub block_size: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `POST /v1/chat/completions`. Tools, tool calls and the template's
/// keyword arguments stay JSON here; `convert` checks them field by field
/// so a bad one is a 400 naming its path.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// OpenAI function schemas.
    #[serde(default)]
    pub tools: Option<Value>,
    /// `"auto"`, `"none"`, or `{"type": "function", "function": {"name"}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Keyword arguments for the chat template (`enable_thinking`, ...), as
    /// vLLM and SGLang take them.
    #[serde(default)]
    pub chat_template_kwargs: Option<Value>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An earlier assistant turn's thinking (`reasoning` is taken too).
    #[serde(default)]
    pub reasoning_content: Option<Value>,
    #[serde(default)]
    pub reasoning: Option<Value>,
    /// An assistant turn's calls, `arguments` as JSON text or an object.
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// Which call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<Value>,
    #[serde(default)]
    pub name: Option<Value>,
}

/// A message's content: a string, or a list of parts (only text parts).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Option<PromptText>,
    #[serde(flatten)]
    pub common: Common,
}

/// A text completion's prompt: a string or a list of one string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptText {
    One(String),
    Many(Vec<String>),
}

pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

/// `usage`, with speculation in OpenAI's own `completion_tokens_details`.
pub fn usage(generation: &Generation) -> Value {
    let s = &generation.stats;
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "completion_tokens_details": {
            "reasoning_tokens": s.reasoning_tokens,
            "accepted_prediction_tokens": s.accepted_tokens,
            "rejected_prediction_tokens": s.rejected_tokens,
        },
    })
}

/// The extra top-level `flashbar` object: how the tokens were made.
pub fn flashbar_stats(generation: &Generation) -> Value {
    let s = &generation.stats;
    json!({
        "mode": s.mode,
        "rounds": s.rounds,
        "mean_accept_len": s.mean_accept_len,
        "tokens_per_second": s.tokens_per_second,
    })
}

/// Identity shared by every object of one response (and every chunk).
#[derive(Clone, Debug)]
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// A fresh tool call id, `call_` and 24 hex digits.
pub fn call_id() -> String {
    let hash = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    format!("call_{:016x}{:08x}", hash(), hash() as u32)
}

/// One whole call in OpenAI's shape.
fn tool_call(call: Call) -> Value {
    json!({
        "id": call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

/// A whole chat answer. With `tools` (the request sent some), tool calls
/// are parsed out of the answer; `reasoning_content` is there when the
/// model reasoned.
pub fn chat_completion(head: &Head, generation: &Generation, tools: Option<&[Value]>) -> Value {
    let (content, calls) = match tools {
        Some(tools) => {
            let parsed = tool_calls::parse(&generation.text, tools);
            (parsed.content, parsed.calls)
        }
        None => (generation.text.clone(), Vec::new()),
    };
    let reason = if calls.is_empty() {
        finish_reason(generation.finish_reason)
    } else {
        "tool_calls"
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !generation.reasoning.is_empty() {
        message["reasoning_content"] = json!(generation.reasoning);
    }
    if !calls.is_empty() {
        if content.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = calls.into_iter().map(tool_call).collect();
    }
    json!({
        "id": head.id,
        "object": "chat.completion",
        "created": head.created,
        "model": head.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": reason,
        }],
        "usage": usage(generation),
        "flashbar": flashbar_stats(generation),
    })
}

pub fn text_completion(head: &Head, generation: &Generation) -> Value {
    json!({
        "id": head.id,
        "object": "text_completion",
        "created": head.created,
        "model": head.model,
        "choices": [{
            "index": 0,
            "text": generation.text,
            "logprobs": null,
            "finish_reason": finish_reason(generation.finish_reason),
        }],
        "usage": usage(generation),
        "flashbar": flashbar_stats(generation),
    })
}

/// Which object a stream sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
}

/// One streamed chunk with a content delta (chat: the first also carries
/// the role) or the finish reason.
pub fn chunk(
    kind: Kind,
    head: &Head,
    first: bool,
    text: &str,
    finish: Option<FinishReason>,
) -> Value {
    let reason = finish.map(finish_reason);
    let choice = match kind {
        Kind::Chat => {
            let delta = match (first, finish) {
                (true, _) => json!({"role": "assistant", "content": text}),
                (false, Some(_)) => json!({}),
                (false, None) => json!({"content": text}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
        }
        Kind::Text => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason}),
    };
    chunk_with(kind, head, vec![choice])
}

/// A chat chunk carrying `delta` (reasoning, tool calls).
pub fn chat_delta(head: &Head, delta: Value) -> Value {
    let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null});
    chunk_with(Kind::Chat, head, vec![choice])
}

/// A chat's last chunk when it ends with tool calls.
pub fn tool_calls_finish_chunk(head: &Head) -> Value {
    let choice = json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls"});
    chunk_with(Kind::Chat, head, vec![choice])
}

/// The final usage chunk (`stream_options.include_usage`): no choices.
pub fn usage_chunk(kind: Kind, head: &Head, generation: &Generation) -> Value {
    let mut value = chunk_with(kind, head, Vec::new());
    value["usage"] = usage(generation);
    value["flashbar"] = flashbar_stats(generation);
    value
}

fn chunk_with(kind: Kind, head: &Head, choices: Vec<Value>) -> Value {
    let object = match kind {
        Kind::Chat => "chat.completion.chunk",
        Kind::Text => "text_completion",
    };
    json!({
        "id": head.id,
        "object": object,
        "created": head.created,
        "model": head.model,
        "choices": choices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashbar_engine::Totals;

    fn outcome() -> Generation {
        Generation {
            text: "hi".into(),
            reasoning: String::new(),
            token_ids: vec![1, 2],
            finish_reason: FinishReason::Length,
            stats: Totals {
                prompt_tokens: 5,
                completion_tokens: 2,
                accepted_tokens: 1,
                rejected_tokens: 14,
                ..Totals::default()
            },
        }
    }

    #[test]
    fn chat_request_tolerates_unknown_fields_and_shapes() {
        let body = r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text",
            "text": "a"}]}, {"role": "assistant", "content": null}], "stop": "x",
            "stream": true, "stream_options": {"include_usage": false}, "tools": [],
            "speculation": "off", "frequency_penalty": 0}"#;
        let request: ChatRequest = serde_json::from_str(body).unwrap();
        assert_eq!(request.messages.len(), 2);
        assert!(matches!(request.common.stop, Some(Stop::One(_))));
        assert_eq!(request.common.speculation, Some(Speculation::Off));
        assert_eq!(request.common.stream, Some(true));
    }

    #[test]
    fn bad_speculation_is_refused() {
        let body = r#"{"messages": [], "speculation": "fast"}"#;
        assert!(serde_json::from_str::<ChatRequest>(body).is_err());
    }

    #[test]
    fn usage_counts_and_details() {
        let u = usage(&outcome());
        assert_eq!(u["total_tokens"], 7);
        assert_eq!(
            u["completion_tokens_details"]["accepted_prediction_tokens"],
            1
        );
        assert_eq!(
            u["completion_tokens_details"]["rejected_prediction_tokens"],
            14
        );
    }

    #[test]
    fn chunks_share_identity_and_first_carries_role() {
        let head = Head {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        };
        let first = chunk(Kind::Chat, &head, true, "", None);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let last = chunk(Kind::Chat, &head, false, "", Some(FinishReason::Stop));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last["id"], first["id"]);
        let usage = usage_chunk(Kind::Chat, &head, &outcome());
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["prompt_tokens"], 5);
        let done = chat_completion(&head, &outcome(), None);
        assert_eq!(done["choices"][0]["finish_reason"], "length");
        assert_eq!(done["object"], "chat.completion");
    }
}
