//! Streaming detokenization: text deltas that never split a UTF-8 character.
//!
//! Byte-level BPE tokens can end inside a multi-byte character; decoding
//! then yields U+FFFD. We hold text back until the tail decodes cleanly, and
//! decode a short window of earlier tokens with the new ones so merges across
//! token boundaries come out right.

use crate::error::Result;
use crate::tokenizer::TextTokenizer;

#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded with each new token.
    prefix_offset: usize,
    /// Tokens whose text has already been emitted.
    read_offset: usize,
}

impl StreamDecoder {
    /// Adds a token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            let delta = full[prefix.len()..].to_owned();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Text still held back at the end (an incomplete character decodes as U+FFFD).
    pub fn finish(&mut self, tokenizer: &TextTokenizer) -> Result<String> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full.strip_prefix(&prefix).unwrap_or("").to_owned())
    }
}
