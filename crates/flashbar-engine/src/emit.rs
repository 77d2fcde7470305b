//! Committing tokens: EOS and stop sequences end the generation, each token
//! reaches the sink with its origin and the UTF-8-safe text it released.
//! Both decoding loops commit through here, one token at a time, so a block
//! is cut at EOS / a stop sequence / max_tokens before anything past it shows.

use crate::detokenize::StreamDecoder;
use crate::error::Result;
use crate::sink::{Commit, FinishReason, Sink};
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
        self.text.push_str(&text);
        let go_on = sink.commit(&Commit {
            token: Some(id),
            from_draft,
            text: &text,
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
        if !text.is_empty() {
            self.text.push_str(&text);
            // The generation ends either way: what the sink answers is moot.
            sink.commit(&Commit {
                token: None,
                from_draft: false,
                text: &text,
            });
        }
        Ok(())
    }
}
