//! Streaming detokenization: text deltas that never split a UTF-8 character.
//!
//! Byte-level BPE tokens can end inside a multi-byte character; decoding
//! then yields U+FFFD. We hold text back until the tail decodes cleanly, and
//! decode a short window of earlier tokens with the new ones so merges across
//! token boundaries come out right.
//!
//! The window stays short whatever the tokens are, so a stream costs time
//! linear in its length:
//! - a token that decodes to nothing, alone and after the window, is left
//!   out of the window (it can add no text later either);
//! - a run of tokens whose text keeps ending in U+FFFD (bytes that are not
//!   UTF-8, which no later byte can mend) is settled once it is longer than
//!   `MAX_PENDING`: the text before its last three tokens is final, because
//!   a UTF-8 character spans at most four bytes, so it is emitted, U+FFFD
//!   included, and the window moves on.
//!
//! Every delta extends the text emitted before it: the deltas joined are
//! always a prefix of decoding all the tokens at once, and equal it after
//! `finish` (the fuzz target `detokenize` checks both).

use crate::error::Result;
use crate::tokenizer::TextTokenizer;

/// Tokens held without text before the window is settled.
const MAX_PENDING: usize = 8;
/// Tokens kept pending when a window is settled (a character spans at most
/// four bytes, and each kept token brings at least one).
const SETTLE_KEEP: usize = 3;

#[derive(Default)]
pub struct StreamDecoder {
    /// Context tokens (their text already emitted), then pending ones.
    window: Vec<u32>,
    /// `window[..read]` is the context.
    read: usize,
    /// Tokens decoded so far, all calls together (the cost of the stream).
    decoded: usize,
}

impl StreamDecoder {
    /// Adds a token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<String> {
        self.window.push(id);
        let prefix = self.decode(tokenizer, ..self.read)?;
        let full = self.decode(tokenizer, ..)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            let delta = full[prefix.len()..].to_owned();
            self.advance(self.window.len());
            return Ok(delta);
        }
        if self.decode(tokenizer, self.window.len() - 1..)?.is_empty()
            && self.decode(tokenizer, ..self.window.len() - 1)? == full
        {
            self.window.pop();
            return Ok(String::new());
        }
        if self.window.len() - self.read > MAX_PENDING {
            let split = self.window.len() - SETTLE_KEEP;
            let settled = self.decode(tokenizer, ..split)?;
            if settled.len() > prefix.len()
                && settled.starts_with(&prefix)
                && full.starts_with(&settled)
                && full[settled.len()..].chars().count() >= SETTLE_KEEP
            {
                let delta = settled[prefix.len()..].to_owned();
                self.advance(split);
                return Ok(delta);
            }
        }
        Ok(String::new())
    }

    /// Text still held back at the end (an incomplete character decodes as U+FFFD).
    pub fn finish(&mut self, tokenizer: &TextTokenizer) -> Result<String> {
        let prefix = self.decode(tokenizer, ..self.read)?;
        let full = self.decode(tokenizer, ..)?;
        self.window.clear();
        self.read = 0;
        Ok(full.strip_prefix(&prefix).unwrap_or("").to_owned())
    }

    /// Tokens decoded so far, all calls together: at most a constant times
    /// the tokens pushed.
    pub fn decoded_tokens(&self) -> usize {
        self.decoded
    }

    /// The text of `window[..emitted]` is out: the tokens since the last
    /// context become the new context.
    fn advance(&mut self, emitted: usize) {
        self.window.drain(..self.read);
        self.read = emitted - self.read;
    }

    fn decode(
        &mut self,
        tokenizer: &TextTokenizer,
        range: impl std::slice::SliceIndex<[u32], Output = [u32]>,
    ) -> Result<String> {
        let ids = &self.window[range];
        self.decoded += ids.len();
        tokenizer.decode(ids)
    }
}
