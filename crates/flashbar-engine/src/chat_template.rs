//! Chat templates from `tokenizer_config.json`, rendered with minijinja.
//!
//! Templates come with downloaded models, so they are treated as untrusted:
//! rendering has a fuel budget (no endless loops) and an output size cap.

use crate::error::{EngineError, Result};
use minijinja::{context, Environment};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// Instructions a template may execute before it is stopped.
const FUEL: u64 = 2_000_000;
/// Largest prompt text a template may produce.
const MAX_OUTPUT_BYTES: usize = 8 << 20;

pub fn render(template: &str, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(64);
    // Python-style string methods (`.strip()`, `.startswith()`) that HF templates use.
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| EngineError::Template(one_line(&e)))?;
    let rendered = env
        .get_template("chat")
        .and_then(|t| {
            t.render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => "",
                eos_token => "",
            })
        })
        .map_err(|e| EngineError::Template(one_line(&e)))?;
    if rendered.len() > MAX_OUTPUT_BYTES {
        return Err(EngineError::Template(format!(
            "the chat template produced {} bytes (limit {MAX_OUTPUT_BYTES})",
            rendered.len()
        )));
    }
    Ok(rendered)
}

fn one_line(error: &minijinja::Error) -> String {
    error
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(content: &str) -> Vec<Message> {
        vec![Message {
            role: "user".into(),
            content: content.into(),
        }]
    }

    #[test]
    fn python_string_methods_work() {
        let out = render("{{ messages[0].content.strip() }}", &user("  hi  "), false).unwrap();
        assert_eq!(out, "hi");
    }

    #[test]
    fn an_endless_template_runs_out_of_fuel() {
        let template =
            "{% for i in range(10000) %}{% for j in range(10000) %}{{ j }}{% endfor %}{% endfor %}";
        let error = render(template, &user("x"), false).unwrap_err();
        assert!(error.to_string().contains("fuel"), "{error}");
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let error =
            render("{{ raise_exception('no system role') }}", &user("x"), false).unwrap_err();
        assert!(error.to_string().contains("no system role"), "{error}");
    }
}
