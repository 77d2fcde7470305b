//! The checkpoint's tokenizer (`tokenizer.json`, through the `tokenizers`
//! crate) with what generation needs from `tokenizer_config.json` and
//! `config.json`: the end-of-sequence ids and the chat template.

use crate::error::{EngineError, Result};
use std::collections::BTreeSet;
use std::path::Path;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: BTreeSet<u32>,
    chat_template: Option<String>,
    template_defaults: serde_json::Map<String, serde_json::Value>,
}

impl TextTokenizer {
    pub fn load(dir: &Path) -> Result<Self> {
        let file = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", file.display())))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let model_config = read_json(&dir.join("config.json"))?;

        let mut eos_ids = BTreeSet::new();
        if let Some(token) = config.get("eos_token").and_then(token_text) {
            eos_ids.extend(inner.token_to_id(token));
        }
        for source in [
            &model_config,
            model_config
                .get("text_config")
                .unwrap_or(&serde_json::Value::Null),
        ] {
            match source.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => eos_ids.extend(n.as_u64().map(|n| n as u32)),
                Some(serde_json::Value::Array(ids)) => {
                    eos_ids.extend(ids.iter().filter_map(|v| v.as_u64()).map(|n| n as u32))
                }
                _ => {}
            }
        }
        // `chat_template.jinja` beside the config wins, as in transformers
        // (recent checkpoints, Qwen3.5's among them, ship it there).
        let file = dir.join("chat_template.jinja");
        let chat_template = match std::fs::read_to_string(&file) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => config
                .get("chat_template")
                .and_then(|t| t.as_str())
                .map(str::to_owned),
            Err(e) => return Err(EngineError::Tokenizer(format!("{}: {e}", file.display()))),
        };
        // The model's defaults for the template's keyword arguments, under
        // what a request sets (docs/templates.md).
        let template_defaults = config
            .get("chat_template_kwargs")
            .and_then(|k| k.as_object())
            .cloned()
            .unwrap_or_default();
        Ok(TextTokenizer {
            inner,
            eos_ids,
            chat_template,
            template_defaults,
        })
    }

    /// Token ids of `text`; special tokens written in it (`<|im_start|>`) are
    /// recognized, and no BOS/EOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included (generation never emits them
    /// except EOS, which ends it first).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub fn eos_ids(&self) -> &BTreeSet<u32> {
        &self.eos_ids
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// `chat_template_kwargs` of `tokenizer_config.json`: keyword arguments
    /// the template gets unless the request sets them.
    pub fn template_defaults(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.template_defaults
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// `eos_token` is either a string or an object with `content`.
fn token_text(value: &serde_json::Value) -> Option<&str> {
    value
        .as_str()
        .or_else(|| value.get("content").and_then(|c| c.as_str()))
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::Value::Null),
        Err(e) => Err(EngineError::Tokenizer(format!("{}: {e}", path.display()))),
    }
}
