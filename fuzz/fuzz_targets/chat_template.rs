//! Chat template rendering. Adversarial messages through the embedded
//! model's template and a richer one in the style of Qwen's (system prompt,
//! role checks, Python string methods): they render as data, each message's
//! text appears in the prompt. Arbitrary templates (they are untrusted code
//! from downloaded models): a prompt within the output cap or an error,
//! never a panic, a hang or a runaway allocation.
//!
//! Input (text, so seeds are readable): a selector byte (mod 3: `0` the
//! embedded template, `1` the rich one, `2` the template that follows), then
//! a template, then messages,
//! each `\x1e` role `\x1f` content; a `\x1d` anywhere asks for the
//! generation prompt.
#![no_main]

use flashbar_engine::chat_template::{render_limited, ChatInput, Message};
use libfuzzer_sys::fuzz_target;

/// The embedded default model's template.
const EMBEDDED: &str = include_str!("../../models/default/target/tokenizer_config.json");

/// A template shaped like the ones Qwen checkpoints ship (our own text).
const RICH: &str = r#"{%- if messages and messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content.strip() }}<|im_end|>
{% set rest = messages[1:] %}{%- else -%}{% set rest = messages %}{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in rest -%}{%- if m.role == 'user' -%}{% set ns.last_user = loop.index0 %}{%- endif -%}{%- endfor -%}
{%- for m in rest -%}
{%- if m.role not in ['user', 'assistant', 'tool'] -%}{{ raise_exception('unknown role ' ~ m.role) }}{%- endif -%}
{%- if m.role == 'assistant' and '</think>' in m.content -%}
<|im_start|>assistant
{{ m.content.split('</think>')[-1].lstrip('\n') }}<|im_end|>
{% elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"#;

const CAP: usize = 1 << 20;

struct Input {
    which: u8,
    template: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
}

fn split(data: &[u8]) -> Option<Input> {
    let (&which, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    let add_generation_prompt = text.contains('\x1d');
    let text = text.replace('\x1d', "");
    let mut parts = text.split('\x1e');
    let template = parts.next().unwrap_or_default().to_owned();
    let messages = parts
        .map(|m| {
            let (role, content) = m.split_once('\x1f').unwrap_or(("user", m));
            Message::new(role, content)
        })
        .collect();
    Some(Input {
        which,
        template,
        messages,
        add_generation_prompt,
    })
}

fn embedded_template() -> String {
    let config: serde_json::Value = serde_json::from_str(EMBEDDED).unwrap();
    config["chat_template"].as_str().unwrap().to_owned()
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = split(data) else { return };
    let messages = input.messages;
    let known = match input.which % 3 {
        0 => Some(embedded_template()),
        1 => Some(RICH.to_owned()),
        _ => None,
    };
    let template = known.as_deref().unwrap_or(&input.template);
    match render_limited(
        template,
        &ChatInput::messages(&messages, input.add_generation_prompt),
        CAP,
    ) {
        Ok(prompt) => {
            assert!(prompt.len() <= CAP);
            if input.which % 3 == 0 {
                // The embedded template (Qwen3.5's) writes every user
                // message, trimmed of Python's whitespace.
                let space = |c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c);
                for m in messages.iter().filter(|m| m.role == "user") {
                    assert!(prompt.contains(m.content.trim_matches(space)), "{m:?}");
                }
            }
        }
        Err(error) => {
            let text = error.to_string();
            assert!(!text.contains('\n'), "{text}");
            if known.is_some() {
                // Our templates fail only on messages they refuse, or when
                // the messages are too large for the cap.
                let refusals = [
                    "unknown role",
                    "Unexpected message role",
                    "System message must be at the beginning",
                    "No user query found",
                    "No messages provided",
                    "byte limit",
                ];
                assert!(refusals.iter().any(|r| text.contains(r)), "{text}");
            }
        }
    }
});
