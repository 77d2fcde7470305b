//! Pairs the engine's token callbacks with the text they release, so the UI
//! can colour text that came from accepted drafts. The engine reports a
//! token, then (unless held back for UTF-8 or a possible stop sequence) its
//! text; held-back text comes out with a later token or at the end.

use serde::Serialize;

/// One streamed piece: the text released after a token, and whether a
/// draft proposed that token. `id` is None for text flushed at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Piece {
    pub id: Option<u32>,
    pub from_draft: bool,
    pub text: String,
}

#[derive(Default)]
pub struct Pairer {
    pending: Option<(u32, bool)>,
}

impl Pairer {
    /// A committed token; returns the previous one if it released no text.
    pub fn token(&mut self, id: u32, from_draft: bool) -> Option<Piece> {
        let previous = self.pending.replace((id, from_draft));
        previous.map(|(id, from_draft)| Piece {
            id: Some(id),
            from_draft,
            text: String::new(),
        })
    }

    /// A text delta: it belongs to the latest token.
    pub fn text(&mut self, delta: &str) -> Piece {
        let (id, from_draft) = match self.pending.take() {
            Some((id, from_draft)) => (Some(id), from_draft),
            None => (None, false),
        };
        Piece {
            id,
            from_draft,
            text: delta.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_goes_with_the_token_before_it() {
        let mut pairer = Pairer::default();
        assert_eq!(pairer.token(5, true), None);
        let piece = pairer.text("ab");
        assert_eq!(
            (piece.id, piece.from_draft, piece.text.as_str()),
            (Some(5), true, "ab")
        );
        // A token whose text is held back is reported, empty, when the next
        // one comes; the held text then goes out with that next token.
        assert_eq!(pairer.token(6, false), None);
        let silent = pairer.token(7, true).unwrap();
        assert_eq!((silent.id, silent.text.as_str()), (Some(6), ""));
        assert_eq!(pairer.text("é").id, Some(7));
        // Text flushed at the end has no token.
        let tail = pairer.text("!");
        assert_eq!((tail.id, tail.from_draft), (None, false));
    }
}
