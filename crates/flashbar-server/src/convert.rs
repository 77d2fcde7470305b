//! From OpenAI request bodies to engine requests, checking every value
//! (a bad one is a 400 naming its field).

use crate::api::{ChatRequest, Common, CompletionRequest, PromptText, Stop};
use crate::error::ApiError;
use flashbar_engine::{GenerateRequest, Prompt, SamplingParams, Speculation};

mod chat;

/// The models this server answers to: its id, and "default".
#[derive(Clone, Debug)]
pub struct ModelNames {
    pub id: String,
}

impl ModelNames {
    pub const ALIAS: &'static str = "default";

    /// The canonical id for a requested model (none: this one), or 404.
    pub fn resolve(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match requested {
            None | Some("") | Some(Self::ALIAS) => Ok(self.id.clone()),
            Some(name) if name == self.id => Ok(self.id.clone()),
            Some(name) => Err(ApiError::model_not_found(name)),
        }
    }
}

/// A checked request: what to generate and how to answer.
#[derive(Debug)]
pub struct Parsed {
    pub model: String,
    pub request: GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
}

/// Parses a JSON body (any content type), as a 400 when malformed.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

pub fn chat(body: ChatRequest, names: &ModelNames, context: usize) -> Result<Parsed, ApiError> {
    if body.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must hold at least one message",
        ));
    }
    let template = chat::template_args(
        body.tools.as_ref(),
        body.tool_choice.as_ref(),
        body.chat_template_kwargs.as_ref(),
    )?;
    let mut messages = Vec::with_capacity(body.messages.len());
    for (i, message) in body.messages.into_iter().enumerate() {
        messages.push(chat::message(i, message)?);
    }
    let mut parsed = common(
        body.common,
        Prompt::Messages(messages),
        names,
        context,
        None,
    )?;
    parsed.request.template = template;
    Ok(parsed)
}

pub fn completion(
    body: CompletionRequest,
    names: &ModelNames,
    context: usize,
) -> Result<Parsed, ApiError> {
    let prompt = match body.prompt {
        Some(PromptText::One(text)) => text,
        Some(PromptText::Many(mut texts)) if texts.len() == 1 => texts.remove(0),
        Some(PromptText::Many(_)) => {
            return Err(ApiError::invalid_param(
                "prompt",
                "only one prompt per request is supported",
            ))
        }
        None => return Err(ApiError::invalid_param("prompt", "prompt is required")),
    };
    // The legacy endpoint's default, as OpenAI documents it.
    common(body.common, Prompt::Text(prompt), names, context, Some(16))
}

fn common(
    c: Common,
    prompt: Prompt,
    names: &ModelNames,
    context: usize,
    default_max_tokens: Option<usize>,
) -> Result<Parsed, ApiError> {
    let model = names.resolve(c.model.as_deref())?;
    if let Some(n) = c.n {
        if n != 1 {
            return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
        }
    }
    let (param, max_tokens) = match (c.max_completion_tokens, c.max_tokens) {
        (Some(v), _) => ("max_completion_tokens", Some(v)),
        (None, v) => ("max_tokens", v),
    };
    let max_tokens = match max_tokens {
        Some(v) if v < 1 => {
            return Err(ApiError::invalid_param(
                param,
                format!("{param} must be at least 1, got {v}"),
            ))
        }
        // The engine caps it again to what the prompt leaves of the context.
        Some(v) => (v as u64).min(context as u64) as usize,
        None => default_max_tokens.unwrap_or(context),
    };
    let defaults = SamplingParams::default();
    let temperature = c.temperature.unwrap_or(1.0);
    let top_k = match c.top_k {
        Some(k) if k < 0 => return Err(ApiError::invalid_param("top_k", "top_k must be >= 0")),
        Some(k) => k as usize,
        None => defaults.top_k,
    };
    let sampling = SamplingParams {
        temperature,
        top_p: c.top_p.unwrap_or(defaults.top_p),
        top_k,
        min_p: c.min_p.unwrap_or(defaults.min_p),
        seed: c.seed.map_or(defaults.seed, |s| s as u64),
    };
    // Checked here too (not only on the engine thread) so a bad value is
    // refused before the request waits in the queue.
    sampling.validate()?;
    let block_size = match c.block_size {
        Some(b) if b < 1 => {
            return Err(ApiError::invalid_param(
                "block_size",
                "block_size must be at least 1",
            ))
        }
        Some(b) => Some(b as usize),
        None => None,
    };
    let stop = match c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let mut request = GenerateRequest::new(prompt);
    request.sampling = sampling;
    request.max_tokens = max_tokens;
    request.stop = stop;
    request.speculation = c.speculation.unwrap_or(Speculation::Auto);
    request.block_size = block_size;
    Ok(Parsed {
        model,
        request,
        stream: c.stream.unwrap_or(false),
        include_usage: c
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

#[cfg(test)]
#[path = "convert/chat_tests.rs"]
mod chat_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> ModelNames {
        ModelNames {
            id: "target".into(),
        }
    }

    fn chat_json(json: &str) -> Result<Parsed, ApiError> {
        chat(parse_json(json.as_bytes())?, &names(), 100)
    }

    #[test]
    fn models_resolve_by_id_or_alias() {
        assert_eq!(names().resolve(Some("default")).unwrap(), "target");
        assert_eq!(names().resolve(Some("target")).unwrap(), "target");
        assert_eq!(names().resolve(None).unwrap(), "target");
        let e = names().resolve(Some("gpt-4")).unwrap_err();
        assert_eq!(e.status.as_u16(), 404);
    }

    #[test]
    fn a_chat_request_becomes_an_engine_request() {
        let p = chat_json(
            r#"{"model":"default","messages":[{"role":"user","content":"hi"}],
                "temperature":0,"max_tokens":1000,"stop":["a",""],"seed":3,
                "speculation":"dflash","stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(p.model, "target");
        assert_eq!(p.request.max_tokens, 100); // capped to the context
        assert_eq!(p.request.stop, vec!["a".to_string()]);
        assert_eq!(p.request.sampling.seed, 3);
        assert_eq!(p.request.speculation, Speculation::Dflash);
        assert!(p.stream && p.include_usage);
    }

    #[test]
    fn bad_values_are_400_with_their_param() {
        for (json, param) in [
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":5}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#,
                "top_p",
            ),
            (r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#, "n"),
            (r#"{"messages":[]}"#, "messages"),
        ] {
            let e = chat_json(json).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{json}");
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
        }
        let e = chat_json("{not json").unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn completions_take_one_text_prompt() {
        let body = parse_json(br#"{"model":"target","prompt":["def f():"]}"#).unwrap();
        let p = completion(body, &names(), 100).unwrap();
        assert!(matches!(p.request.prompt, Prompt::Text(ref t) if t == "def f():"));
        assert_eq!(p.request.max_tokens, 16);
        let body = parse_json(br#"{"prompt":["a","b"]}"#).unwrap();
        assert_eq!(
            completion(body, &names(), 100).unwrap_err().status.as_u16(),
            400
        );
    }
}
