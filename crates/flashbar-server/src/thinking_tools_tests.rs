//! Reasoning and tool calls through the HTTP routes, on the scripted
//! stand-in (`worker::echo::ScriptedBackend`): a test of our parsing and
//! of the wire protocol, not of a model (docs/thinking-and-tools.md).
use crate::limits::Limits;
use crate::routes::{router, AppState};
use axum::body::{to_bytes, Body};
use axum::http::Request;
use flashbar_engine::worker::echo::scripted_worker;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

const REPLY: &str = "The user wants Paris's weather.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";

async fn ask(body: Value) -> Value {
    let worker = scripted_worker(vec![(String::new(), REPLY.into())], 3);
    let (state, cut) = AppState::new(Arc::new(worker), "scripted".into(), Limits::default());
    std::mem::forget(cut);
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = router(state, None).oneshot(request).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let bytes = to_bytes(response.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    if body["stream"] != json!(true) {
        return serde_json::from_str(&text).unwrap();
    }
    // Reassemble the stream into a message as a client does.
    let mut message = json!({"content": "", "reasoning_content": "", "tool_calls": []});
    let mut finish = Value::Null;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(line).unwrap();
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        for field in ["content", "reasoning_content"] {
            if let Some(text) = delta[field].as_str() {
                let joined = message[field].as_str().unwrap().to_owned() + text;
                message[field] = json!(joined);
            }
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            let calls = message["tool_calls"].as_array_mut().unwrap();
            if index == calls.len() {
                assert!(call["id"].as_str().unwrap().starts_with("call_"));
                assert!(call["function"]["name"].is_string(), "the name comes first");
                calls.push(call.clone());
            } else {
                let args = calls[index]["function"]["arguments"]
                    .as_str()
                    .unwrap()
                    .to_owned()
                    + call["function"]["arguments"].as_str().unwrap();
                calls[index]["function"]["arguments"] = json!(args);
            }
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    json!({"choices": [{"message": message, "finish_reason": finish}]})
}

fn request(stream: bool, tools: bool) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "chat_template_kwargs": {"enable_thinking": true},
        "stream": stream,
    });
    if tools {
        body["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}}}}}]);
    }
    body
}

#[tokio::test]
async fn reasoning_and_tool_calls_whole_and_streamed_agree() {
    let whole = ask(request(false, true)).await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(
        message["reasoning_content"],
        "The user wants Paris's weather."
    );
    assert_eq!(message["content"], "Checking.");
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris", "days": 2}));
    // Pieces of 3 characters: 11 hold the reasoning's 32 characters and its
    // newline (and `<`), 3 more reach the end of `</think>` (they count).
    let reasoning_tokens = whole["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64();
    assert_eq!(reasoning_tokens, Some(14));

    let streamed = ask(request(true, true)).await;
    let s = &streamed["choices"][0];
    assert_eq!(s["finish_reason"], "tool_calls");
    for field in ["content", "reasoning_content"] {
        assert_eq!(s["message"][field], message[field], "{field}");
    }
    let (a, b) = (&s["message"]["tool_calls"][0], call);
    assert_eq!(a["function"], b["function"]);
}

#[tokio::test]
async fn without_tools_the_call_stays_text() {
    for stream in [false, true] {
        let answer = ask(request(stream, false)).await;
        let choice = &answer["choices"][0];
        assert_eq!(choice["finish_reason"], "stop");
        let content = choice["message"]["content"].as_str().unwrap();
        assert!(
            content.starts_with("Checking.\n\n<tool_call>\n<function=get_weather>"),
            "{content}"
        );
        assert_eq!(
            choice["message"]["reasoning_content"],
            "The user wants Paris's weather."
        );
        assert!(choice["message"]["tool_calls"]
            .as_array()
            .is_none_or(Vec::is_empty));
    }
}
