//! Committing tokens: EOS and stop sequences end the generation, each token
//! reaches the sink with its origin and the UTF-8-safe text it released.
//! Both decoding loops commit through here, one token at a time, so a block
//! is cut at EOS / a stop sequence / max_tokens before anything past it shows.
//! A chat's text then goes through the [`ReasoningSplitter`]: a thinking
//! model's reasoning and its answer reach the sink apart
//! (`docs/thinking-and-tools.md`).

use crate::detokenize::StreamDecoder;
use crate::error::Result;
use crate::reasoning::{ReasoningSplitter, Split};
use crate::sink::{Commit, FinishReason, Sink};
use crate::stop::{StopMatcher, StopOutcome};
use crate::tokenizer::TextTokenizer;

pub struct Emitter<'a> {
    tokenizer: &'a TextTokenizer,
    decoder: StreamDecoder,
    stop: StopMatcher,
    /// None: the text is all answer (a text prompt).
    splitter: Option<ReasoningSplitter>,
    /// The answer.
    pub text: String,
    /// The reasoning (empty unless the splitter found a think block).
    pub reasoning: String,
    /// Tokens committed inside the think block.
    pub reasoning_tokens: usize,
    pub ids: Vec<u32>,
}

impl<'a> Emitter<'a> {
    /// `splitter`: separates reasoning from the answer (chat prompts).
    pub fn new(
        tokenizer: &'a TextTokenizer,
        stops: Vec<String>,
        splitter: Option<ReasoningSplitter>,
    ) -> Self {
        Emitter {
            tokenizer,
            decoder: StreamDecoder::default(),
            stop: StopMatcher::new(stops),
            splitter,
            text: String::new(),
            reasoning: String::new(),
            reasoning_tokens: 0,
            ids: Vec::new(),
        }
    }

    /// Splits released text into reasoning and answer, keeping both, and
    /// counts a token (`token`: the text is one token's, not the tail
    /// released at the end) as reasoning when its text touched the block.
    fn split(&mut self, text: String, token: bool, last: bool) -> Split {
        let split = match &mut self.splitter {
            None => Split {
                reasoning: String::new(),
                content: text,
            },
            Some(splitter) => {
                let mut split = splitter.push(&text);
                if token && splitter.last_was_reasoning() {
                    self.reasoning_tokens += 1;
                }
                if last {
                    let tail = splitter.finish();
                    split.reasoning += &tail.reasoning;
                    split.content += &tail.content;
                }
                split
            }
        };
        self.reasoning.push_str(&split.reasoning);
        self.text.push_str(&split.content);
        split
    }

    /// Commits `id`; `Some(Stop)` when it ends the generation (EOS is not
    /// emitted, a stop sequence is cut out), `Some(Cancelled)` when the
    /// sink wants no more.
    pub fn commit(
        &mut self,
        id: u32,
        from_draft: bool,
        sink: &mut dyn Sink,
    ) -> Result<Option<FinishReason>> {
        if self.tokenizer.is_eos(id) {
            self.flush(sink)?;
            return Ok(Some(FinishReason::Stop));
        }
        self.ids.push(id);
        let delta = self.decoder.push(self.tokenizer, id)?;
        let (text, stopped) = match self.stop.push(&delta) {
            StopOutcome::Continue(text) => (text, false),
            StopOutcome::Stopped(text) => (text, true),
        };
        let split = self.split(text, true, stopped);
        let go_on = sink.commit(&Commit {
            token: Some(id),
            from_draft,
            reasoning: &split.reasoning,
            text: &split.content,
        });
        Ok(match (stopped, go_on) {
            (true, _) => Some(FinishReason::Stop),
            (false, false) => Some(FinishReason::Cancelled),
            (false, true) => None,
        })
    }

    /// Releases held-back text when the generation ends for another reason.
    pub fn flush(&mut self, sink: &mut dyn Sink) -> Result<()> {
        let tail = self.decoder.finish(self.tokenizer)?;
        let text = match self.stop.push(&tail) {
            StopOutcome::Continue(text) => text + &self.stop.finish(),
            StopOutcome::Stopped(text) => text,
        };
        let split = self.split(text, false, true);
        if !(split.reasoning.is_empty() && split.content.is_empty()) {
            // The generation ends either way: what the sink answers is moot.
            sink.commit(&Commit {
                token: None,
                from_draft: false,
                reasoning: &split.reasoning,
                text: &split.content,
            });
        }
        Ok(())
    }
}
