//! Thinking as thinking: splits a thinking model's output into its
//! **reasoning** (inside `<think>` ... `</think>`) and its **content** (the
//! answer after it), as the text streams, piece by piece
//! (`docs/thinking-and-tools.md`).
//!
//! A pure state machine: fed decoded text pieces in order, it returns what
//! each piece released on each channel. A tag may arrive split over any
//! number of pieces; text that may be the start of a tag is held back until
//! the next piece decides. Whether the output starts inside the block is
//! read off the rendered prompt ([`starts_inside`]): Qwen3.5/3.6 templates
//! open `<think>\n` in the generation prompt when thinking is on. Outside
//! the block, a `<think>` before any other text (Qwen3 writes its own)
//! opens one; once the answer has begun, tags are plain text.
//!
//! Newlines are trimmed as the Qwen templates trim them when they render an
//! earlier turn's `reasoning_content` (`strip('\n')` of the reasoning,
//! `lstrip('\n')` of the answer), so sending the split back renders the
//! same prompt the model saw. A generation cut inside the block is all
//! reasoning (its held-back tail included) and has an empty answer.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";
/// Where the assistant's turn begins in ChatML prompts (Qwen's).
const ASSISTANT: &str = "<|im_start|>assistant";

/// Whether generation after `prompt` starts inside a think block: the
/// prompt's last assistant turn (or the whole prompt, without ChatML
/// markers) holds a `<think>` not closed after it.
pub fn starts_inside(prompt: &str) -> bool {
    let turn = prompt
        .rfind(ASSISTANT)
        .map_or(prompt, |at| &prompt[at + ASSISTANT.len()..]);
    match turn.rfind(OPEN) {
        Some(at) => !turn[at..].contains(CLOSE),
        None => false,
    }
}

/// What one piece released, per channel (either may be empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Outside a block, nothing released yet: leading whitespace and a
    /// possible `<think>` are held.
    Start,
    /// Inside the block; `begun` once reasoning text was released (before
    /// that, leading newlines are dropped).
    Reasoning { begun: bool },
    /// The answer; `begun` once text was released (before that, after a
    /// `</think>`, leading newlines are dropped).
    Content { begun: bool },
}

/// The splitter of one generation.
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    state: State,
    /// Text held back: a possible partial tag, and in the block the
    /// newlines that may precede `</think>`.
    held: String,
    /// The last piece touched the block (opened, continued or closed it).
    touched: bool,
}

impl ReasoningSplitter {
    /// A splitter for output that starts inside the block (`true`) or not.
    pub fn new(inside: bool) -> Self {
        ReasoningSplitter {
            state: if inside {
                State::Reasoning { begun: false }
            } else {
                State::Start
            },
            held: String::new(),
            touched: false,
        }
    }

    /// Whether the last piece pushed belonged to the reasoning (it was
    /// inside the block, or opened or closed it): the token counts as a
    /// reasoning token.
    pub fn last_was_reasoning(&self) -> bool {
        self.touched
    }

    /// Feeds the next piece; returns what it released.
    pub fn push(&mut self, piece: &str) -> Split {
        let mut out = Split::default();
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(piece);
        self.touched = matches!(self.state, State::Reasoning { .. });
        loop {
            match self.state {
                State::Start => {
                    let rest = buf.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        buf = after.to_owned();
                        self.state = State::Reasoning { begun: false };
                        self.touched = true;
                        continue;
                    }
                    if rest.is_empty() || OPEN.starts_with(rest) {
                        self.held = buf;
                    } else {
                        out.content.push_str(&buf);
                        self.state = State::Content { begun: true };
                    }
                    return out;
                }
                State::Reasoning { begun } => {
                    let (text, after) = match buf.find(CLOSE) {
                        Some(at) => (&buf[..at], Some(&buf[at + CLOSE.len()..])),
                        None => (buf.as_str(), None),
                    };
                    let text = if begun {
                        text
                    } else {
                        text.trim_start_matches('\n')
                    };
                    match after {
                        Some(after) => {
                            out.reasoning.push_str(text.trim_end_matches('\n'));
                            buf = after.to_owned();
                            self.state = State::Content { begun: false };
                        }
                        None => {
                            // Hold a possible partial `</think>` and the
                            // newlines before it.
                            let tag = partial_suffix(text, CLOSE);
                            let keep = text[..text.len() - tag].trim_end_matches('\n').len();
                            out.reasoning.push_str(&text[..keep]);
                            self.held = text[keep..].to_owned();
                            self.state = State::Reasoning {
                                begun: begun || keep > 0,
                            };
                            return out;
                        }
                    }
                }
                State::Content { begun } => {
                    let text = if begun {
                        buf.as_str()
                    } else {
                        buf.trim_start_matches('\n')
                    };
                    out.content.push_str(text);
                    self.state = State::Content {
                        begun: begun || !text.is_empty(),
                    };
                    return out;
                }
            }
        }
    }

    /// The generation ended: releases what was held (inside the block it
    /// is reasoning, else content).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        self.touched = false;
        match self.state {
            State::Reasoning { .. } => Split {
                reasoning: held,
                content: String::new(),
            },
            State::Start | State::Content { .. } => Split {
                reasoning: String::new(),
                content: held,
            },
        }
    }
}

/// Bytes at the end of `text` that are a proper prefix of `tag`.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns (reasoning, content, reasoning pieces).
    fn run(inside: bool, pieces: &[&str]) -> (String, String, usize) {
        let mut splitter = ReasoningSplitter::new(inside);
        let (mut reasoning, mut content, mut counted) = (String::new(), String::new(), 0);
        for piece in pieces {
            let split = splitter.push(piece);
            counted += usize::from(splitter.last_was_reasoning());
            reasoning += &split.reasoning;
            content += &split.content;
        }
        let split = splitter.finish();
        (
            reasoning + &split.reasoning,
            content + &split.content,
            counted,
        )
    }

    /// Every way of cutting `text` into two and three pieces gives what
    /// the whole text gives.
    fn every_split_agrees(inside: bool, text: &str, reasoning: &str, content: &str) {
        let whole = run(inside, &[text]);
        assert_eq!((whole.0.as_str(), whole.1.as_str()), (reasoning, content));
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a) {
                let pieces = [&text[..a], &text[a..b], &text[b..]];
                let got = run(inside, &pieces);
                assert_eq!(
                    (got.0.as_str(), got.1.as_str()),
                    (reasoning, content),
                    "pieces {pieces:?}"
                );
            }
        }
        // One character a piece.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        let got = run(inside, &pieces);
        assert_eq!((got.0.as_str(), got.1.as_str()), (reasoning, content));
    }

    #[test]
    fn inside_the_block_reasoning_then_answer_at_every_split() {
        every_split_agrees(
            true,
            "Let me think.\nOk.\n</think>\n\nThe answer is 4.",
            "Let me think.\nOk.",
            "The answer is 4.",
        );
    }

    #[test]
    fn an_opening_tag_the_model_writes_opens_the_block_at_every_split() {
        every_split_agrees(
            false,
            "\n<think>\nhmm é\n\n</think>\n\nHi <think> stays",
            "hmm é",
            "Hi <think> stays",
        );
    }

    #[test]
    fn without_tags_everything_is_the_answer() {
        every_split_agrees(
            false,
            "\n\ndef f(x):\n    return x < 3",
            "",
            "\n\ndef f(x):\n    return x < 3",
        );
        every_split_agrees(false, "<thinking is fun", "", "<thinking is fun");
        every_split_agrees(false, "  <thin", "", "  <thin");
    }

    #[test]
    fn a_generation_cut_inside_the_block_is_all_reasoning() {
        every_split_agrees(
            true,
            "step one\nstep two</thi",
            "step one\nstep two</thi",
            "",
        );
        every_split_agrees(true, "a\n\n", "a\n\n", "");
        every_split_agrees(false, "<think>never closed", "never closed", "");
    }

    #[test]
    fn the_empty_block_of_thinking_off_leaves_the_answer() {
        // Thinking off renders `<think>\n\n</think>\n\n`: not inside.
        every_split_agrees(false, "print(1)\n", "", "print(1)\n");
        every_split_agrees(true, "</think>\n\nonly answer", "", "only answer");
    }

    #[test]
    fn tags_inside_the_reasoning_and_near_misses_stay_text() {
        every_split_agrees(true, "a </thinker> b\n</think>c", "a </thinker> b", "c");
        every_split_agrees(true, "x</think></think>", "x", "</think>");
    }

    #[test]
    fn reasoning_tokens_are_those_before_and_of_the_closing_tag() {
        let (_, _, counted) = run(true, &["a", "b", "</th", "ink>", "\n\nc", "d"]);
        assert_eq!(counted, 4);
        let (_, _, counted) = run(false, &["<think>", "a", "</think>", "b"]);
        assert_eq!(counted, 3);
        let (_, _, counted) = run(false, &["a", "<think>"]);
        assert_eq!(counted, 0);
    }

    #[test]
    fn the_prompt_says_whether_generation_starts_inside() {
        let on = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
        let off = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
        let earlier = "<|im_start|>assistant\n<think>\nx\n</think>\n\ny<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n";
        assert!(starts_inside(on));
        assert!(!starts_inside(off));
        assert!(!starts_inside(earlier));
        assert!(starts_inside("plain <think>"));
        assert!(!starts_inside("plain text"));
    }
}
