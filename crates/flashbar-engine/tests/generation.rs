//! The engine against mlx-lm / transformers on the fixture checkpoints:
//! tokenization, chat rendering, greedy text; and its own rules: streaming,
//! stop sequences, max_tokens, cancellation, seeded sampling, bad requests.

use flashbar_engine::detokenize::StreamDecoder;
use flashbar_engine::sampling::uniform;
use flashbar_engine::*;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    let dir = std::env::var_os("FLASHBAR_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures"));
    assert!(
        dir.join("tokenizer.reference.json").is_file(),
        "no fixtures in {}: run `.venv/bin/python tests/fixtures/make_fixtures.py target/fixtures` (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn reference() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("tokenizer.reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn engine() -> Engine {
    Engine::load(&fixtures().join("dense-mlx-4bit"), None).unwrap()
}

/// Collects everything a sink receives.
#[derive(Default)]
struct Recorder {
    text: String,
    tokens: Vec<u32>,
    rounds: usize,
    /// Answer "stop" at this many tokens.
    stop_after: Option<usize>,
}

impl Sink for Recorder {
    fn commit(&mut self, commit: &Commit) -> bool {
        self.text.push_str(commit.text);
        let Some(id) = commit.token else {
            return true;
        };
        assert!(!commit.from_draft, "plain decoding drafts nothing");
        self.tokens.push(id);
        self.stop_after != Some(self.tokens.len())
    }
    fn round(&mut self, stats: &RoundStats) -> bool {
        assert_eq!((stats.mode, stats.committed), (Mode::Plain, 1));
        self.rounds += 1;
        true
    }
}

fn greedy(prompt: &str, max_tokens: usize) -> GenerateRequest {
    let mut request = GenerateRequest::new(Prompt::Text(prompt.into()));
    request.max_tokens = max_tokens;
    request.speculation = Speculation::Off;
    request
}

#[test]
fn tokenization_matches_transformers() {
    let engine = engine();
    let reference = reference();
    for sample in reference["samples"].as_array().unwrap() {
        let text = sample["text"].as_str().unwrap();
        assert_eq!(
            engine.tokenizer().encode(text).unwrap(),
            ids(&sample["ids"]),
            "{text:?}"
        );
    }
    let eos: Vec<u32> = engine.tokenizer().eos_ids().iter().copied().collect();
    assert_eq!(eos, ids(&reference["eos_token_ids"]));
}

#[test]
fn chat_rendering_matches_transformers() {
    let engine = engine();
    let chat = &reference()["chat"];
    let messages: Vec<Message> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let rendered =
        chat_template::render(engine.tokenizer().chat_template().unwrap(), &messages, true)
            .unwrap();
    assert_eq!(rendered, chat["rendered"].as_str().unwrap());
    assert_eq!(
        engine.prompt_ids(&Prompt::Messages(messages)).unwrap(),
        ids(&chat["ids"])
    );
}

#[test]
fn greedy_text_matches_mlx_lm_and_streams_the_same() {
    let engine = engine();
    let expected = &reference()["generate"];
    let mut recorder = Recorder::default();
    let request = greedy(expected["prompt"].as_str().unwrap(), 48);
    let result = engine.generate(&request, &mut recorder).unwrap();
    assert_eq!(result.token_ids, ids(&expected["ids"]));
    assert_eq!(result.text, expected["text"].as_str().unwrap());
    // Streamed == final, token for token.
    assert_eq!(recorder.text, result.text);
    assert_eq!(recorder.tokens, result.token_ids);
    assert_eq!(recorder.rounds, result.token_ids.len());
    assert_eq!(
        result.stats.prompt_tokens,
        ids(&expected["prompt_ids"]).len()
    );
    assert_eq!(result.stats.completion_tokens, result.token_ids.len());
}

#[test]
fn max_tokens_ends_with_length() {
    let result = engine()
        .generate(&greedy("def fib(n):", 5), &mut NullSink)
        .unwrap();
    assert_eq!(result.token_ids.len(), 5);
    assert_eq!(result.finish_reason, FinishReason::Length);
}

#[test]
fn a_stop_sequence_cuts_the_text_before_it() {
    let engine = engine();
    let full = engine
        .generate(&greedy("def fib(n):", 48), &mut NullSink)
        .unwrap();
    // A stop string from the middle of the greedy text.
    let chars: Vec<char> = full.text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let cut = full.text.find(&stop).unwrap();
    let mut request = greedy("def fib(n):", 48);
    request.stop = vec![stop.clone()];
    let mut recorder = Recorder::default();
    let result = engine.generate(&request, &mut recorder).unwrap();
    assert_eq!(result.finish_reason, FinishReason::Stop);
    assert_eq!(result.text, full.text[..cut], "stop {stop:?}");
    assert_eq!(recorder.text, result.text);
}

#[test]
fn a_sink_that_says_stop_ends_the_run_at_that_token() {
    let mut recorder = Recorder {
        stop_after: Some(3),
        ..Default::default()
    };
    let result = engine()
        .generate(&greedy("def fib(n):", 40), &mut recorder)
        .unwrap();
    assert_eq!(result.finish_reason, FinishReason::Cancelled);
    assert_eq!(result.token_ids.len(), 3);
    // Nothing reached the sink after it said stop.
    assert_eq!(recorder.tokens, result.token_ids);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let engine = engine();
    let run = |seed| {
        let mut request = greedy("def fib(n):", 24);
        request.sampling = SamplingParams {
            temperature: 0.8,
            seed,
            ..Default::default()
        };
        engine.generate(&request, &mut NullSink).unwrap().token_ids
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn streaming_decode_of_arbitrary_tokens_is_utf8_and_complete() {
    let engine = engine();
    let tokenizer = engine.tokenizer();
    for seed in 0..50u64 {
        let sequence: Vec<u32> = (0..40)
            .map(|i| (uniform(seed, i) * tokenizer.vocab_size() as f64) as u32)
            .collect();
        let mut decoder = StreamDecoder::default();
        let mut streamed = String::new();
        for &id in &sequence {
            // Each delta is a Rust String: valid UTF-8 by construction.
            streamed.push_str(&decoder.push(tokenizer, id).unwrap());
        }
        streamed.push_str(&decoder.finish(tokenizer).unwrap());
        assert_eq!(
            streamed,
            tokenizer.decode(&sequence).unwrap(),
            "seed {seed}"
        );
    }
}

/// 10,000 tokens that add no text (bytes that are not UTF-8, each held back
/// as a possible start of a character): the stream still ends with all their
/// text, every delta extends what came before, and the decoder's work stays
/// linear (it used to re-decode the whole growing run at each token).
#[test]
fn streaming_decode_of_a_long_run_without_text_stays_linear() {
    let engine = engine();
    let tokenizer = engine.tokenizer();
    let lone_byte = (0..tokenizer.vocab_size() as u32)
        .find(|&id| tokenizer.decode(&[id, id]).unwrap() == "\u{FFFD}\u{FFFD}")
        .expect("a byte token that is not UTF-8 on its own");
    let words = tokenizer.encode("and then some text").unwrap();
    let mut sequence = vec![lone_byte; 10_000];
    sequence.extend(&words);
    sequence.extend(std::iter::repeat_n(lone_byte, 10_000));
    let whole = tokenizer.decode(&sequence).unwrap();
    let mut decoder = StreamDecoder::default();
    let mut streamed = String::new();
    for &id in &sequence {
        streamed.push_str(&decoder.push(tokenizer, id).unwrap());
        assert!(whole.starts_with(&streamed), "a delta took back text");
    }
    streamed.push_str(&decoder.finish(tokenizer).unwrap());
    assert_eq!(streamed, whole);
    assert!(
        decoder.decoded_tokens() <= 64 * sequence.len(),
        "{} tokens decoded for {} pushed",
        decoder.decoded_tokens(),
        sequence.len()
    );
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let engine = engine();
    let refuse = |request: GenerateRequest| {
        engine
            .generate(&request, &mut NullSink)
            .unwrap_err()
            .to_string()
    };
    assert!(refuse(greedy("", 8)).contains("the prompt is empty"));
    assert!(refuse(greedy("hi", 0)).contains("max_tokens"));
    let mut hot = greedy("hi", 8);
    hot.sampling.temperature = -1.0;
    assert!(refuse(hot).contains("temperature"));
    let mut dflash = greedy("hi", 8);
    dflash.speculation = Speculation::Dflash;
    assert!(refuse(dflash.clone()).contains("drafter"));
    // Each names the request's field, for the API's error object.
    let field = |request: GenerateRequest| match engine.generate(&request, &mut NullSink) {
        Err(EngineError::InvalidParam { param, .. }) => param,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(dflash), "speculation");
    assert_eq!(field(greedy("", 8)), "prompt");
    assert_eq!(field(greedy("hi", 0)), "max_tokens");
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("short-context");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixtures().join("dense-mlx-4bit")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let config_path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["text_config"]["max_position_embeddings"] = 8.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let engine = Engine::load(&dir, None).unwrap();
    let error = engine
        .generate(
            &greedy("def fib(n): return fib(n - 1) + fib(n - 2)", 4),
            &mut NullSink,
        )
        .unwrap_err();
    assert!(
        error.to_string().contains("the model's context is 8"),
        "{error}"
    );
}
