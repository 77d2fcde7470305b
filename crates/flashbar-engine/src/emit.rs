//! Committing tokens: EOS and stop sequences end the generation, text goes
//! out in UTF-8-safe deltas, and every token reaches the sink with its origin.
//! Both decoding loops commit through here, one token at a time, so a block
//! is cut at EOS / a stop sequence / max_tokens before anything past it shows.

use crate::detokenize::StreamDecoder;
use crate::error::Result;
use crate::sink::{FinishReason, Sink};
use crate::stop::{StopMatcher, StopOutcome};
use crate::tokenizer::TextTokenizer;

pub struct Emitter<'a> {
    tokenizer: &'a TextTokenizer,
    decoder: StreamDecoder,
    stop: StopMatcher,
    pub text: String,
    pub ids: Vec<u32>,
}

impl<'a> Emitter<'a> {
    pub fn new(tokenizer: &'a TextTokenizer, stops: Vec<String>) -> Self {
        Emitter {
            tokenizer,
            decoder: StreamDecoder::default(),
            stop: StopMatcher::new(stops),
            text: String::new(),
            ids: Vec::new(),
        }
    }

    /// Commits `id`; `Some(Stop)` when it ends the generation (EOS is not
    /// emitted, a stop sequence is cut out).
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
        sink.token(id, from_draft);
        let delta = self.decoder.push(self.tokenizer, id)?;
        match self.stop.push(&delta) {
            StopOutcome::Continue(text) => self.send(&text, sink),
            StopOutcome::Stopped(text) => {
                self.send(&text, sink);
                return Ok(Some(FinishReason::Stop));
            }
        }
        Ok(None)
    }

    /// Releases held-back text when the generation ends for another reason.
    pub fn flush(&mut self, sink: &mut dyn Sink) -> Result<()> {
        let tail = self.decoder.finish(self.tokenizer)?;
        let text = match self.stop.push(&tail) {
            StopOutcome::Continue(text) => text + &self.stop.finish(),
            StopOutcome::Stopped(text) => text,
        };
        self.send(&text, sink);
        Ok(())
    }

    fn send(&mut self, text: &str, sink: &mut dyn Sink) {
        if !text.is_empty() {
            self.text.push_str(text);
            sink.text(text);
        }
    }
}
