//! A stand-in model for tests of the worker and of what stands on it (the
//! HTTP server): it echoes one word per token, `w0 w1 ...`, slowly when
//! asked, and checks requests the way the engine does (a context of 64
//! tokens, one per prompt word; no drafter). Built for this crate's tests
//! and, with the `echo` feature, for other crates' tests.
//!
//! [`ScriptedBackend`] answers a chat with a scripted reply instead, cut
//! into pieces of a few characters (one "token" each) and split into
//! reasoning and answer as the engine splits them: the stand-in the tests
//! of thinking and tool-call parsing use, since the embedded model writes
//! neither (`docs/thinking-and-tools.md`).

use super::{Backend, Worker, DEFAULT_QUEUE_CAPACITY as DEFAULT_CAPACITY};
use crate::error::EngineError;
use crate::reasoning::ReasoningSplitter;
use crate::request::{GenerateRequest, Prompt, Speculation};
use crate::sink::{Begin, Commit, FinishReason, Generation, Sink, Totals};
use std::time::Duration;

/// The stand-in's context, in tokens.
pub const ECHO_CONTEXT: usize = 64;

pub struct EchoBackend {
    /// Time per token.
    pub delay: Duration,
}

impl Backend for EchoBackend {
    fn context_length(&self) -> usize {
        ECHO_CONTEXT
    }

    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Generation, EngineError> {
        let (field, prompt_tokens) = match &request.prompt {
            Prompt::Text(text) => ("prompt", text.split_whitespace().count()),
            Prompt::Messages(messages) => ("messages", messages.len()),
        };
        if request.speculation == Speculation::Dflash {
            return Err(EngineError::InvalidParam {
                param: "speculation",
                message: "speculation \"dflash\" needs a drafter, and none is loaded".into(),
            });
        }
        if prompt_tokens >= ECHO_CONTEXT {
            return Err(EngineError::InvalidParam {
                param: field,
                message: format!(
                    "the prompt has {prompt_tokens} tokens; the model's context is {ECHO_CONTEXT}"
                ),
            });
        }
        let mut text = String::new();
        let mut ids = Vec::new();
        let mut finish = FinishReason::Length;
        if !sink.begin(&Begin { prompt_tokens }) {
            finish = FinishReason::Cancelled;
        }
        for i in 0..request.max_tokens {
            if finish != FinishReason::Length {
                break;
            }
            std::thread::sleep(self.delay);
            let word = format!("w{i} ");
            text.push_str(&word);
            ids.push(i as u32);
            let go_on = sink.commit(&Commit {
                token: Some(i as u32),
                from_draft: i % 2 == 1,
                reasoning: "",
                text: &word,
            });
            if !go_on {
                finish = FinishReason::Cancelled;
            }
        }
        let generation = Generation {
            stats: Totals {
                prompt_tokens,
                completion_tokens: ids.len(),
                ..Totals::default()
            },
            text,
            reasoning: String::new(),
            token_ids: ids,
            finish_reason: finish,
        };
        sink.finish(&generation);
        Ok(generation)
    }
}

/// A stand-in that answers each chat with a scripted reply: the one whose
/// key equals the content of the chat's last message (else the reply keyed
/// `""`, else an error). The reply is what a model would write after the
/// prompt; it starts inside a think block when the request's template
/// arguments set `enable_thinking: true` (Qwen3.5's template opens one
/// then), and is cut into `piece_chars`-character tokens.
pub struct ScriptedBackend {
    pub replies: Vec<(String, String)>,
    pub piece_chars: usize,
    pub delay: Duration,
}

impl ScriptedBackend {
    fn reply(&self, request: &GenerateRequest) -> Result<&str, EngineError> {
        let Prompt::Messages(messages) = &request.prompt else {
            return Err(EngineError::param(
                "prompt",
                "the scripted stand-in answers chats only",
            ));
        };
        let last = messages.last().map_or("", |m| m.content.as_str());
        self.replies
            .iter()
            .find(|(key, _)| key == last)
            .or_else(|| self.replies.iter().find(|(key, _)| key.is_empty()))
            .map(|(_, reply)| reply.as_str())
            .ok_or_else(|| EngineError::param("messages", "no scripted reply for this chat"))
    }
}

impl Backend for ScriptedBackend {
    fn context_length(&self) -> usize {
        ECHO_CONTEXT * 64
    }

    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Generation, EngineError> {
        let reply = self.reply(request)?;
        let inside = request.template.kwargs.get("enable_thinking") == Some(&true.into());
        let mut splitter = ReasoningSplitter::new(inside);
        let chars: Vec<char> = reply.chars().collect();
        let pieces: Vec<String> = chars
            .chunks(self.piece_chars.max(1))
            .map(|c| c.iter().collect())
            .collect();
        let mut generation = Generation {
            text: String::new(),
            reasoning: String::new(),
            token_ids: Vec::new(),
            finish_reason: FinishReason::Stop,
            stats: Totals {
                prompt_tokens: 1,
                ..Totals::default()
            },
        };
        if !sink.begin(&Begin { prompt_tokens: 1 }) {
            generation.finish_reason = FinishReason::Cancelled;
        }
        for (i, piece) in pieces.iter().enumerate() {
            if generation.finish_reason != FinishReason::Stop {
                break;
            }
            if i == request.max_tokens {
                generation.finish_reason = FinishReason::Length;
                break;
            }
            std::thread::sleep(self.delay);
            let mut split = splitter.push(piece);
            if splitter.last_was_reasoning() {
                generation.stats.reasoning_tokens += 1;
            }
            if i + 1 == pieces.len() {
                let tail = splitter.finish();
                split.reasoning += &tail.reasoning;
                split.content += &tail.content;
            }
            generation.reasoning += &split.reasoning;
            generation.text += &split.content;
            generation.token_ids.push(i as u32);
            let go_on = sink.commit(&Commit {
                token: Some(i as u32),
                from_draft: false,
                reasoning: &split.reasoning,
                text: &split.content,
            });
            if !go_on {
                generation.finish_reason = FinishReason::Cancelled;
            }
        }
        if generation.finish_reason != FinishReason::Stop {
            let tail = splitter.finish();
            generation.reasoning += &tail.reasoning;
            generation.text += &tail.content;
            if !(tail.reasoning.is_empty() && tail.content.is_empty()) {
                sink.commit(&Commit {
                    token: None,
                    from_draft: false,
                    reasoning: &tail.reasoning,
                    text: &tail.content,
                });
            }
        }
        generation.stats.completion_tokens = generation.token_ids.len();
        sink.finish(&generation);
        Ok(generation)
    }
}

/// A worker over [`ScriptedBackend`]: `replies` as (last message, reply).
pub fn scripted_worker(replies: Vec<(String, String)>, piece_chars: usize) -> Worker {
    let spawned = Worker::spawn(DEFAULT_CAPACITY, move || {
        Ok::<_, EngineError>(ScriptedBackend {
            replies,
            piece_chars,
            delay: Duration::ZERO,
        })
    });
    match spawned {
        Ok(worker) => worker,
        Err(error) => unreachable!("the stand-in always loads: {error}"),
    }
}

/// A worker over the stand-in: `capacity` requests may wait, each token
/// takes `delay_ms`.
pub fn echo_worker(capacity: usize, delay_ms: u64) -> Worker {
    let spawned = Worker::spawn(capacity, move || {
        Ok::<_, EngineError>(EchoBackend {
            delay: Duration::from_millis(delay_ms),
        })
    });
    match spawned {
        Ok(worker) => worker,
        Err(error) => unreachable!("the stand-in always loads: {error}"),
    }
}
