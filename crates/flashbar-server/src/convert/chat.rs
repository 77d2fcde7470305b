//! A chat request's messages, tools, `tool_choice` and
//! `chat_template_kwargs`, checked and shaped the way the chat template
//! takes them (docs/templates.md): tool call arguments become JSON objects,
//! `tool_choice: "none"` renders no tools, a named function renders only
//! that one. Anything malformed is a 400 naming its path.

use crate::api::{ChatMessage, Content};
use crate::error::ApiError;
use flashbar_engine::chat_template::{FunctionCall, TemplateArgs, ToolCall};
use flashbar_engine::Message;
use serde_json::{Map, Value};

/// Keyword arguments a request may not set: the template's own inputs.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A string field, absent or null being `None`.
fn text(value: Option<&Value>, param: &str) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(
            param,
            format!("{param} must be a string, not {}", kind(other)),
        )),
    }
}

/// The template's tools and keyword arguments.
pub fn template_args(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    kwargs: Option<&Value>,
) -> Result<TemplateArgs, ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(other) => {
            return Err(bad(
                "tools",
                format!("tools must be an array, not {}", kind(other)),
            ))
        }
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        names.push(tool_name(i, tool)?);
    }
    let chosen = match tool_choice {
        None | Some(Value::Null) => tools,
        Some(Value::String(mode)) if mode == "auto" => tools,
        Some(Value::String(mode)) if mode == "none" => Vec::new(),
        Some(Value::String(mode)) => {
            return Err(bad(
                "tool_choice",
                format!("tool_choice \"{mode}\" is not supported: use \"auto\", \"none\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
            ))
        }
        Some(choice @ Value::Object(_)) => {
            let name = choice
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice", "tool_choice must name its function: {\"type\": \"function\", \"function\": {\"name\": ...}}"))?;
            match names.iter().position(|n| n == name) {
                Some(at) => vec![tools[at].clone()],
                None => {
                    return Err(bad(
                        "tool_choice",
                        format!("tool_choice names the function \"{name}\", which is not in tools"),
                    ))
                }
            }
        }
        Some(other) => {
            return Err(bad(
                "tool_choice",
                format!("tool_choice must be a string or an object, not {}", kind(other)),
            ))
        }
    };
    let kwargs = match kwargs {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => {
            return Err(bad(
                "chat_template_kwargs",
                format!(
                    "chat_template_kwargs must be an object, not {}",
                    kind(other)
                ),
            ))
        }
    };
    if let Some(key) = RESERVED.iter().find(|k| kwargs.contains_key(**k)) {
        return Err(bad(
            "chat_template_kwargs",
            format!("chat_template_kwargs may not set \"{key}\": it is the template's own input"),
        ));
    }
    for key in ["enable_thinking", "preserve_thinking"] {
        if let Some(value) = kwargs.get(key).filter(|v| !v.is_boolean()) {
            return Err(bad(
                &format!("chat_template_kwargs.{key}"),
                format!(
                    "chat_template_kwargs.{key} must be true or false, not {}",
                    kind(value)
                ),
            ));
        }
    }
    Ok(TemplateArgs {
        tools: (!chosen.is_empty()).then_some(chosen),
        kwargs,
    })
}

/// Checks one tool schema and answers its function's name.
fn tool_name(i: usize, tool: &Value) -> Result<String, ApiError> {
    let param = format!("tools[{i}]");
    let Value::Object(fields) = tool else {
        return Err(bad(
            &param,
            format!("{param} must be an object, not {}", kind(tool)),
        ));
    };
    if let Some(t) = fields
        .get("type")
        .filter(|t| t.as_str() != Some("function"))
    {
        return Err(bad(
            &format!("{param}.type"),
            format!("{param}.type must be \"function\", not {t}"),
        ));
    }
    let function = match fields.get("function") {
        Some(Value::Object(function)) => function,
        _ => {
            return Err(bad(
                &format!("{param}.function"),
                format!("{param}.function must be an object"),
            ))
        }
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => {
            return Err(bad(
                &format!("{param}.function.name"),
                format!("{param}.function.name must be a non-empty string"),
            ))
        }
    };
    if let Some(p) = function.get("parameters").filter(|p| !p.is_object()) {
        return Err(bad(
            &format!("{param}.function.parameters"),
            format!(
                "{param}.function.parameters must be a JSON schema object, not {}",
                kind(p)
            ),
        ));
    }
    text(
        function.get("description"),
        &format!("{param}.function.description"),
    )?;
    Ok(name)
}

/// One message, as the template takes it.
pub fn message(i: usize, message: ChatMessage) -> Result<Message, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let content = match message.content {
        None => String::new(),
        Some(Content::Text(text)) => text,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        return Err(bad(
                            &at("content"),
                            format!("content parts of type \"{kind}\" are not supported"),
                        ))
                    }
                }
            }
            text
        }
    };
    let role = message.role;
    let reasoning = match text(message.reasoning_content.as_ref(), &at("reasoning_content"))? {
        Some(r) => Some(r),
        None => text(message.reasoning.as_ref(), &at("reasoning"))?,
    };
    let tool_call_id = text(message.tool_call_id.as_ref(), &at("tool_call_id"))?;
    let name = text(message.name.as_ref(), &at("name"))?;
    let tool_calls = match message.tool_calls {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, call)| tool_call(&at(&format!("tool_calls[{j}]")), call))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(bad(
                &at("tool_calls"),
                format!(
                    "{} must be an array, not {}",
                    at("tool_calls"),
                    kind(&other)
                ),
            ))
        }
    };
    if role != "assistant" && (reasoning.is_some() || !tool_calls.is_empty()) {
        let field = if tool_calls.is_empty() {
            "reasoning_content"
        } else {
            "tool_calls"
        };
        return Err(bad(
            &at(field),
            format!("{field} belongs on assistant messages, not on a \"{role}\" message"),
        ));
    }
    if role != "tool" && tool_call_id.is_some() {
        return Err(bad(
            &at("tool_call_id"),
            format!("tool_call_id belongs on tool messages, not on a \"{role}\" message"),
        ));
    }
    Ok(Message {
        role,
        content,
        reasoning_content: reasoning,
        tool_calls,
        tool_call_id,
        name,
    })
}

/// One call: `{"id"?, "type"?: "function", "function": {"name", "arguments"}}`,
/// its arguments JSON text of an object (as OpenAI sends them) or an object.
fn tool_call(param: &str, call: &Value) -> Result<ToolCall, ApiError> {
    let Value::Object(fields) = call else {
        return Err(bad(
            param,
            format!("{param} must be an object, not {}", kind(call)),
        ));
    };
    if let Some(t) = fields
        .get("type")
        .filter(|t| t.as_str() != Some("function"))
    {
        return Err(bad(
            &format!("{param}.type"),
            format!("{param}.type must be \"function\", not {t}"),
        ));
    }
    let id = text(fields.get("id"), &format!("{param}.id"))?;
    let Some(Value::Object(function)) = fields.get("function") else {
        return Err(bad(
            &format!("{param}.function"),
            format!("{param}.function must be an object"),
        ));
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => {
            return Err(bad(
                &format!("{param}.function.name"),
                format!("{param}.function.name must be a non-empty string"),
            ))
        }
    };
    let param = format!("{param}.function.arguments");
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(json)) if json.trim().is_empty() => Value::Object(Map::new()),
        Some(Value::String(json)) => match serde_json::from_str::<Value>(json) {
            Ok(object @ Value::Object(_)) => object,
            Ok(other) => {
                return Err(bad(
                    &param,
                    format!("{param} must hold a JSON object, not {}", kind(&other)),
                ))
            }
            Err(e) => return Err(bad(&param, format!("{param} is not valid JSON: {e}"))),
        },
        Some(object @ Value::Object(_)) => object.clone(),
        Some(other) => {
            return Err(bad(
                &param,
                format!(
                    "{param} must be a JSON object or its text, not {}",
                    kind(other)
                ),
            ))
        }
    };
    Ok(ToolCall {
        id,
        kind: "function".into(),
        function: FunctionCall { name, arguments },
    })
}
