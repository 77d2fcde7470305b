//! Chat requests with tools, tool calls, reasoning and template keyword
//! arguments, converted to what the chat template takes; bad ones refused
//! with a one-line 400 naming their path.

use super::*;
use flashbar_engine::chat_template;
use serde_json::json;

fn names() -> ModelNames {
    ModelNames {
        id: "target".into(),
    }
}

fn convert(body: serde_json::Value) -> Result<Parsed, ApiError> {
    chat(parse_json(body.to_string().as_bytes())?, &names(), 100)
}

fn weather() -> serde_json::Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "a": {}},
        "required": ["city"]}}})
}

fn search() -> serde_json::Value {
    json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}})
}

fn with(extra: serde_json::Value) -> serde_json::Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn tool_names(p: &Parsed) -> Option<Vec<String>> {
    p.request.template.tools.as_ref().map(|tools| {
        tools
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
            .collect()
    })
}

#[test]
fn tool_choice_picks_which_tools_the_template_sees() {
    let tools = json!([weather(), search()]);
    let all = Some(vec!["get_weather".to_string(), "search".to_string()]);
    let p = convert(with(json!({"tools": tools}))).unwrap();
    assert_eq!(tool_names(&p), all);
    let p = convert(with(json!({"tools": tools, "tool_choice": "auto"}))).unwrap();
    assert_eq!(tool_names(&p), all);
    let p = convert(with(json!({"tools": tools, "tool_choice": "none"}))).unwrap();
    assert_eq!(tool_names(&p), None);
    let named = json!({"type": "function", "function": {"name": "search"}});
    let p = convert(with(json!({"tools": tools, "tool_choice": named}))).unwrap();
    assert_eq!(tool_names(&p), Some(vec!["search".to_string()]));
    let p = convert(with(json!({"tools": []}))).unwrap();
    assert_eq!(tool_names(&p), None);
    let p = convert(with(json!({}))).unwrap();
    assert_eq!(tool_names(&p), None);
}

#[test]
fn a_tool_schema_reaches_the_template_with_its_keys_in_order() {
    let p = convert(with(json!({"tools": [weather()]}))).unwrap();
    let text = serde_json::to_string(&p.request.template.tools.unwrap()[0]).unwrap();
    assert_eq!(text, weather().to_string());
    assert!(text.find("\"type\":\"function\"").unwrap() < text.find("\"function\":{").unwrap());
    assert!(
        text.find("\"city\"").unwrap() < text.find("\"a\"").unwrap(),
        "{text}"
    );
}

#[test]
fn chat_template_kwargs_reach_the_template() {
    let p = convert(with(
        json!({"chat_template_kwargs": {"enable_thinking": false, "x": [1]}}),
    ))
    .unwrap();
    let kwargs = &p.request.template.kwargs;
    assert_eq!(kwargs["enable_thinking"], json!(false));
    assert_eq!(kwargs["x"], json!([1]));
    let p = convert(with(json!({}))).unwrap();
    assert!(p.request.template.kwargs.is_empty());
}

#[test]
fn assistant_tool_calls_and_tool_results_become_template_messages() {
    let p = convert(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "reasoning_content": "Call the tool.",
         "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}},
            {"function": {"name": "search", "arguments": {"query": "x"}}},
            {"function": {"name": "search", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny.", "reasoning": "Read the result."}
    ]}))
    .unwrap();
    let Prompt::Messages(messages) = &p.request.prompt else {
        panic!("not messages")
    };
    let call = &messages[1];
    assert_eq!(call.content, "");
    assert_eq!(call.reasoning_content.as_deref(), Some("Call the tool."));
    assert_eq!(call.tool_calls.len(), 3);
    assert_eq!(call.tool_calls[0].id.as_deref(), Some("call_1"));
    assert_eq!(call.tool_calls[0].function.name, "get_weather");
    let args = serde_json::to_string(&call.tool_calls[0].function.arguments).unwrap();
    assert_eq!(args, r#"{"city":"Paris","unit":"c"}"#);
    assert_eq!(call.tool_calls[1].function.arguments, json!({"query": "x"}));
    assert_eq!(call.tool_calls[2].function.arguments, json!({}));
    assert_eq!(messages[2].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(messages[2].name.as_deref(), Some("get_weather"));
    assert_eq!(
        messages[3].reasoning_content.as_deref(),
        Some("Read the result.")
    );
}

#[test]
fn an_openai_request_renders_as_the_fixture_conversation() {
    // The wire form of tests/fixtures/templates' "tool_call_and_result":
    // arguments as JSON text, content null; rendered with Qwen3.5's
    // template it gives what transformers gave for the fixture's form.
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates");
    let template = std::fs::read_to_string(root.join("qwen3_5.jinja")).unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("expected.json")).unwrap())
            .unwrap();
    let tool = json!({"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city.", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}});
    let p = convert(json!({"tools": [tool], "tool_choice": "auto", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
    ]}))
    .unwrap();
    let Prompt::Messages(messages) = &p.request.prompt else {
        panic!("not messages")
    };
    let text =
        chat_template::render_chat(&template, &p.request.template.input(messages, true)).unwrap();
    assert_eq!(
        text,
        expected["qwen3_5.jinja"]["tool_call_and_result"]["text"]
            .as_str()
            .unwrap()
    );
}

#[test]
fn bad_tools_calls_and_kwargs_are_one_line_400s_naming_their_path() {
    let user = json!({"role": "user", "content": "x"});
    let call = |args: serde_json::Value| {
        json!({"messages": [user, {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": args}}]}]})
    };
    for (body, param) in [
        (with(json!({"tools": {"a": 1}})), "tools"),
        (with(json!({"tools": [1]})), "tools[0]"),
        (with(json!({"tools": [{"type": "code"}]})), "tools[0].type"),
        (
            with(json!({"tools": [{"type": "function"}]})),
            "tools[0].function",
        ),
        (
            with(json!({"tools": [{"function": {"name": ""}}]})),
            "tools[0].function.name",
        ),
        (
            with(json!({"tools": [{"function": {"name": "f", "parameters": []}}]})),
            "tools[0].function.parameters",
        ),
        (
            with(json!({"tools": [weather()], "tool_choice": "required"})),
            "tool_choice",
        ),
        (
            with(json!({"tools": [weather()], "tool_choice": 3})),
            "tool_choice",
        ),
        (
            with(json!({"tools": [weather()], "tool_choice": {"type": "function"}})),
            "tool_choice",
        ),
        (
            with(json!({"tools": [weather()], "tool_choice": {"function": {"name": "nope"}}})),
            "tool_choice",
        ),
        (
            with(json!({"tool_choice": {"function": {"name": "get_weather"}}})),
            "tool_choice",
        ),
        (
            with(json!({"chat_template_kwargs": [true]})),
            "chat_template_kwargs",
        ),
        (
            with(json!({"chat_template_kwargs": {"messages": []}})),
            "chat_template_kwargs",
        ),
        (
            with(json!({"chat_template_kwargs": {"enable_thinking": "no"}})),
            "chat_template_kwargs.enable_thinking",
        ),
        (
            call(json!("{not json")),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            call(json!("[1, 2]")),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            call(json!(7)),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "tool_calls": {"a": 1}}]}),
            "messages[1].tool_calls",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "tool_calls": [{"function": {}}]}]}),
            "messages[1].tool_calls[0].function.name",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "tool_calls": [{"name": "f"}]}]}),
            "messages[1].tool_calls[0].function",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}),
            "messages[0].tool_calls",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "reasoning_content": "r"}]}),
            "messages[0].reasoning_content",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 1}]}),
            "messages[0].reasoning_content",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}),
            "messages[0].tool_call_id",
        ),
    ] {
        let e = match convert(body.clone()) {
            Ok(_) => panic!("accepted: {body}"),
            Err(e) => e,
        };
        assert_eq!(e.status.as_u16(), 400, "{body}");
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        assert!(
            !e.message.contains('\n') && !e.message.is_empty(),
            "{}",
            e.message
        );
    }
}
