//! The DFlash loop is lossless: on dense and MoE fixtures, with real (random)
//! drafters, token ids equal plain decoding's for 32 prompts (two long) x block sizes
//! {4, 8, 16}, greedy and sampled; streaming equals the final result; and
//! with proposers whose drafts are known, acceptance, truncation at EOS /
//! stop / max_tokens, and the mask token behave exactly.

use flashbar_engine::proposer::Proposer;
use flashbar_engine::*;
use flashbar_models::Model;
use mlx_rs::Array;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    let dir = std::env::var_os("FLASHBAR_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures"));
    assert!(
        dir.join("drafter-dense-f32/config.json").is_file(),
        "no fixtures in {}: scripts/test.sh writes them",
        dir.display()
    );
    dir
}

/// (target, drafter) pairs: dense with a full-attention drafter, MoE with a
/// sliding-window one.
const PAIRS: [(&str, &str); 2] = [
    ("dense-mlx-4bit", "drafter-dense-f32"),
    ("moe-mlx-4bit", "drafter-sliding-f32"),
];

fn pair(target: &str, drafter: &str) -> Engine {
    let dir = fixtures();
    Engine::load(&dir.join(target), Some(&dir.join(drafter))).unwrap()
}

fn prompts() -> Vec<String> {
    let words = [
        "def",
        "fib(n):",
        "return",
        "the",
        "quick",
        "brown",
        "fox",
        "import",
        "os",
        "class",
        "Point:",
        "for",
        "i",
        "in",
        "range(10):",
        "print",
        "hello",
        "world",
        "café",
        "日本語",
    ];
    // The last two are long enough for the CPU's gemm prefill
    // (flashbar_models::nn::linear::CPU_GEMM_FROM_ROWS).
    (0..32)
        .map(|i| {
            let len = if i < 30 { 1 + i % 7 } else { 40 + i };
            (0..len)
                .map(|j| words[(i * 7 + j * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn request(prompt: &str, speculation: Speculation, temperature: f32) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Text(prompt.into()));
    r.max_tokens = 16;
    r.speculation = speculation;
    r.sampling.temperature = temperature;
    r.sampling.seed = 1234;
    r
}

/// Everything a sink receives.
#[derive(Default)]
struct Recorder {
    text: String,
    tokens: Vec<(u32, bool)>,
    rounds: Vec<RoundStats>,
}

impl Sink for Recorder {
    fn commit(&mut self, commit: &Commit) -> bool {
        self.text.push_str(commit.text);
        if let Some(id) = commit.token {
            self.tokens.push((id, commit.from_draft));
        }
        true
    }
    fn round(&mut self, stats: &RoundStats) -> bool {
        self.rounds.push(stats.clone());
        true
    }
}

fn run(engine: &Engine, request: &GenerateRequest) -> (Generation, Recorder) {
    let mut recorder = Recorder::default();
    let generation = engine.generate(request, &mut recorder).unwrap();
    (generation, recorder)
}

/// 32 prompts x blocks {4, 8, 16} on one pair at one temperature.
fn dflash_equals_plain_decoding((target, drafter): (&str, &str), temperature: f32) {
    let engine = pair(target, drafter);
    let mut rounds = 0;
    for prompt in prompts() {
        let (plain, _) = run(&engine, &request(&prompt, Speculation::Off, temperature));
        for block in [4, 8, 16] {
            let mut r = request(&prompt, Speculation::Dflash, temperature);
            r.block_size = Some(block);
            let (fast, streamed) = run(&engine, &r);
            assert_eq!(
                fast.token_ids, plain.token_ids,
                "{target}: {prompt:?} at T={temperature}, block {block}"
            );
            assert_eq!(fast.text, plain.text);
            assert_eq!(fast.finish_reason, plain.finish_reason);
            // Streaming shows exactly the final result.
            assert_eq!(streamed.text, fast.text);
            let ids: Vec<u32> = streamed.tokens.iter().map(|t| t.0).collect();
            assert_eq!(ids, fast.token_ids);
            assert_eq!(streamed.rounds[0].mode, Mode::Plain, "the prefill's token");
            for round in &streamed.rounds[1..] {
                assert_eq!(round.mode, Mode::Dflash);
                assert!(round.block_size <= block && round.accepted < round.block_size);
                assert!(round.committed <= round.accepted + 1);
            }
            assert_eq!(fast.stats.rounds, streamed.rounds.len());
            rounds += streamed.rounds.len();
        }
    }
    assert!(rounds > 0);
}

#[test]
fn lossless_dense_greedy() {
    dflash_equals_plain_decoding(PAIRS[0], 0.0);
}

#[test]
fn lossless_dense_sampled() {
    dflash_equals_plain_decoding(PAIRS[0], 0.8);
}

#[test]
fn lossless_moe_greedy() {
    dflash_equals_plain_decoding(PAIRS[1], 0.0);
}

#[test]
fn lossless_moe_sampled() {
    dflash_equals_plain_decoding(PAIRS[1], 0.8);
}

/// Proposes the tokens plain decoding produced (right until `wrong_at`
/// drafts into each block, then a different token).
struct Oracle {
    taps: Vec<usize>,
    expected: Vec<u32>,
    wrong_at: Option<usize>,
    block: usize,
}

impl Oracle {
    /// Always right: proposes `expected`'s next tokens, from taps 0 and 3.
    fn right(expected: &[u32], block: usize) -> Self {
        Oracle {
            taps: vec![0, 3],
            expected: expected.to_vec(),
            wrong_at: None,
            block,
        }
    }
}

impl Proposer for Oracle {
    fn tap_layers(&self) -> &[usize] {
        &self.taps
    }
    fn max_block_size(&self) -> usize {
        self.block
    }
    fn propose(
        &mut self,
        _: &Model,
        _: u32,
        _: &Array,
        count: usize,
        committed: usize,
    ) -> Result<Array> {
        let drafts: Vec<u32> = (0..count)
            .map(|i| {
                let right = self.expected.get(committed + i).copied().unwrap_or(0);
                if self.wrong_at == Some(i) {
                    (right + 1) % 512
                } else {
                    right
                }
            })
            .collect();
        Ok(Array::from_slice(&drafts, &[1, count as i32]))
    }
}

fn with_oracle(
    engine: &Engine,
    request: &GenerateRequest,
    oracle: &mut Oracle,
) -> (Generation, Recorder) {
    let mut recorder = Recorder::default();
    let mut request = request.clone();
    request.speculation = Speculation::Dflash;
    let generation = engine
        .generate_with(&request, Some(oracle), &mut recorder)
        .unwrap();
    (generation, recorder)
}

fn dflash_rounds(recorder: &Recorder) -> Vec<&RoundStats> {
    recorder
        .rounds
        .iter()
        .filter(|r| r.mode == Mode::Dflash)
        .collect()
}

#[test]
fn right_drafts_are_all_accepted_and_wrong_ones_cut_the_block() {
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    // Every round below is counted from a whole first block.
    engine.set_half_first_block(false);
    for temperature in [0.0, 0.8] {
        let mut plain_request = request("def fib(n):", Speculation::Off, temperature);
        plain_request.max_tokens = 40;
        let (plain, _) = run(&engine, &plain_request);
        assert_eq!(
            plain.token_ids.len(),
            40,
            "the fixture should not stop early"
        );
        for wrong_at in [None, Some(0), Some(5)] {
            let mut oracle = Oracle {
                taps: vec![0, 3],
                expected: plain.token_ids.clone(),
                wrong_at,
                block: 8,
            };
            let (fast, rec) = with_oracle(&engine, &plain_request, &mut oracle);
            assert_eq!(fast.token_ids, plain.token_ids, "wrong_at {wrong_at:?}");
            let rounds = dflash_rounds(&rec);
            let full_rounds = &rounds[..rounds.len() - 1];
            for round in full_rounds {
                let expected = wrong_at.unwrap_or(round.block_size - 1);
                assert_eq!(
                    round.accepted, expected,
                    "T={temperature} wrong_at {wrong_at:?}"
                );
                assert_eq!(round.committed, round.accepted + 1);
            }
            if wrong_at.is_none() {
                // accept length == block size: 7 drafts + the target's token.
                assert!(full_rounds
                    .iter()
                    .all(|r| r.block_size == 8 && r.committed == 8));
                // 40 tokens: the prefill's, then 5 rounds of 8 minus the cut last one.
                assert_eq!(fast.stats.mean_accept_len, 40.0 / rec.rounds.len() as f64);
            }
            let drafted: usize = rec.tokens.iter().filter(|t| t.1).count();
            assert_eq!(drafted, fast.stats.accepted_tokens);
            // Every drafted token is accepted or rejected, nothing else.
            let proposed: usize = rounds.iter().map(|r| r.block_size - 1).sum();
            assert_eq!(
                fast.stats.accepted_tokens + fast.stats.rejected_tokens,
                proposed
            );
            // A round's speed is its committed tokens over its whole time.
            for r in &rec.rounds {
                assert!(r.round_ms >= r.draft_ms + r.verify_ms + r.rollback_ms - 1e-9);
                let expected = r.committed as f64 * 1e3 / r.round_ms;
                assert!((r.tokens_per_second - expected).abs() <= 1e-9 * expected);
            }
        }
    }
}

/// On the CPU an answer's adaptive block starts at half the drafter's
/// block (a verify there costs in proportion to its rows) and grows back
/// to the whole block as whole blocks are accepted; the tokens are plain
/// decoding's either way.
#[test]
fn on_the_cpu_the_first_block_is_half_and_grows_back() {
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    let mut r = request("def fib(n):", Speculation::Off, 0.0);
    r.max_tokens = 40;
    let (plain, _) = run(&engine, &r);
    let mut oracle = Oracle::right(&plain.token_ids, 16);
    let (fast, rec) = with_oracle(&engine, &r, &mut oracle);
    assert_eq!(fast.token_ids, plain.token_ids);
    let blocks: Vec<usize> = dflash_rounds(&rec).iter().map(|r| r.block_size).collect();
    assert_eq!(blocks[0], 8, "{blocks:?}");
    assert!(blocks.contains(&16), "{blocks:?}");
    engine.set_half_first_block(false);
    let (fast, rec) = with_oracle(&engine, &r, &mut oracle);
    assert_eq!(fast.token_ids, plain.token_ids);
    assert_eq!(dflash_rounds(&rec)[0].block_size, 16);
}

#[test]
fn max_tokens_and_stop_sequences_inside_a_block_truncate_before_commit() {
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    let mut long = request("def fib(n):", Speculation::Off, 0.0);
    long.max_tokens = 40;
    let (plain, _) = run(&engine, &long);
    let oracle = |block| Oracle::right(&plain.token_ids, block);
    for max_tokens in [1, 2, 10, 17] {
        let mut r = long.clone();
        r.max_tokens = max_tokens;
        let (fast, _) = with_oracle(&engine, &r, &mut oracle(16));
        assert_eq!(fast.token_ids, plain.token_ids[..max_tokens]);
        assert_eq!(fast.finish_reason, FinishReason::Length);
    }
    // A stop sequence taken from the middle of the text: same cut as plain.
    let chars: Vec<char> = plain.text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let mut stopped = long.clone();
    stopped.stop = vec![stop.clone()];
    let (plain_stop, _) = run(&engine, &stopped);
    let (fast_stop, rec) = with_oracle(&engine, &stopped, &mut oracle(16));
    assert_eq!(plain_stop.finish_reason, FinishReason::Stop, "{stop:?}");
    assert_eq!(fast_stop.text, plain_stop.text);
    assert_eq!(fast_stop.token_ids, plain_stop.token_ids);
    assert_eq!(fast_stop.finish_reason, FinishReason::Stop);
    assert_eq!(rec.text, plain_stop.text);
}

/// Whole blocks to the end of an answer (the GPU's default,
/// `Engine::set_whole_blocks`): the last rounds draft and verify a full
/// block and commit only what max_tokens allows, with the same tokens as
/// plain decoding, and count only the drafts that could be committed.
#[test]
fn whole_blocks_near_the_end_commit_only_what_the_budget_allows() {
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    engine.set_whole_blocks(true);
    engine.set_half_first_block(false);
    let mut long = request("def fib(n):", Speculation::Off, 0.0);
    long.max_tokens = 40;
    let (plain, _) = run(&engine, &long);
    let mut asked = Vec::new();
    for max_tokens in [1, 2, 10, 17, 20] {
        let mut r = long.clone();
        r.max_tokens = max_tokens;
        let mut oracle = Oracle::right(&plain.token_ids, 16);
        let (fast, rec) = with_oracle(&engine, &r, &mut oracle);
        assert_eq!(fast.token_ids, plain.token_ids[..max_tokens]);
        assert_eq!(fast.finish_reason, FinishReason::Length);
        // Right drafts: each round commits all it counts; none are rejected.
        let rounds = dflash_rounds(&rec);
        let mut generated = 1; // the prefill's token
        for round in &rounds {
            assert!(round.block_size <= max_tokens - generated + 1, "{round:?}");
            assert_eq!(round.committed, round.block_size);
            generated += round.committed;
        }
        assert_eq!(generated, max_tokens.max(1));
        assert_eq!(fast.stats.rejected_tokens, 0);
        assert_eq!(fast.stats.accepted_tokens, max_tokens - 1 - rounds.len());
        asked.push(rounds.len());
    }
    // 17 tokens: the prefill's and one round of 16, the block never cut.
    assert_eq!(asked[3], 1);
    // The trained fixture drafter, whole blocks against plain decoding.
    for prompt in prompts().iter().take(8) {
        for max_tokens in [3, 16] {
            let mut r = request(prompt, Speculation::Off, 0.0);
            r.max_tokens = max_tokens;
            let (plain, _) = run(&engine, &r);
            r.speculation = Speculation::Dflash;
            r.block_size = Some(16);
            let (fast, _) = run(&engine, &r);
            assert_eq!(
                fast.token_ids, plain.token_ids,
                "{prompt:?}, {max_tokens} tokens"
            );
        }
    }
}

/// A copy of a fixture folder with `edit` applied to its config.json.
fn edited_copy(from: &Path, to: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    let path = to.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
}

#[test]
fn eos_inside_a_block_ends_the_generation_there() {
    let plain_engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    let mut long = request("def fib(n):", Speculation::Off, 0.0);
    long.max_tokens = 40;
    let (plain, _) = run(&plain_engine, &long);
    // Make the 12th generated token an end-of-sequence token.
    let eos = plain.token_ids[11];
    let first = plain.token_ids.iter().position(|&t| t == eos).unwrap();
    let temp = tempfile::tempdir().unwrap();
    let target = temp.path().join("target");
    edited_copy(&fixtures().join("dense-mlx-4bit"), &target, |c| {
        c["eos_token_id"] = serde_json::json!([2, eos]);
    });
    let engine = Engine::load(&target, Some(&fixtures().join("drafter-dense-f32"))).unwrap();
    let mut oracle = Oracle::right(&plain.token_ids, 16);
    let (fast, rec) = with_oracle(&engine, &long, &mut oracle);
    assert_eq!(fast.finish_reason, FinishReason::Stop);
    assert_eq!(fast.token_ids, plain.token_ids[..first]);
    assert_eq!(rec.tokens.len(), first, "nothing past EOS reaches the sink");
}

#[test]
fn a_generated_token_equal_to_the_mask_token_is_kept() {
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    let (plain, _) = run(&engine, &request("def fib(n):", Speculation::Off, 0.0));
    // A drafter whose mask token is one the target generates.
    let mask = plain.token_ids[3];
    let temp = tempfile::tempdir().unwrap();
    let drafter = temp.path().join("drafter");
    edited_copy(&fixtures().join("drafter-dense-f32"), &drafter, |c| {
        c["dflash_config"]["mask_token_id"] = mask.into();
    });
    let engine = Engine::load(&fixtures().join("dense-mlx-4bit"), Some(&drafter)).unwrap();
    let (fast, _) = run(&engine, &request("def fib(n):", Speculation::Dflash, 0.0));
    assert_eq!(fast.token_ids, plain.token_ids);
    assert!(fast.token_ids.contains(&mask));
}

#[test]
fn auto_floors_to_plain_decoding_when_the_drafter_is_useless() {
    use flashbar_engine::policy::gate::GateState;
    use flashbar_engine::policy::thermal::{ScriptedThermal, ThermalState};
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    engine.set_thermal_source(Box::new(ScriptedThermal::new(vec![ThermalState::Fair])));
    let mut auto = request("def fib(n):", Speculation::Auto, 0.0);
    auto.max_tokens = 120;
    let (fast, rec) = run(&engine, &auto);
    let mut plain_request = auto.clone();
    plain_request.speculation = Speculation::Off;
    let (plain, _) = run(&engine, &plain_request);
    assert_eq!(fast.token_ids, plain.token_ids);
    // The gate judges rounds by their measured time, so whether and when it
    // floors depends on this machine's speed (with a verify as cheap as a
    // few steps a random drafter can break even); that it floors when
    // speculation loses is tested on scripted costs in policy::gate
    // (`floors_to_plain_decoding_within_a_few_rounds_when_speculation_loses`).
    // Here, what holds on every machine: calibration first, a useless
    // drafter's rounds accept almost nothing, every judged round reports a
    // finite speedup, and a floor is followed by a backoff of plain steps.
    let modes: String = rec
        .rounds
        .iter()
        .map(|r| if r.mode == Mode::Plain { 'a' } else { 'd' })
        .collect();
    assert!(modes.starts_with("aaaa"), "calibration first: {modes}");
    let drafted: Vec<_> = rec
        .rounds
        .iter()
        .filter(|r| r.mode != Mode::Plain)
        .collect();
    assert!(!drafted.is_empty(), "auto never probed: {modes}");
    let accepted: usize = drafted.iter().map(|r| r.accepted).sum();
    assert!(
        accepted * 2 < drafted.len() * 3,
        "a random drafter accepted {accepted} drafts in {} rounds",
        drafted.len()
    );
    assert!(rec.rounds.iter().all(|r| r.thermal == ThermalState::Fair));
    let judged: Vec<f64> = rec.rounds.iter().filter_map(|r| r.speedup).collect();
    assert!(
        !judged.is_empty() && judged.iter().all(|&s| s.is_finite() && s > 0.0),
        "{judged:?}"
    );
    if let Some(floor) = rec
        .rounds
        .iter()
        .position(|r| r.gate == Some(GateState::Floored))
    {
        let after = &modes[floor + 1..];
        let plain_run = after.chars().take_while(|&c| c == 'a').count();
        let backoff = flashbar_engine::policy::gate::GateConfig::default().first_backoff;
        assert!(
            plain_run >= backoff.min(after.len()),
            "a floor at round {floor} without a {backoff}-step backoff: {modes}"
        );
    }
}

/// Forced DFlash is measured, never judged: a user (or `flashbar bench`)
/// who forces it between "auto" requests must not floor the gate, which
/// would have no plain steps to count its backoff down and would start
/// the next "auto" request floored for what the forced one lost.
#[test]
fn forced_rounds_leave_the_gate_as_auto_left_it() {
    use flashbar_engine::policy::thermal::{ScriptedThermal, ThermalState};
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    engine.set_thermal_source(Box::new(ScriptedThermal::new(vec![ThermalState::Fair])));
    let mut auto = request("def fib(n):", Speculation::Auto, 0.0);
    auto.max_tokens = 40;
    run(&engine, &auto);
    let before = engine.gate_snapshot();
    assert!(before.ar_step_ms().is_some(), "auto calibrated the gate");
    let mut forced = auto.clone();
    forced.speculation = Speculation::Dflash;
    forced.max_tokens = 60;
    let (_, rec) = run(&engine, &forced);
    let drafted: Vec<_> = rec
        .rounds
        .iter()
        .filter(|r| r.mode != Mode::Plain)
        .collect();
    assert!(!drafted.is_empty());
    assert!(
        drafted.iter().all(|r| r.gate.is_none()),
        "forced rounds are not gated"
    );
    assert!(drafted
        .iter()
        .all(|r| r.speedup.is_some_and(|s| s.is_finite() && s > 0.0)));
    let after = engine.gate_snapshot();
    assert_eq!(after.state(), before.state());
    assert_eq!(after.speedup(), before.speedup());
}

/// The gate learns every plain step, also those whose token is chosen on
/// the host (greedy over the CPU's host kernels, or sampling), which come
/// back with no next step queued behind them: a fresh gate calibrates on
/// the first `calibration_steps` decode steps and speculates right after.
/// (Only the first step of each batch was learned once, and calibration,
/// backoffs and the shadow probes' credit ran several times too slow.)
#[test]
fn the_gate_learns_every_plain_step() {
    use flashbar_engine::policy::gate::{Gate, GateConfig};
    use flashbar_engine::policy::thermal::{ScriptedThermal, ThermalState};
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    engine.set_thermal_source(Box::new(ScriptedThermal::new(vec![ThermalState::Fair])));
    for temperature in [0.0, 0.8] {
        let config = GateConfig::default();
        let calibration = config.calibration_steps;
        engine.set_gate(Gate::new(config));
        let mut auto = request("def fib(n):", Speculation::Auto, temperature);
        auto.max_tokens = 40;
        let (_, recorder) = run(&engine, &auto);
        let modes: String = recorder
            .rounds
            .iter()
            .map(|r| if r.mode == Mode::Plain { 'a' } else { 'd' })
            .collect();
        // The prefill's token (not a decode step), then the calibration.
        let first_round = modes.find('d');
        assert_eq!(
            first_round,
            Some(1 + calibration),
            "temperature {temperature}: {modes}"
        );
    }
}

/// A gate floored where a round is dear: calibrated at 1 ms a plain step,
/// its warm-up round done, then a judged round of 5 ms that committed one
/// token. A 40-token request cannot afford a losing 5-step round (3% of
/// it is 1.2 steps), so its probe is a shadow.
fn floored_where_rounds_are_dear() -> flashbar_engine::policy::gate::Gate {
    use flashbar_engine::policy::gate::{Gate, GateConfig, GateState};
    use flashbar_engine::policy::thermal::ThermalState;
    let mut gate = Gate::new(GateConfig::default());
    gate.set_thermal(ThermalState::Fair);
    for _ in 0..4 {
        gate.observe_ar(1.0);
    }
    gate.observe_round(1, 5.0); // warm-up
    gate.observe_round(1, 5.0); // judged: 0.2x, floored at once
    assert_eq!(gate.state(), GateState::Floored);
    assert_eq!(gate.shadow_break_even(), Some(5));
    gate
}

/// A shadow probe drafts, decodes plainly and compares: right drafts up
/// to the break-even (5 tokens: 4 drafts and the target's own) start DFlash
/// rounds right after those 4 plain steps; wrong ones leave the answer to
/// plain decoding. The tokens are plain decoding's either way.
#[test]
fn a_shadow_probe_starts_rounds_only_where_its_drafts_hold() {
    use flashbar_engine::policy::thermal::{ScriptedThermal, ThermalState};
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    engine.set_thermal_source(Box::new(ScriptedThermal::new(vec![ThermalState::Fair])));
    let mut auto = request("def fib(n):", Speculation::Auto, 0.0);
    auto.max_tokens = 40;
    let mut plain_request = auto.clone();
    plain_request.speculation = Speculation::Off;
    let (plain, _) = run(&engine, &plain_request);
    // With whole blocks (GPUs) the shadow drafts a whole block and compares
    // the same 4.
    let cases = [(None, true), (Some(0), false), (Some(2), false)];
    for (whole_blocks, (wrong_at, rounds_follow)) in [false, true]
        .into_iter()
        .flat_map(|whole| cases.map(|case| (whole, case)))
    {
        engine.set_whole_blocks(whole_blocks);
        engine.set_gate(floored_where_rounds_are_dear());
        let mut oracle = Oracle::right(&plain.token_ids, 8);
        oracle.wrong_at = wrong_at;
        let mut recorder = Recorder::default();
        let generation = engine
            .generate_with(&auto, Some(&mut oracle), &mut recorder)
            .unwrap();
        assert_eq!(
            generation.token_ids, plain.token_ids,
            "wrong at {wrong_at:?}"
        );
        let modes: String = recorder
            .rounds
            .iter()
            .map(|r| if r.mode == Mode::Plain { 'a' } else { 'd' })
            .collect();
        // The prefill's token, then the shadow's 4 compared plain steps.
        assert!(modes.starts_with("aaaaa"), "{modes}");
        assert_eq!(
            modes[5..].starts_with('d'),
            rounds_follow,
            "wrong at {wrong_at:?}: {modes}"
        );
        if !rounds_follow {
            assert!(!modes.contains('d'), "{modes}");
        }
    }
}

#[test]
fn speculation_off_and_auto_choose_the_loop() {
    let engine = pair("dense-mlx-4bit", "drafter-dense-f32");
    let (off, rec) = run(&engine, &request("hello", Speculation::Off, 0.0));
    assert_eq!(off.stats.mode, Some(Mode::Plain));
    assert!(rec.rounds.iter().all(|r| r.mode == Mode::Plain));
    let (auto, _) = run(&engine, &request("hello", Speculation::Auto, 0.0));
    assert_eq!(auto.stats.mode, Some(Mode::Dflash));
    assert_eq!(auto.token_ids, off.token_ids);
}
