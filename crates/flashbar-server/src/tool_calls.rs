//! The model's tool calls, parsed out of its answer into OpenAI
//! `tool_calls` (`docs/thinking-and-tools.md`).
//!
//! Qwen3.5/3.6's template asks for calls as
//! `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>`;
//! Qwen3's asked for `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
//! Both are read. A parameter's value is typed by the tool's JSON schema:
//! a string parameter stays the text as written, any other type is read as
//! JSON (and Python's `True` / `False` / `None`, which Qwen3.5's template
//! writes) when it fits the type, else kept as a string.
//!
//! [`ToolCallParser`] is a pure state machine fed the answer's text pieces
//! as they stream: text outside calls is content (released at once, but
//! for a possible partial `<tool_call>` and the whitespace before it);
//! a call is held from `<tool_call>` to `</tool_call>`, then released as a
//! [`Piece::Call`] and its arguments' chunks. A block that does not parse,
//! or is cut by the end of the generation, is released as content, as
//! written: malformed model output is text, never an error. Whitespace
//! between content and a call, between calls and after the last one is
//! dropped, as the template writes it back (`content + '\n\n<tool_call>'`).

use serde_json::{Map, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// What the parser released, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Answer text.
    Content(String),
    /// A call begins: its index among this answer's calls and its name.
    Call { index: usize, name: String },
    /// The next chunk of call `index`'s arguments (JSON text of an object;
    /// the chunks joined are the whole).
    Arguments { index: usize, chunk: String },
}

/// One whole call: its function's name and arguments (JSON text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// An answer split into content and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<Call>,
}

/// Parses a whole answer (what streaming it piece by piece gives, joined).
pub fn parse(text: &str, tools: &[Value]) -> Parsed {
    let mut parser = ToolCallParser::new(tools.to_vec());
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    join(pieces)
}

/// Joins released pieces into content and whole calls.
pub fn join(pieces: Vec<Piece>) -> Parsed {
    let mut parsed = Parsed::default();
    for piece in pieces {
        match piece {
            Piece::Content(text) => parsed.content.push_str(&text),
            Piece::Call { name, .. } => parsed.calls.push(Call {
                name,
                arguments: String::new(),
            }),
            Piece::Arguments { index, chunk } => {
                if let Some(call) = parsed.calls.get_mut(index) {
                    call.arguments.push_str(&chunk);
                }
            }
        }
    }
    parsed
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Outside a call.
    Text,
    /// Inside `<tool_call>`; `held[..ws]` is the whitespace before it.
    Block { ws: usize },
}

/// The streaming parser of one answer.
#[derive(Clone, Debug)]
pub struct ToolCallParser {
    tools: Vec<Value>,
    state: State,
    held: String,
    calls: usize,
}

impl ToolCallParser {
    /// A parser for an answer to a request with these tools (OpenAI
    /// function schemas, which type the arguments).
    pub fn new(tools: Vec<Value>) -> Self {
        ToolCallParser {
            tools,
            state: State::Text,
            held: String::new(),
            calls: 0,
        }
    }

    /// Calls released so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds the next piece of the answer.
    pub fn push(&mut self, piece: &str) -> Vec<Piece> {
        self.held.push_str(piece);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Text => {
                    if let Some(at) = self.held.find(OPEN) {
                        let ws = self.held[..at].trim_end().len();
                        self.content(&mut out, ws);
                        self.state = State::Block {
                            ws: self.held.find(OPEN).unwrap_or(0),
                        };
                        continue;
                    }
                    // Hold a possible partial `<tool_call>` and the
                    // whitespace before it.
                    let tag = partial_suffix(&self.held, OPEN);
                    let keep = self.held[..self.held.len() - tag].trim_end().len();
                    self.content(&mut out, keep);
                    return out;
                }
                State::Block { ws } => {
                    let Some(at) = self.held[ws..].find(CLOSE) else {
                        return out;
                    };
                    let end = ws + at + CLOSE.len();
                    match parse_block(&self.held[ws..end], &self.tools) {
                        Some((name, chunks)) => {
                            let index = self.calls;
                            self.calls += 1;
                            out.push(Piece::Call { index, name });
                            out.extend(
                                chunks
                                    .into_iter()
                                    .map(|chunk| Piece::Arguments { index, chunk }),
                            );
                            self.held.drain(..end);
                        }
                        None => self.content(&mut out, end),
                    }
                    self.state = State::Text;
                }
            }
        }
    }

    /// The answer ended: what is held is content (a call cut short
    /// included), but for whitespace after the last call.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        self.state = State::Text;
        if held.is_empty() || (self.calls > 0 && held.trim().is_empty()) {
            return Vec::new();
        }
        vec![Piece::Content(held)]
    }

    /// Releases `held[..n]` as content.
    fn content(&mut self, out: &mut Vec<Piece>, n: usize) {
        if n == 0 {
            return;
        }
        let text: String = self.held.drain(..n).collect();
        match out.last_mut() {
            Some(Piece::Content(last)) => last.push_str(&text),
            _ => out.push(Piece::Content(text)),
        }
    }
}

/// Bytes at the end of `text` that are a proper prefix of `tag`.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// A whole `<tool_call>...</tool_call>` block: the function's name and its
/// arguments as JSON chunks (`{`, one per argument, `}`); None when it is
/// not a well-formed call.
fn parse_block(block: &str, tools: &[Value]) -> Option<(String, Vec<String>)> {
    let inner = block.strip_prefix(OPEN)?.strip_suffix(CLOSE)?.trim();
    let (name, arguments) = if inner.starts_with('{') {
        json_call(inner)?
    } else {
        xml_call(inner, tools)?
    };
    let mut chunks = vec!["{".to_owned()];
    for (i, (key, value)) in arguments.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let key = serde_json::to_string(key).ok()?;
        let value = serde_json::to_string(value).ok()?;
        chunks.push(format!("{comma}{key}:{value}"));
    }
    chunks.push("}".to_owned());
    Some((name, chunks))
}

/// Qwen3's form: `{"name": ..., "arguments": {...}}` (arguments may also
/// be JSON text of an object, or absent).
fn json_call(inner: &str) -> Option<(String, Map<String, Value>)> {
    let Value::Object(mut call) = serde_json::from_str(inner).ok()? else {
        return None;
    };
    let name = match call.remove("name")? {
        Value::String(name) if plain_name(&name) => name,
        _ => return None,
    };
    let arguments = match call
        .remove("arguments")
        .or_else(|| call.remove("parameters"))
    {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(Value::String(text)) => match serde_json::from_str(&text).ok()? {
            Value::Object(map) => map,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some((name, arguments))
}

/// Qwen3.5/3.6's form: `<function=NAME>` then `<parameter=ARG>\nVALUE\n</parameter>`
/// per argument, then `</function>`.
fn xml_call(inner: &str, tools: &[Value]) -> Option<(String, Map<String, Value>)> {
    let rest = inner.strip_prefix("<function=")?;
    let end = rest.find('>')?;
    let name = rest[..end].trim();
    if !plain_name(name) {
        return None;
    }
    let schema = tool_schema(tools, name);
    let mut arguments = Map::new();
    let mut rest = &rest[end + 1..];
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("</function>") {
            return after
                .trim()
                .is_empty()
                .then(|| (name.to_owned(), arguments));
        }
        let after = rest.strip_prefix("<parameter=")?;
        let end = after.find('>')?;
        let key = after[..end].trim();
        if !plain_name(key) || arguments.contains_key(key) {
            return None;
        }
        let after = &after[end + 1..];
        let close = after.find("</parameter>")?;
        let value = &after[..close];
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let types = schema.map_or_else(Vec::new, |s| property_types(s, key));
        arguments.insert(key.to_owned(), typed(value, &types));
        rest = &after[close + "</parameter>".len()..];
    }
}

/// A function or parameter name: one line, no markup.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['<', '>', '\n'])
}

/// The `parameters` schema of the tool named `name` (OpenAI's
/// `{"type": "function", "function": {...}}` or a bare function).
fn tool_schema<'a>(tools: &'a [Value], name: &str) -> Option<&'a Value> {
    tools.iter().find_map(|tool| {
        let function = tool.get("function").unwrap_or(tool);
        (function.get("name")?.as_str()? == name).then(|| function.get("parameters"))?
    })
}

/// The JSON types a parameter's schema allows (`type`: a name or a list).
fn property_types(schema: &Value, key: &str) -> Vec<String> {
    match schema.pointer(&format!(
        "/properties/{}",
        key.replace('~', "~0").replace('/', "~1")
    )) {
        Some(property) => match property.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        },
        None => Vec::new(),
    }
}

/// A parameter's value as its schema types it: strings (or no type given)
/// as written, other types read as JSON / Python literals when they fit.
fn typed(value: &str, types: &[String]) -> Value {
    if types.iter().all(|t| t == "string") {
        return Value::String(value.to_owned());
    }
    let trimmed = value.trim();
    let parsed = match trimmed {
        "True" => Some(Value::Bool(true)),
        "False" => Some(Value::Bool(false)),
        "None" => Some(Value::Null),
        _ => serde_json::from_str(trimmed).ok(),
    };
    match parsed {
        Some(parsed) if types.iter().any(|t| fits(&parsed, t)) => parsed,
        _ => Value::String(value.to_owned()),
    }
}

fn fits(value: &Value, kind: &str) -> bool {
    match kind {
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        "string" => value.is_string(),
        _ => false,
    }
}

#[cfg(test)]
#[path = "tool_calls_tests.rs"]
mod tests;
