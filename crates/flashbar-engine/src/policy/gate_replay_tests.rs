//! `auto` replayed over the rounds recorded on real machines
//! (`recorded_rounds_*.json`, written by `bench/record_rounds.py`): the
//! gate's speed over plain decoding against forced DFlash's, regime by
//! regime. The scripted state-machine tests are `gate_tests.rs`.

use super::tests::shadow_compare;
use super::*;

const CPU_ROUNDS: &str = include_str!("recorded_rounds_cpu.json");
const H200_ROUNDS: &str = include_str!("recorded_rounds_h200.json");
const H100_ROUNDS: &str = include_str!("recorded_rounds_h100.json");
const H100_L3_ROUNDS: &str = include_str!("recorded_rounds_h100_l3.json");
const H200_LIVE_ROUNDS: &str = include_str!("recorded_rounds_h200_1206.json");
const H100_SLOW_HOST_ROUNDS: &str = include_str!("recorded_rounds_h100_1206.json");

/// Recorded rounds (`recorded_rounds_*.json`, written from
/// `bench/acceptance.py`'s JSON): per regime the plain step time and,
/// per prompt, its forced DFlash rounds as (committed, round ms, draft ms).
struct Recorded {
    ar_ms: f64,
    request_tokens: usize,
    prompts: Vec<Vec<(usize, f64, f64)>>,
}

fn recorded(json: &str, regime: &str) -> Recorded {
    let all: serde_json::Value = serde_json::from_str(json).unwrap();
    let regime = &all["regimes"][regime];
    // A round's draft time, where recorded (else the whole round's: an
    // upper bound for what a shadow probe's draft costs).
    let round = |r: &serde_json::Value| {
        let ms = r[1].as_f64().unwrap();
        (
            r[0].as_u64().unwrap() as usize,
            ms,
            r.get(2).and_then(|d| d.as_f64()).unwrap_or(ms),
        )
    };
    Recorded {
        ar_ms: regime["ar_ms"].as_f64().unwrap(),
        request_tokens: all["request_tokens"].as_u64().unwrap() as usize,
        prompts: regime["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_array().unwrap().iter().map(round).collect())
            .collect(),
    }
}

/// Forced DFlash's speed over plain decoding's on recorded rounds.
fn forced_recorded(json: &str, regime: &str) -> f64 {
    let r = recorded(json, regime);
    let rounds = r.prompts.iter().flatten();
    let tokens: usize = rounds.clone().map(|(c, _, _)| c).sum();
    let ms: f64 = rounds.map(|(_, ms, _)| ms).sum();
    tokens as f64 * r.ar_ms / ms
}

/// Speculation "auto" replayed over recorded rounds: the regime's
/// prompts answered in turn (each a request of the recorded length) by
/// one gate, as one loaded pair answers a session, until `tokens`
/// tokens. A DFlash round at answer position p costs what the recorded
/// round covering p cost and commits what is left of it (a lower bound:
/// until 2026-12-06 it was credited the whole recorded round, which
/// flattered auto by 10-20% on code). Returns auto's speed over plain
/// decoding's.
fn replay_recorded(json: &str, regime: &str, tokens: usize) -> f64 {
    replay_recorded_with(json, regime, tokens, GateConfig::default())
}

fn replay_recorded_with(json: &str, regime: &str, tokens: usize, config: GateConfig) -> f64 {
    let r = recorded(json, regime);
    let mut g = Gate::new(config);
    g.set_thermal(ThermalState::Nominal);
    let (mut done, mut ms) = (0, 0.0);
    for rounds in r.prompts.iter().cycle() {
        if done >= tokens {
            break;
        }
        g.begin_request(r.request_tokens);
        let starts: Vec<usize> = rounds
            .iter()
            .scan(0, |at, (c, _, _)| {
                let start = *at;
                *at += c;
                Some(start)
            })
            .collect();
        // A round starting inside a recorded one commits what is left of
        // it (at least its one token): where it would have gone on past the
        // recorded round's end is not known, so auto is not credited with it.
        let at_position = |at: usize| {
            let i = starts.partition_point(|&s| s <= at).saturating_sub(1);
            let (committed, round_ms, draft_ms) = rounds[i];
            let left = (starts[i] + committed).saturating_sub(at).max(1);
            (left, round_ms, draft_ms)
        };
        let mut at = 0;
        while at < r.request_tokens {
            match g.plan() {
                Plan::Plain(_) => {
                    g.observe_ar(r.ar_ms);
                    at += 1;
                    ms += r.ar_ms;
                }
                Plan::Dflash => {
                    let (committed, round_ms, _) = at_position(at);
                    g.observe_round(committed, round_ms);
                    at += committed;
                    ms += round_ms;
                }
                Plan::Shadow => {
                    // The recorded round at this position says what a round
                    // would commit; the shadow pays its draft, then the plain
                    // steps it compares.
                    let (committed, _, draft_ms) = at_position(at);
                    let compare = shadow_compare(&g, 15).min(r.request_tokens - at);
                    ms += draft_ms + compare as f64 * r.ar_ms;
                    at += compare;
                    for _ in 0..compare {
                        g.observe_ar(r.ar_ms);
                    }
                    g.observe_shadow(committed.min(compare + 1), draft_ms);
                }
            }
        }
        done += at;
    }
    (done as f64 * r.ar_ms) / ms
}

/// Per regime of a recording: (regime, forced DFlash, auto), each over
/// plain decoding (printed, for the test's log).
fn speeds(json: &str) -> Vec<(&'static str, f64, f64)> {
    ["deterministic", "code", "prose"]
        .into_iter()
        .map(|regime| {
            let forced = forced_recorded(json, regime);
            let auto = replay_recorded(json, regime, 2000);
            eprintln!("{regime}: forced {forced:.3}x, auto {auto:.3}x plain");
            (regime, forced, auto)
        })
        .collect()
}

#[test]
fn auto_keeps_dflash_where_it_pays_on_recorded_cpu_rounds() {
    // Rounds of the embedded pair on the CPU here (host kernels, caches and
    // drafter; 2026-12-05), with each draft's own time, so a shadow probe
    // costs at most what it would (~2.2-2.5 ms for a block of 16; a shadow
    // drafts fewer) against ~6.5-9 ms rounds and ~1.2 ms plain steps.
    // 2,000 tokens: a few answers of one app session (the gate lives as
    // long as the loaded pair). Forced DFlash, pooled, is ~0.9x plain decoding
    // on repetitive text (three prompts at 1.9-2.4x, but the licence text
    // accepts ~2 a round and takes most of the time), ~0.7x on code and
    // ~0.35x on prose. Auto must keep DFlash where it pays, so beat forced
    // and plain on repetitive text by a margin (each answer is judged
    // alone), and stay at 97% of plain decoding everywhere.
    let speeds = speeds(CPU_ROUNDS);
    for (regime, forced, auto) in &speeds {
        let real_probes = GateConfig {
            shadow_probes: false,
            ..GateConfig::default()
        };
        let without = replay_recorded_with(CPU_ROUNDS, regime, 2000, real_probes);
        eprintln!("{regime}: auto {without:.3}x plain without shadows");
        assert!(*auto >= 0.97, "{regime}: auto at {auto:.3}x plain decoding");
        assert!(
            *forced < 1.0,
            "{regime}: not the recording described: {forced:.3}"
        );
    }
    // (1.67x with each round credited its whole recorded run, 1.47x
    // with what is left of it.)
    let (_, forced, auto) = speeds[0];
    assert!(
        auto >= 1.4 && auto >= 1.5 * forced,
        "deterministic: auto {auto:.3}x, forced {forced:.3}x"
    );
}

#[test]
fn auto_keeps_dflash_where_it_pays_on_recorded_h200_rounds() {
    // Rounds of the embedded pair on one H200 with the fine-tuned drafter
    // (2026-12-04: plain steps of 1.2-1.6 ms, a round 2-3 plain steps,
    // each answer's first rounds accepting 1-3 tokens before long runs):
    // forced DFlash is ~3x plain decoding on repetitive text (one prompt
    // that accepts ~2 a round takes most of the time), ~2.2x on code and
    // ~0.9x on prose here (4 prompts each, pooled). Auto must keep DFlash
    // on for the first two: at least 80% of forced's speed (it keeps 80%
    // on code, 86% since probes are shadows and the first backoff 16
    // steps: its probes floor the answers whose first rounds lose until a
    // backoff has passed), and on prose be at least plain decoding's 97%.
    let speeds = speeds(H200_ROUNDS);
    for ((regime, forced, auto), forced_at_least) in speeds.iter().copied().zip([2.5, 2.0]) {
        assert!(
            forced > forced_at_least,
            "{regime}: the recording is not the one described: {forced:.3}"
        );
        assert!(
            auto >= 0.8 * forced,
            "{regime}: auto at {auto:.3}x, forced {forced:.3}x"
        );
    }
    let (_, _, auto) = speeds[2];
    assert!(auto >= 0.97, "prose: auto at {auto:.3}x plain decoding");
}

#[test]
fn auto_keeps_dflash_where_it_pays_on_recorded_h100_rounds() {
    // Rounds of the embedded pair on one H100 (2026-12-06, eight prompts a
    // regime, the drafter's maps stacked): the committed two-layer drafter,
    // and a three-layer one whose answers open with more losing rounds
    // before their long runs (forced ~1.5x plain decoding on code in both,
    // pooled with each round's whole time). With the backoff carried from
    // answer to answer and real probes, auto kept 78% of forced on code
    // (1.18x and 1.21x against 1.52x and 1.55x): answers that lost their
    // first rounds were not probed again. Each answer now starts its
    // backoff over, at 16 steps, and probes are shadows: auto keeps 89-92%
    // of forced on code (1.39x), beats forced on repetitive text (it skips
    // the stretches that lose) and stays at 97% of plain decoding on prose.
    for (name, json) in [("committed", H100_ROUNDS), ("three layers", H100_L3_ROUNDS)] {
        eprintln!("{name}:");
        let [(_, det_forced, det), (_, code_forced, code), (_, _, prose)] = speeds(json)[..] else {
            unreachable!("three regimes")
        };
        assert!(
            code_forced > 1.4,
            "{name}: not the recording described: {code_forced:.3}"
        );
        assert!(
            code >= 0.85 * code_forced,
            "{name}, code: auto {code:.3}x, forced {code_forced:.3}x"
        );
        assert!(
            det >= det_forced,
            "{name}, deterministic: auto {det:.3}x, forced {det_forced:.3}x"
        );
        assert!(prose >= 0.97, "{name}, prose: auto {prose:.3}x plain");
    }
}

/// Auto against forced DFlash on a recording whose forced speed is above
/// `forced_above` on code and repetitive text (the recording described):
/// auto keeps at least `code_share` and `det_share` of forced there, and
/// 97% of plain decoding on prose. Returns forced's speed on prose.
fn assert_auto_keeps(json: &str, forced_above: f64, code_share: f64, det_share: f64) -> f64 {
    let [(_, det_forced, det), (_, code_forced, code), (_, prose_forced, prose)] = speeds(json)[..]
    else {
        unreachable!("three regimes")
    };
    assert!(
        code_forced > forced_above && det_forced > forced_above,
        "not the recording described: {code_forced:.3}, {det_forced:.3}"
    );
    assert!(
        code >= code_share * code_forced,
        "code: auto {code:.3}x, forced {code_forced:.3}x"
    );
    assert!(
        det >= det_share * det_forced,
        "deterministic: auto {det:.3}x, forced {det_forced:.3}x"
    );
    assert!(prose >= 0.97, "prose: auto {prose:.3}x plain");
    prose_forced
}

#[test]
fn replayed_where_the_gate_ran_live_on_an_h200() {
    // Rounds of the embedded pair on one H200 (2026-12-06, late: the
    // committed drafter, eight prompts a regime, a plain step 1.07-1.35 ms,
    // a round 2.6-3.4 ms with each draft's time), the run in which this gate
    // ran live: auto kept 99.7% of forced on code (1.90x against 1.91x),
    // beat it on repetitive text (3.29x against 3.26x) and ran prose at
    // 0.96x (0.98x on the goals' four). Replayed over 2,000 tokens (forced
    // pooled over the recorded rounds: 1.65x on both), a lower bound (a
    // round started inside a recorded one is credited only what is left of
    // it): code 1.39x (84% of forced), repetitive text 2.08x, prose 1.08x.
    assert_auto_keeps(H200_LIVE_ROUNDS, 1.5, 0.8, 1.0);
}

#[test]
fn where_every_probe_loses_on_a_gpu_auto_stays_near_plain_decoding() {
    // GPU-like costs, no recording: every round commits 1 or 2 tokens in
    // 2.5 plain steps (forced 0.6x), each answer 96 tokens. Real probes
    // cost a few losing rounds each (one an answer: 0.963x; two, with the
    // backoff started over: 0.932x); shadows cost a draft and are held to
    // 3% of the tokens by their credit.
    let rounds: Vec<String> = (0..60)
        .map(|i| format!("[{}, 1.5, 0.5]", 1 + i % 2))
        .collect();
    let prompt = format!("[{}]", rounds.join(", "));
    let json = format!(
        r#"{{"request_tokens": 96, "regimes": {{"losing": {{"ar_ms": 0.6, "prompts": [{prompt}]}}}}}}"#
    );
    let (forced, auto) = (
        forced_recorded(&json, "losing"),
        replay_recorded(&json, "losing", 2000),
    );
    assert!((forced - 0.6).abs() < 1e-9, "{forced}");
    assert!(auto >= 0.97, "auto {auto:.3}x plain decoding");
}

#[test]
fn replayed_on_an_h100_whose_host_ran_slow() {
    // Rounds of the embedded pair on an H100 whose host ran slow and
    // unsteadily (2026-12-06, morning: plain steps 1.2-3 ms, rounds 2-3.4
    // ms). Live, in the same run, auto kept most deterministic answers plain
    // for tens of steps (3.55x where forced ran 4.66x, mean of per-prompt
    // ratios; one answer plain for 60 of its 96 tokens) and ran prose at
    // 0.94x. Replayed on the recorded costs (forced pooled: 2.38x, 2.22x,
    // 0.94x) the gate keeps 97% of forced on repetitive text and 86% on
    // code and runs prose at 1.02x: its rules hold on these costs, and
    // what fell short live is the live timing (docs/dflash.md, "An
    // answer's opening shadow").
    assert_auto_keeps(H100_SLOW_HOST_ROUNDS, 2.0, 0.8, 0.9);
}

const H100_FAST_HOST_ROUNDS: &str = include_str!("recorded_rounds_h100_1207.json");

#[test]
fn replayed_on_an_h100_whose_host_ran_plain_steps_fast() {
    // Rounds of the embedded pair on an H100 whose host ran queued plain
    // steps in 0.47-0.6 ms (2026-12-07, afternoon), a round 1.3-1.9 ms.
    // Live, in the same run, auto ran two prose answers at 0.59x and 0.61x
    // (forced 0.57x): the gate had learned each batch's first step, 1.0-1.1
    // ms, as the plain step ("A plain step as plain decoding runs it",
    // docs/dflash.md). Replayed on the recorded costs, with plain decoding's
    // own step time, auto keeps prose at plain decoding's speed (0.974x;
    // forced pooled 0.75x) and 80-82% of forced where DFlash pays (code
    // 1.74x against 2.17x, repetitive text 2.14x against 2.60x: a replay
    // credits a round started inside a recorded one only what is left of
    // it, so these are lower bounds).
    let prose_forced = assert_auto_keeps(H100_FAST_HOST_ROUNDS, 1.5, 0.75, 0.75);
    assert!(
        prose_forced < 1.0,
        "not the recording described: {prose_forced:.3}"
    );
}
