//! What to generate.

use crate::chat_template::{Message, TemplateArgs};
use crate::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum Speculation {
    /// DFlash when a drafter is loaded and the gate says it pays, else plain.
    Auto,
    /// Always DFlash (an error without a drafter).
    Dflash,
    /// Plain decoding.
    Off,
}

impl Speculation {
    /// Its name on the wire and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Speculation::Auto => "auto",
            Speculation::Dflash => "dflash",
            Speculation::Off => "off",
        }
    }
}

#[derive(Clone, Debug)]
pub enum Prompt {
    /// Raw text, tokenized as is.
    Text(String),
    /// Chat messages, rendered with the model's chat template.
    Messages(Vec<Message>),
}

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub speculation: Speculation,
    /// Tokens per DFlash verify (last token + drafts); None = the drafter's.
    pub block_size: Option<usize>,
    /// Tools and keyword arguments for the chat template (messages only).
    pub template: TemplateArgs,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt) -> Self {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens: 256,
            stop: Vec::new(),
            speculation: Speculation::Auto,
            block_size: None,
            template: TemplateArgs::default(),
        }
    }
}

/// The one cancel switch of every crate (a queued or running generation,
/// a download): clone it, `.cancel()` from any thread, `.is_cancelled()`
/// or `.cancelled().await` where the work runs. The worker's sink answers
/// "stop" once its job's token is cancelled.
pub type CancelToken = tokio_util::sync::CancellationToken;
