//! Streaming detokenization of arbitrary token sequences with the embedded
//! default model's tokenizer: the deltas are valid UTF-8 (they are `String`s),
//! each extends the text before it (a U+FFFD is emitted only where decoding
//! the whole sequence has one: never for a character split across tokens),
//! all of them together are exactly the text of decoding the whole sequence
//! at once, and the decoder's work is linear in the tokens pushed.
#![no_main]

use flashbar_engine::detokenize::StreamDecoder;
use flashbar_engine::tokenizer::TextTokenizer;
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

fn tokenizer() -> &'static TextTokenizer {
    static TOKENIZER: OnceLock<TextTokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default/target");
        TextTokenizer::load(&dir).expect("the embedded tokenizer loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let tokenizer = tokenizer();
    // Two bytes per id; a few ids past the vocabulary are included.
    let limit = tokenizer.vocab_size() as u32 + 4;
    let ids: Vec<u32> = data
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]) as u32 % limit)
        .collect();
    let whole = match tokenizer.decode(&ids) {
        Ok(text) => text,
        Err(_) => return,
    };
    let mut decoder = StreamDecoder::default();
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&decoder.push(tokenizer, id).unwrap());
        assert!(whole.starts_with(&streamed), "ids {ids:?}: {streamed:?}");
    }
    streamed.push_str(&decoder.finish(tokenizer).unwrap());
    assert_eq!(streamed, whole, "ids {ids:?}");
    assert!(decoder.decoded_tokens() <= 64 * ids.len().max(1), "ids {ids:?}");
});
