//! The embedded pair's chat template (Qwen3.5's, docs/templates.md): the
//! model's default of no thinking, a request overriding it, tools in the
//! prompt, `chat_template.jinja` taking precedence over the config's, and
//! DFlash on a chat prompt (one turn, or a multi-turn history with thinking
//! and tool calls) giving the tokens plain decoding gives.

use flashbar_engine::chat_template::TemplateArgs;
use flashbar_engine::tokenizer::TextTokenizer;
use flashbar_engine::{Engine, GenerateRequest, Message, Prompt, Sink, Speculation};
use serde_json::json;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default")
}

fn default_pair() -> Engine {
    Engine::load(&root().join("target"), Some(&root().join("drafter"))).unwrap()
}

fn rendered(engine: &Engine, messages: &[Message], args: &TemplateArgs) -> String {
    let prompt = Prompt::Messages(messages.to_vec());
    let ids = engine.prompt_ids_with(&prompt, args).unwrap();
    engine.tokenizer().decode(&ids).unwrap()
}

struct Quiet;
impl Sink for Quiet {}

#[test]
fn the_embedded_pair_renders_qwen3_5_with_thinking_off_unless_asked() {
    let engine = default_pair();
    let messages = [Message::new("user", "def fib(n):")];
    let plain = rendered(&engine, &messages, &TemplateArgs::default());
    assert_eq!(
        plain,
        "<|im_start|>user\ndef fib(n):<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let mut thinking = TemplateArgs::default();
    thinking
        .kwargs
        .insert("enable_thinking".into(), json!(true));
    let text = rendered(&engine, &messages, &thinking);
    assert!(
        text.ends_with("<|im_start|>assistant\n<think>\n"),
        "{text:?}"
    );
    let tools = TemplateArgs {
        tools: Some(vec![
            json!({"type": "function", "function": {"name": "run_tests"}}),
        ]),
        ..TemplateArgs::default()
    };
    let text = rendered(&engine, &messages, &tools);
    assert!(
        text.starts_with("<|im_start|>system\n# Tools\n"),
        "{text:?}"
    );
    assert!(text.contains("{\"type\": \"function\", \"function\": {\"name\": \"run_tests\"}}"));
}

#[test]
fn chat_template_jinja_wins_over_the_config_template() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        std::fs::copy(root().join("target").join(name), dir.path().join(name)).unwrap();
    }
    let tokenizer = TextTokenizer::load(dir.path()).unwrap();
    assert!(tokenizer.chat_template().unwrap().contains("<tool_call>"));
    assert_eq!(
        tokenizer.template_defaults()["enable_thinking"],
        json!(false)
    );
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ messages[0].content }}",
    )
    .unwrap();
    let tokenizer = TextTokenizer::load(dir.path()).unwrap();
    assert_eq!(tokenizer.chat_template(), Some("{{ messages[0].content }}"));
}

#[test]
fn dflash_on_a_chat_prompt_gives_the_plain_tokens() {
    let engine = default_pair();
    let messages = vec![
        Message::new("system", "You write Python."),
        Message::new("user", "def add(a, b):"),
    ];
    for enable_thinking in [false, true] {
        let mut tokens = Vec::new();
        for speculation in [Speculation::Off, Speculation::Dflash] {
            let request = chat_request(
                &messages,
                TemplateArgs::default(),
                enable_thinking,
                speculation,
            );
            tokens.push(engine.generate(&request, &mut Quiet).unwrap().token_ids);
        }
        assert!(!tokens[0].is_empty());
        assert_eq!(tokens[0], tokens[1], "enable_thinking={enable_thinking}");
    }
}

/// 40 tokens of a chat, blocks of 16, with `template` and the thinking
/// switch set as a request sets it.
fn chat_request(
    messages: &[Message],
    template: TemplateArgs,
    enable_thinking: bool,
    speculation: Speculation,
) -> GenerateRequest {
    let mut request = GenerateRequest::new(Prompt::Messages(messages.to_vec()));
    request.template = template;
    request
        .template
        .kwargs
        .insert("enable_thinking".into(), json!(enable_thinking));
    request.max_tokens = 40;
    request.speculation = speculation;
    request.block_size = Some(16);
    request
}

/// Joins what the sink is shown, channel by channel.
#[derive(Default)]
struct Channels {
    reasoning: String,
    text: String,
}

impl Sink for Channels {
    fn commit(&mut self, commit: &flashbar_engine::Commit) -> bool {
        self.reasoning.push_str(commit.reasoning);
        self.text.push_str(commit.text);
        true
    }
}

/// Thinking and tools on the real model (docs/thinking-and-tools.md):
/// with thinking on, the prompt ends in an open `<think>`, so the output
/// starts as reasoning; DFlash gives the same tokens, the same split and
/// the same reasoning count as plain decoding, streamed and whole.
#[test]
fn dflash_with_tools_and_thinking_splits_as_plain_decoding_does() {
    let engine = default_pair();
    let args = TemplateArgs {
        tools: Some(vec![json!({"type": "function", "function": {
            "name": "run_python", "description": "Runs Python code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                           "required": ["code"]}}})]),
        ..TemplateArgs::default()
    };
    let messages = vec![Message::new("user", "def add(a, b):")];
    for enable_thinking in [false, true] {
        let mut runs = Vec::new();
        for speculation in [Speculation::Off, Speculation::Dflash] {
            let request = chat_request(&messages, args.clone(), enable_thinking, speculation);
            let mut streamed = Channels::default();
            let generation = engine.generate(&request, &mut streamed).unwrap();
            assert_eq!(streamed.reasoning, generation.reasoning);
            assert_eq!(streamed.text, generation.text);
            runs.push((
                generation.token_ids,
                generation.reasoning,
                generation.text,
                generation.stats.reasoning_tokens,
            ));
        }
        assert_eq!(runs[0], runs[1], "enable_thinking={enable_thinking}");
        let (ids, reasoning, text, reasoning_tokens) = &runs[0];
        assert!(!ids.is_empty());
        if enable_thinking {
            // The first token is inside the block the prompt opened.
            assert!(*reasoning_tokens >= 1 && !reasoning.is_empty());
            // A block never closed: every token was reasoning.
            if text.is_empty() {
                assert_eq!(*reasoning_tokens, ids.len());
            }
        } else {
            assert_eq!((*reasoning_tokens, reasoning.as_str()), (0, ""));
        }
    }
}

/// A conversation as an agent sends it back: an earlier assistant turn
/// with its thinking (`reasoning_content`) and a tool call, the tool's
/// result, then a new question; tools as `tool_choice` leaves them (all of
/// them for "auto", the named one alone for a named function, none for
/// "none": crates/flashbar-server/src/convert/chat.rs). The template renders
/// the history (the call and the result appear in the prompt), and DFlash
/// gives plain decoding's tokens and split, thinking on and off.
#[test]
fn dflash_on_a_multi_turn_tool_history_gives_the_plain_tokens() {
    use flashbar_engine::chat_template::{FunctionCall, ToolCall};
    let engine = default_pair();
    let tool = |name: &str| {
        json!({"type": "function", "function": {
            "name": name, "description": "Runs Python code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                           "required": ["code"]}}})
    };
    let mut assistant = Message::new("assistant", "");
    assistant.reasoning_content = Some("The user wants the sum; run it.".into());
    assistant.tool_calls = vec![ToolCall {
        id: Some("call_1".into()),
        kind: "function".into(),
        function: FunctionCall {
            name: "run_python".into(),
            arguments: json!({"code": "print(sum(range(10)))"}),
        },
    }];
    let mut result = Message::new("tool", "45");
    result.tool_call_id = Some("call_1".into());
    let messages = vec![
        Message::new("system", "You write Python."),
        Message::new("user", "What is the sum of range(10)?"),
        assistant,
        result,
        Message::new("user", "def add(a, b):"),
    ];
    let choices = [
        ("auto", Some(vec![tool("run_python"), tool("run_shell")])),
        ("named", Some(vec![tool("run_python")])),
        ("none", None),
    ];
    for (choice, tools) in choices {
        let args = TemplateArgs {
            tools,
            ..TemplateArgs::default()
        };
        let prompt = rendered(&engine, &messages, &args);
        assert!(
            prompt.contains("run_python") && prompt.contains("45"),
            "{choice}: the call and its result are rendered: {prompt}"
        );
        for enable_thinking in [false, true] {
            let mut runs = Vec::new();
            for speculation in [Speculation::Off, Speculation::Dflash] {
                let request = chat_request(&messages, args.clone(), enable_thinking, speculation);
                let generation = engine.generate(&request, &mut Quiet).unwrap();
                runs.push((generation.token_ids, generation.reasoning, generation.text));
            }
            assert!(!runs[0].0.is_empty());
            assert_eq!(
                runs[0], runs[1],
                "tool_choice {choice}, enable_thinking={enable_thinking}"
            );
        }
    }
}
