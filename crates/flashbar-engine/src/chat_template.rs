//! Chat templates from `tokenizer_config.json`, rendered with minijinja.
//!
//! Templates come with downloaded models, so they are untrusted code:
//! rendering has a fuel budget (no endless loops), a recursion limit (no
//! runaway macros), and the output is streamed into a capped buffer, so a
//! template that writes gigabytes is stopped at the cap instead of after.
//!
//! Stack depth. minijinja's parser guards its recursive descent, but chains
//! it parses in a loop (`1+1+1…`, `-----1`, `x|f|f…`, `a.b.c…`, `{% elif %}`
//! after `{% elif %}`) build a syntax tree as deep as the chain, and its
//! compiler, constant folder and drop then recurse that deep: a 60 KB
//! template of `+1` overflowed the 8 MiB main stack and killed the process
//! (see docs/reliability.md). Values nest too (`{% set ns.x = [ns.x] %}` in
//! a loop), and printing, comparing, serializing or dropping them recurses
//! once per level. Neither depth can be checked from outside minijinja, but
//! both are bounded: the tree by the template's length, at most
//! [`MAX_TEMPLATE_BYTES`], and a value by the fuel, since every level is a
//! container built by one instruction. So parsing and rendering run on a
//! thread of their own with a [`STACK_BYTES`] stack, measured to hold the
//! deepest of either with room to spare (the tests build both), whatever
//! thread calls in (a tokio worker has 2 MiB).
//!
//! Known gap: minijinja has no memory budget for values a template builds
//! without writing them (a string doubled by `~` in a loop); fuel bounds the
//! number of such steps, not their size.

use crate::error::{EngineError, Result};
use minijinja::{context, Environment, Value};
use serde::{Deserialize, Serialize};
use std::io::Write;

/// One chat message, as the template sees it: the fields are named and
/// shaped as transformers passes them (docs/templates.md). `role`,
/// `content` and `reasoning_content` reach the app's UI (its chat sends an
/// answer's reasoning back, docs/thinking-and-tools.md); the rest come from
/// API clients.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An earlier assistant turn's thinking, kept apart from its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub reasoning_content: Option<String>,
    /// The functions an assistant turn called.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[ts(skip)]
    pub tool_calls: Vec<ToolCall>,
    /// Which call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(skip)]
    pub tool_call_id: Option<String>,
    /// The function a `tool` message came from, when the client names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(skip)]
    pub name: Option<String>,
}

impl Message {
    /// A message of plain text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            ..Message::default()
        }
    }
}

/// One call of a function by the assistant:
/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

/// A call's function: its name and its arguments as a JSON object (not
/// the JSON text OpenAI clients send; the server parses that).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

/// Everything a template renders besides its own text.
#[derive(Clone, Copy, Debug)]
pub struct ChatInput<'a> {
    pub messages: &'a [Message],
    /// OpenAI function schemas (`{"type": "function", "function": {...}}`);
    /// `None` renders as transformers' `tools=None`.
    pub tools: Option<&'a [serde_json::Value]>,
    pub add_generation_prompt: bool,
    /// Further keyword arguments (`enable_thinking`, ...), as
    /// `apply_chat_template(**kwargs)` passes them.
    pub kwargs: &'a serde_json::Map<String, serde_json::Value>,
}

impl<'a> ChatInput<'a> {
    /// Messages alone, no tools, no keyword arguments.
    pub fn messages(messages: &'a [Message], add_generation_prompt: bool) -> Self {
        static NONE: std::sync::OnceLock<serde_json::Map<String, serde_json::Value>> =
            std::sync::OnceLock::new();
        ChatInput {
            messages,
            tools: None,
            add_generation_prompt,
            kwargs: NONE.get_or_init(serde_json::Map::new),
        }
    }
}

/// What a chat request gives its template besides the messages, owned (a
/// [`ChatInput`] borrows it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateArgs {
    /// OpenAI function schemas; `None` when the request has no tools.
    pub tools: Option<Vec<serde_json::Value>>,
    /// `chat_template_kwargs`: `enable_thinking` and the like.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

impl TemplateArgs {
    /// The input that renders `messages` with these arguments.
    pub fn input<'a>(
        &'a self,
        messages: &'a [Message],
        add_generation_prompt: bool,
    ) -> ChatInput<'a> {
        ChatInput {
            messages,
            tools: self.tools.as_deref(),
            add_generation_prompt,
            kwargs: &self.kwargs,
        }
    }
}

/// Instructions a template may execute before it is stopped. It also
/// bounds how deeply a template can nest a value (one level per
/// instruction at most), so it is sized with [`STACK_BYTES`]: a Qwen-style
/// template spends under 100 per message, so this renders thousands of
/// messages.
pub const FUEL: u64 = 400_000;
/// Deepest nesting of macro calls and includes.
pub const RECURSION_LIMIT: usize = 64;
/// Largest prompt text a template may produce.
pub const MAX_OUTPUT_BYTES: usize = 8 << 20;
/// Longest template accepted (the ones models ship are tens of KB). It
/// bounds the depth of the syntax tree, one level per byte at most.
pub const MAX_TEMPLATE_BYTES: usize = 256 << 10;
/// Most tokens one `{{ }}` or `{% %}` tag may hold. minijinja's compiler
/// folds constants by walking each operator's whole operand chain, so a
/// chain of n operators costs n² steps: 20,000 additions took 16 s. Real
/// tags hold tens of tokens; at this bound a tag compiles in milliseconds.
pub const MAX_TAG_TOKENS: usize = 1000;
/// Stack of the thread that parses and renders. Measured needs: about
/// 500 bytes a level for the syntax tree of a chain of unary minus (the
/// costliest per byte: 128 MiB for a whole [`MAX_TEMPLATE_BYTES`]
/// template), and about 420 bytes a level to print or compare a nested
/// value (170 MiB at [`FUEL`] levels). Only the pages a render touches are
/// ever backed by memory.
pub const STACK_BYTES: usize = 256 << 20;

/// Renders `template` over `messages` with the default limits.
pub fn render(template: &str, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
    render_chat(
        template,
        &ChatInput::messages(messages, add_generation_prompt),
    )
}

/// Renders `template` over a whole input with the default limits.
pub fn render_chat(template: &str, input: &ChatInput) -> Result<String> {
    render_limited(template, input, MAX_OUTPUT_BYTES)
}

/// Renders with an output cap of `max_output` bytes.
pub fn render_limited(template: &str, input: &ChatInput, max_output: usize) -> Result<String> {
    if template.len() > MAX_TEMPLATE_BYTES {
        return Err(EngineError::Template(format!(
            "the chat template is {} bytes, more than the {MAX_TEMPLATE_BYTES}-byte limit",
            template.len()
        )));
    }
    check_tags(template)?;
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, || render_here(template, input, max_output))
            .map_err(|e| {
                EngineError::Template(format!("could not start the template thread: {e}"))
            })?;
        worker.join().unwrap_or_else(|_| {
            Err(EngineError::Template(
                "the chat template renderer panicked".into(),
            ))
        })
    })
}

/// Parses and renders on the calling thread (see the module's note on stack
/// depth: [`render_limited`] calls it on a thread with a large stack).
fn render_here(template: &str, input: &ChatInput, max_output: usize) -> Result<String> {
    // What the template's own `raise_exception` said: the messages are
    // refused (a bad request), not the template broken.
    let refusal = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let env = environment(refusal.clone());
    let bad = |e: minijinja::Error| match refusal.lock().ok().and_then(|r| r.clone()) {
        Some(message) => EngineError::param("messages", escape_controls(&message)),
        None => EngineError::Template(one_line(&e)),
    };
    let template = env.template_from_str(template).map_err(bad)?;
    let mut out = CappedBuffer {
        bytes: Vec::new(),
        cap: max_output,
        overflowed: false,
    };
    // Keyword arguments first, then the tokenizer's special tokens where
    // they do not name them, as `apply_chat_template` merges them.
    let mut kwargs = input.kwargs.clone();
    for token in ["bos_token", "eos_token"] {
        kwargs.entry(token).or_insert_with(|| "".into());
    }
    let result = template.render_captured_to(
        context! {
            messages => python::messages(input.messages),
            tools => input.tools,
            documents => (),
            add_generation_prompt => input.add_generation_prompt,
            ..Value::from_serialize(&kwargs)
        },
        &mut out,
    );
    if out.overflowed {
        return Err(EngineError::Template(format!(
            "the chat template's output passed the {max_output}-byte limit"
        )));
    }
    result.map_err(bad)?;
    // minijinja only writes whole `str`s, so the bytes are valid UTF-8.
    String::from_utf8(out.bytes)
        .map_err(|_| EngineError::Template("the chat template wrote invalid UTF-8".into()))
}

fn environment<'source>(
    refusal: std::sync::Arc<std::sync::Mutex<Option<String>>>,
) -> Environment<'source> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(RECURSION_LIMIT);
    // As transformers compiles templates (docs/templates.md): block tags
    // take their newline and their line's leading blanks.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Python-style string methods (`.strip()`, `.startswith()`) that HF templates use.
    env.set_unknown_method_callback(python::method);
    env.set_formatter(python::formatter);
    env.add_filter("tojson", python::tojson);
    env.add_filter("string", python::string);
    env.add_filter("trim", python::trim);
    env.add_function(
        "raise_exception",
        move |message: String| -> std::result::Result<String, minijinja::Error> {
            if let Ok(mut first) = refusal.lock() {
                first.get_or_insert_with(|| message.clone());
            }
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env
}

/// Refuses a template with a tag of more than [`MAX_TAG_TOKENS`] tokens.
/// A cheap lexer over the source: it skips comments, `{% raw %}` blocks and
/// string literals, counts a name or number as one token and any other
/// character as one, and ends a `{{` tag only at a `}}` outside braces it
/// opened, so it never counts fewer tokens than minijinja reads.
fn check_tags(template: &str) -> Result<()> {
    let bytes = template.as_bytes();
    let find = |from: usize, needle: &[u8]| {
        bytes
            .get(from..)
            .and_then(|rest| rest.windows(needle.len()).position(|w| w == needle))
            .map(|at| from + at)
    };
    let mut i = 0;
    while let Some(open) = find(i, b"{") {
        i = open + 1;
        let kind = match bytes.get(i) {
            Some(&k @ (b'{' | b'%' | b'#')) => k,
            _ => continue,
        };
        i += 1;
        if kind == b'#' {
            i = find(i, b"#}").map_or(bytes.len(), |end| end + 2);
            continue;
        }
        let mut tokens = 0;
        let mut braces = 0usize;
        let mut first_name: Option<&[u8]> = None;
        while i < bytes.len() {
            let c = bytes[i];
            if kind == b'{' && braces == 0 && bytes[i..].starts_with(b"}}") {
                i += 2;
                break;
            }
            if kind == b'%' && bytes[i..].starts_with(b"%}") {
                i += 2;
                break;
            }
            if c.is_ascii_whitespace() {
                i += 1;
                continue;
            }
            tokens += 1;
            if tokens > MAX_TAG_TOKENS {
                let line = 1 + bytes[..open].iter().filter(|&&b| b == b'\n').count();
                return Err(EngineError::Template(format!(
                    "the chat template has a tag of more than {MAX_TAG_TOKENS} tokens (line {line})"
                )));
            }
            if c == b'\'' || c == b'"' {
                i += 1;
                while i < bytes.len() && bytes[i] != c {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            } else if c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] >= 0x80)
                {
                    i += 1;
                }
                first_name.get_or_insert(&bytes[start..i]);
            } else {
                if c == b'{' {
                    braces += 1;
                } else if c == b'}' {
                    braces = braces.saturating_sub(1);
                }
                i += 1;
            }
        }
        if kind == b'%' && first_name == Some(b"raw".as_slice()) {
            // Raw text up to `{% endraw %}` is data, not tags.
            i = find(i, b"endraw")
                .and_then(|end| find(end, b"%}"))
                .map_or(bytes.len(), |end| end + 2);
        }
    }
    Ok(())
}

/// Collects output, refusing (a write error ends the render) past `cap`.
struct CappedBuffer {
    bytes: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl Write for CappedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.cap {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A refusal quotes what the request sent (Qwen's templates name an unknown
/// role, which may hold a newline): control characters are written as
/// escapes, so the error stays one line and still says what was sent.
fn escape_controls(message: &str) -> String {
    let mut line = String::with_capacity(message.len());
    for c in message.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

fn one_line(error: &minijinja::Error) -> String {
    error
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

mod python;

#[cfg(test)]
mod parity;
#[cfg(test)]
mod tests;
