//! The gate's tests on scripted machines: a plain step and a DFlash round
//! of given costs drive the state machine of `gate.rs`. `auto` replayed
//! over rounds recorded on real machines is `gate_replay_tests.rs`.

use super::*;
use crate::policy::thermal::{ScriptedThermal, ThermalSource};

/// A scripted machine: a plain step costs `ar_ms`; a DFlash round costs
/// `round_ms` and commits `committed` tokens (all may change over time).
struct Machine {
    ar_ms: f64,
    round_ms: f64,
    committed: usize,
}

/// Drives the gate for `steps` decisions; returns the plan sequence as
/// 'a' (plain step) / 'd' (DFlash round) / 's' (a shadow probe's draft,
/// a third of a round's time here, followed by the plain steps it
/// compares, as `decoding` runs them).
fn drive(gate: &mut Gate, machine: &Machine, steps: usize) -> String {
    let mut trace = String::new();
    for _ in 0..steps {
        match gate.plan() {
            Plan::Plain(_) => {
                gate.observe_ar(machine.ar_ms);
                trace.push('a');
            }
            Plan::Dflash => {
                gate.observe_round(machine.committed, machine.round_ms);
                trace.push('d');
            }
            Plan::Shadow => {
                trace.push('s');
                let compare = shadow_compare(gate, 15);
                for _ in 0..compare {
                    gate.observe_ar(machine.ar_ms);
                    trace.push('a');
                }
                gate.observe_shadow(machine.committed.min(compare + 1), machine.round_ms / 3.0);
            }
        }
    }
    trace
}

/// The drafts a shadow probe compares (as `decoding::shadow` picks them):
/// up to the gate's break-even, at most `drafts`.
pub(super) fn shadow_compare(gate: &Gate, drafts: usize) -> usize {
    gate.shadow_break_even()
        .map_or(drafts, |needed| needed.saturating_sub(1).max(1))
        .min(drafts)
}

fn gate() -> Gate {
    gate_with(GateConfig::default())
}

fn gate_with(config: GateConfig) -> Gate {
    let mut g = Gate::new(config);
    g.set_thermal(ThermalState::Nominal);
    g
}

/// Every probe real rounds (the rules shadows stand in front of).
fn real_probes() -> GateConfig {
    GateConfig {
        shadow_probes: false,
        ..GateConfig::default()
    }
}

#[test]
fn calibrates_then_speculates_while_it_pays() {
    let mut g = gate();
    // 10 ms per plain token; a round of 6 tokens in 20 ms = 3x.
    let fast = Machine {
        ar_ms: 10.0,
        round_ms: 20.0,
        committed: 6,
    };
    let trace = drive(&mut g, &fast, 40);
    assert!(trace.starts_with("aaaad"), "{trace}");
    assert!(!trace[4..].contains('a'), "{trace}");
    assert_eq!(g.state(), GateState::Speculating);
    assert!((g.speedup().unwrap() - 3.0).abs() < 1e-9);
}

#[test]
fn a_new_request_is_probed_by_real_rounds_where_cheap_and_by_a_shadow_once_a_round_is_timed() {
    // One losing round: 1 token in 30 ms vs 10 ms plain steps floors
    // at once (ratio 0.33) and lost 2 plain steps' worth.
    let losing = Machine {
        ar_ms: 10.0,
        round_ms: 30.0,
        committed: 1,
    };
    let mut g = gate_with(real_probes());
    let trace = drive(&mut g, &losing, 6);
    assert_eq!(trace, "aaaadd", "warm-up round, then the judged one");
    assert_eq!(g.state(), GateState::Floored);
    // 2 steps lost > 3% of a 50-token request: stay floored.
    g.begin_request(50);
    assert_eq!(g.state(), GateState::Floored);
    // <= 3% of a 100-token request: probe again, without warm-up.
    g.begin_request(100);
    assert_eq!(g.state(), GateState::Speculating);
    assert_eq!(g.plan(), Plan::Dflash);
    // With shadows, a round's cost known, every new request is probed at
    // once, however short, and by a shadow even where real rounds would be
    // cheap: a shadow costs one draft, a failing probe a few rounds.
    for tokens in [50, 100] {
        let mut g = gate();
        drive(&mut g, &losing, 6);
        g.begin_request(tokens);
        assert_eq!(g.plan(), Plan::Shadow, "{tokens} tokens");
    }
}

#[test]
fn floors_to_plain_decoding_within_a_few_rounds_when_speculation_loses() {
    let mut g = gate();
    // A useless drafter: one token per 30 ms round vs 10 ms plain steps.
    let useless = Machine {
        ar_ms: 10.0,
        round_ms: 30.0,
        committed: 1,
    };
    let trace = drive(&mut g, &useless, 200);
    let first_floor = trace[4..].find('a').unwrap() + 4;
    assert!(
        first_floor - 4 <= 3,
        "floored only after {} rounds: {trace}",
        first_floor - 4
    );
    // Probes back off: 32, 64, 128 plain steps between them.
    let rounds = trace.matches('d').count();
    assert!(rounds <= 12, "{rounds} rounds in 200 steps: {trace}");
    let lost: f64 = rounds as f64 * (30.0 - 10.0);
    let total: f64 = trace.len() as f64 * 10.0 + lost;
    assert!(total / (trace.len() as f64 * 10.0) < 1.25, "{trace}");
}

#[test]
fn a_clearly_losing_probe_costs_one_judged_round() {
    let mut g = gate();
    // 1 token per 40 ms round vs 10 ms plain steps: 0.25x.
    let useless = Machine {
        ar_ms: 10.0,
        round_ms: 40.0,
        committed: 1,
    };
    let trace = drive(&mut g, &useless, 110);
    // Calibration, one warm-up round, one judged round that lost 3 plain
    // steps' worth, then the first backoff (16 steps). The next probe is a
    // shadow: one draft (a third of a round, 1.33 plain steps), the 3
    // plain steps that would show a round paying (4 tokens); it fails, and
    // plain decoding goes on until the draft is 3% of the time (45 steps).
    // (The one after waits longer still: the shadow credit, 3% of each
    // token, must first cover the failed draft.)
    let opening = format!("aaaadd{}saaa", "a".repeat(16));
    assert!(trace.starts_with(&opening), "{trace}");
    let second = trace[opening.len()..].find('s');
    assert!(second.is_some_and(|at| at >= 45), "{trace}");
    assert!(!trace[6..].contains('d'), "{trace}");
    // A round that loses only a little still waits for a second one.
    let mut g = gate();
    let close = Machine {
        ar_ms: 10.0,
        round_ms: 12.0,
        committed: 1,
    };
    let trace = drive(&mut g, &close, 10);
    assert!(trace.starts_with("aaaaddda"), "{trace}");
}

#[test]
fn returns_to_speculation_when_acceptance_recovers() {
    let mut g = gate();
    let useless = Machine {
        ar_ms: 10.0,
        round_ms: 30.0,
        committed: 1,
    };
    drive(&mut g, &useless, 60);
    assert_eq!(g.state(), GateState::Floored);
    let recovered = Machine {
        ar_ms: 10.0,
        round_ms: 30.0,
        committed: 12,
    };
    let trace = drive(&mut g, &recovered, 200);
    assert!(trace.ends_with(&"d".repeat(50)), "{trace}");
    assert_eq!(g.state(), GateState::Speculating);
}

#[test]
fn recalibrates_on_a_thermal_change_and_keeps_each_state_apart() {
    let mut thermal = ScriptedThermal::new(vec![ThermalState::Nominal, ThermalState::Serious]);
    let mut g = Gate::new(GateConfig::default());
    g.set_thermal(thermal.state());
    drive(
        &mut g,
        &Machine {
            ar_ms: 10.0,
            round_ms: 20.0,
            committed: 6,
        },
        20,
    );
    assert_eq!(g.ar_step_ms(), Some(10.0));
    // Hot: plain steps slow to 25 ms; the gate times them afresh.
    g.set_thermal(thermal.state());
    assert_eq!(g.state(), GateState::Calibrating);
    let trace = drive(
        &mut g,
        &Machine {
            ar_ms: 25.0,
            round_ms: 40.0,
            committed: 6,
        },
        20,
    );
    assert!(trace.starts_with("aaaad"), "{trace}");
    assert_eq!(g.ar_step_ms(), Some(25.0));
    // Back to nominal: its calibration is still there, no plain steps needed.
    g.set_thermal(ThermalState::Nominal);
    assert_eq!(g.ar_step_ms(), Some(10.0));
    assert_eq!(g.plan(), Plan::Dflash);
}

#[test]
fn warm_up_rounds_are_not_judged() {
    let mut g = gate();
    drive(
        &mut g,
        &Machine {
            ar_ms: 10.0,
            round_ms: 20.0,
            committed: 6,
        },
        4,
    );
    assert_eq!(g.state(), GateState::WarmingUp);
    // A very slow first round (kernels compiling) does not floor the gate.
    g.observe_round(1, 5000.0);
    assert_eq!(g.state(), GateState::Speculating);
    assert_eq!(g.speedup(), None);
}

/// Plain steps of `ms` until the gate asks for a DFlash round.
fn calibrate(g: &mut Gate, ms: f64) {
    while g.plan() != Plan::Dflash {
        g.observe_ar(ms);
    }
}

/// A gate in a request of `request_tokens`, calibrated on 10 ms steps,
/// that has run its first entry's warm-up round (`committed` in `ms`).
fn probing(request_tokens: usize, committed: usize, ms: f64) -> Gate {
    let mut g = gate();
    g.begin_request(request_tokens);
    calibrate(&mut g, 10.0);
    g.observe_round(committed, ms);
    g
}

/// Judged rounds of `committed` tokens in `ms` until the gate floors.
fn judged_until_floored(g: &mut Gate, committed: usize, ms: f64) -> usize {
    let mut judged = 0;
    while g.plan() == Plan::Dflash {
        g.observe_round(committed, ms);
        judged += 1;
        assert!(judged < 50, "{committed} tokens in {ms} ms: never floored");
    }
    judged
}

#[test]
fn within_a_request_short_first_rounds_do_not_floor_a_probe_that_then_pays() {
    // 10 ms steps, 20 ms rounds: a 1-token round loses one step.
    let mut g = gate();
    g.begin_request(96); // may lose 3% of 96 = 2.88 steps
    calibrate(&mut g, 10.0);
    g.observe_round(1, 20.0); // the first entry's warm-up round
    for _ in 0..2 {
        g.observe_round(1, 20.0);
        assert_eq!(g.plan(), Plan::Dflash, "two short rounds decided");
    }
    g.observe_round(16, 20.0);
    g.observe_round(16, 20.0);
    assert_eq!(g.state(), GateState::Speculating);
    assert!(g.speedup().unwrap() > 1.0);
    // Outside a request the average decides, as before: two judged
    // losing rounds floor.
    let mut g = gate();
    calibrate(&mut g, 10.0);
    for committed in [1, 1, 1] {
        g.observe_round(committed, 20.0);
    }
    assert_eq!(g.state(), GateState::Floored);
}

#[test]
fn within_a_request_a_useless_probe_costs_about_its_budget() {
    let mut g = probing(96, 1, 20.0);
    let judged = judged_until_floored(&mut g, 1, 20.0);
    // Losses of one step each: decayed -1, -1.8, -2.44 (not yet below
    // -2.88), summed -1, -2, -3 < -2.88 while losing.
    assert_eq!(judged, 3);
    assert_eq!(g.state(), GateState::Floored);
}

#[test]
fn a_new_request_is_judged_on_its_own_rounds() {
    // An answer of long runs (16 tokens in 2 steps' time) banks gain; the
    // next answer loses 1.5 steps a round and must floor as soon as if it
    // were the first (summed: -1.5, -3 < -2.88), not after the dozens of
    // rounds that bank would pay for.
    let mut g = probing(96, 16, 20.0);
    for _ in 0..5 {
        g.observe_round(16, 20.0);
    }
    assert_eq!(g.state(), GateState::Speculating);
    g.begin_request(96);
    assert_eq!(judged_until_floored(&mut g, 1, 25.0), 2);
}

#[test]
fn without_shadows_after_a_failed_probe_a_new_request_is_probed_where_a_round_is_cheap() {
    // A failed probe lost more than 3% of a 96-token request (three
    // rounds of 1.5 steps), yet one losing round costs only 1.5 steps:
    // each new answer gets its probe (GPU-like). Where a round costs 13
    // steps (CPU-like), only an answer long enough to afford one does.
    // (With shadows on, each is probed by a shadow instead: the test above.)
    for (round_ms, reprobes_at_96, reprobes_at_500) in [(25.0, true, true), (130.0, false, true)] {
        let mut g = gate_with(real_probes());
        g.begin_request(96);
        calibrate(&mut g, 10.0);
        g.observe_round(1, round_ms);
        judged_until_floored(&mut g, 1, round_ms);
        assert_eq!(g.state(), GateState::Floored);
        assert!(
            g.failed_probe_loss > 2.88,
            "{round_ms}: {}",
            g.failed_probe_loss
        );
        g.begin_request(96);
        assert_eq!(
            g.plan() == Plan::Dflash,
            reprobes_at_96,
            "{round_ms} ms, 96 tokens"
        );
        g.begin_request(500);
        assert_eq!(
            g.plan() == Plan::Dflash,
            reprobes_at_500,
            "{round_ms} ms, 500 tokens"
        );
    }
}

#[test]
fn a_steady_mild_loser_floors_within_a_long_request() {
    // 256 tokens may lose 7.68 steps. Rounds losing 1 step each take the
    // decayed sum only towards -5, never below -7.68; their plain sum
    // passes it at the 8th judged round.
    let mut g = probing(256, 1, 20.0);
    assert_eq!(judged_until_floored(&mut g, 1, 20.0), 8);
}

#[test]
fn a_failed_probe_is_followed_by_a_shadow_after_the_first_backoff_where_rounds_are_dear_too() {
    // GPU-like (a round 2.5 steps) and CPU-like (16 steps, one losing
    // round 15 > 3% of 400 tokens): a failed probe is followed by the
    // 16-step backoff, then a second probe of the same long answer, a
    // shadow. Where rounds are dear the shadow costs a draft, not a round:
    // the shadow credit and the shadow's own backoff hold drafts to 3% of
    // the time (what the probe's loss once bought with 500 plain steps).
    for round_ms in [25.0, 160.0] {
        let mut g = probing(400, 1, round_ms);
        judged_until_floored(&mut g, 1, round_ms);
        let plain = (0..200)
            .take_while(|_| match g.plan() {
                Plan::Plain(_) => {
                    g.observe_ar(10.0);
                    true
                }
                Plan::Dflash | Plan::Shadow => false,
            })
            .count();
        assert_eq!(plain, 16, "{round_ms} ms rounds");
        assert_eq!(g.plan(), Plan::Shadow, "{round_ms} ms rounds");
    }
}

#[test]
fn a_fresh_process_s_slow_first_rounds_do_not_keep_an_answer_from_its_long_runs() {
    // A GPU in a fresh process: plain steps 10 ms, its first three rounds
    // 45 ms (kernels still loading; 4.5 steps, dear against a 96-token
    // answer), the next 25 ms; the answer's text gives drafts 1 token a
    // round over its first 12 tokens, 9 after. The gate floors after the
    // slow, short rounds; a shadow at the first backoff finds the long
    // runs and speculation resumes, where the slow rounds' loss once bought
    // ~230 plain steps: the rest of the answer (measured on an H100,
    // 2026-12-06: auto 1.07x against forced 3.04x on such a prompt).
    let mut g = gate();
    calibrate(&mut g, 10.0);
    g.begin_request(96);
    let (mut at, mut ms, mut rounds) = (0usize, 0.0, 0usize);
    let mut trace = String::new();
    while at < 96 {
        let committed = if at < 12 { 1 } else { 9 };
        let round_ms = if rounds < 3 { 45.0 } else { 25.0 };
        match g.plan() {
            Plan::Plain(_) => {
                g.observe_ar(10.0);
                (at, ms) = (at + 1, ms + 10.0);
                trace.push('a');
            }
            Plan::Dflash => {
                g.observe_round(committed, round_ms);
                (at, ms, rounds) = (at + committed, ms + round_ms, rounds + 1);
                trace.push('d');
            }
            Plan::Shadow => {
                let compare = shadow_compare(&g, 15);
                for _ in 0..compare {
                    g.observe_ar(10.0);
                }
                (at, ms) = (at + compare, ms + round_ms / 3.0 + compare as f64 * 10.0);
                g.observe_shadow(committed.min(compare + 1), round_ms / 3.0);
                trace.push('s');
            }
        }
    }
    let speed = at as f64 * 10.0 / ms;
    assert!(
        trace.contains('s') && trace.matches('d').count() > 5,
        "{trace}"
    );
    assert!(speed > 1.5, "{speed:.2}x plain: {trace}");
}

#[test]
fn each_new_answer_is_probed_on_the_first_answers_schedule_where_probes_are_cheap() {
    // GPU-like rounds (2.5 steps, 1 token each: every probe fails). Each
    // answer's shadows fail and double its backoff; the next answer must
    // start over (an answer whose first rounds lose often has long runs
    // later), so every answer after the first (which also calibrated and
    // ran the real first probe) is probed on the same schedule.
    let losing = Machine {
        ar_ms: 10.0,
        round_ms: 25.0,
        committed: 1,
    };
    let mut g = gate();
    g.begin_request(400);
    drive(&mut g, &losing, 400);
    let answers: Vec<String> = (0..3)
        .map(|_| {
            g.begin_request(400);
            drive(&mut g, &losing, 400)
        })
        .collect();
    assert!(answers[0].matches('s').count() >= 3, "{}", answers[0]);
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
}

#[test]
fn a_new_request_with_the_shadow_credit_spent_waits_one_first_backoff() {
    // GPU-like rounds (2.5 steps): the probe fails and floors. Say earlier
    // answers' backoffs left 500 steps and short answers spent the credit
    // on their opening shadows: a new answer, where a probe is cheap, must
    // wait a first backoff for its shadow, not the 500 steps.
    // Where a probe is dear against the request (CPU-like, 16-step rounds
    // at 96 tokens), the old backoff stands.
    for (round_ms, waits) in [(25.0, 16), (160.0, 500)] {
        let mut g = probing(96, 1, round_ms);
        judged_until_floored(&mut g, 1, round_ms);
        g.floored_left = 500;
        g.shadow_credit = -0.5;
        g.begin_request(96);
        assert_eq!(g.plan(), Plan::Plain(waits), "{round_ms} ms rounds");
    }
}

#[test]
fn a_round_cost_learned_in_one_thermal_state_does_not_judge_another() {
    // Nominal: rounds of 2.5 plain steps that commit 1 token floor the
    // gate, and a new request is then probed by a shadow.
    let losing = Machine {
        ar_ms: 10.0,
        round_ms: 25.0,
        committed: 1,
    };
    let mut g = gate();
    drive(&mut g, &losing, 8);
    assert_eq!(g.state(), GateState::Floored);
    assert_eq!(g.shadow_break_even(), Some(3));
    // Hot: no round was timed in this state, so nothing says what one costs
    // there: once calibrated, the first probe is real rounds, not a shadow
    // judged by the cool machine's cost.
    g.set_thermal(ThermalState::Serious);
    assert_eq!(g.shadow_break_even(), None);
    g.begin_request(400);
    let hot = Machine {
        ar_ms: 20.0,
        round_ms: 120.0,
        committed: 1,
    };
    let trace = drive(&mut g, &hot, 6);
    assert!(trace.starts_with("aaaad"), "{trace}");
    assert_eq!(g.shadow_break_even(), Some(6));
    // Back to nominal: its own round cost judges its shadows again.
    g.set_thermal(ThermalState::Nominal);
    assert_eq!(g.shadow_break_even(), Some(3));
}

#[test]
fn where_a_draft_is_dear_failed_shadows_still_wait_for_at_most_a_full_credit() {
    // A draft costs 8 plain steps (a round 24): after three failed
    // shadows the fourth would wait for 4 x 8 = 32 steps of credit, more
    // than the credit can hold (20), and the answer would never be probed
    // again. It waits for a full credit instead.
    let losing = Machine {
        ar_ms: 10.0,
        round_ms: 240.0,
        committed: 1,
    };
    let mut g = gate();
    drive(&mut g, &losing, 8);
    g.begin_request(20_000);
    let trace = drive(&mut g, &losing, 8_000);
    assert!(trace.matches('s').count() >= 5, "{trace}");
    assert!(!trace.contains('d'), "{trace}");
}

#[test]
fn an_answer_s_opening_shadow_is_paid_from_its_own_budget_whatever_earlier_answers_spent() {
    // GPU-like: plain steps 10 ms, a draft 8 ms (0.8 steps), rounds 25 ms.
    // Answers whose text defeats the drafter spend the shadow credit on
    // their shadows (say it stands at -3 steps, 100 tokens of credit); then
    // comes an answer the drafter gets 15 tokens a round right. One draft
    // fits its own budget (3% of 96 tokens: 2.9 steps), so it is probed by
    // a shadow at once and speculates; the debt once kept such answers
    // plain to their end (measured on an H100, 2026-12-06: auto 1.09x
    // where forced DFlash ran 4.87x on the deterministic prompts).
    let losing = Machine {
        ar_ms: 10.0,
        round_ms: 25.0,
        committed: 1,
    };
    let mut g = gate();
    drive(&mut g, &losing, 8);
    g.begin_request(96);
    drive(&mut g, &losing, 96);
    assert!(g.draft_steps().is_some(), "a shadow has timed a draft");
    g.shadow_credit = -3.0;
    g.begin_request(96);
    assert_eq!(g.plan(), Plan::Shadow);
    let winning = Machine {
        ar_ms: 10.0,
        round_ms: 25.0,
        committed: 15,
    };
    let trace = drive(&mut g, &winning, 6);
    assert!(trace.starts_with('s') && trace.ends_with("ddd"), "{trace}");
    // Where one draft is more than the answer's budget (a CPU-like 4-step
    // draft against a 32-token answer's 0.96), the debt stands.
    let mut g = gate();
    drive(&mut g, &losing, 8);
    assert_eq!(g.state(), GateState::Floored);
    g.calibration().draft_steps = Some(4.0);
    g.shadow_credit = -3.0;
    g.begin_request(32);
    assert!(matches!(g.plan(), Plan::Plain(_)), "{:?}", g.plan());
}

#[test]
fn a_shadow_whose_draft_stalled_once_does_not_hold_the_next_answers_plain() {
    // As an H100 ran the embedded pair (2026-12-06): plain steps 1 ms, a
    // draft 0.8 ms, rounds 2.5 ms. One shadow's draft, over a context
    // length its drafter had not met, took 11.6 ms and failed. Taken as
    // the draft's cost (11.6 steps), it put the credit 11.6 steps in debt
    // (some 390 tokens of credit) and no answer's budget fit a draft, so
    // the next answer, one the drafter gets 15 tokens a round right (forced
    // DFlash 5x), ran plain from its first token to its last.
    let losing = Machine {
        ar_ms: 1.0,
        round_ms: 2.5,
        committed: 1,
    };
    let mut g = gate();
    drive(&mut g, &losing, 8);
    g.begin_request(96);
    let mut stalled = false;
    for _ in 0..96 {
        match g.plan() {
            Plan::Shadow if !stalled => {
                stalled = true;
                g.observe_shadow(1, 11.6);
            }
            Plan::Shadow => g.observe_shadow(1, 0.8),
            Plan::Plain(_) => g.observe_ar(1.0),
            Plan::Dflash => {
                g.observe_round(1, 2.5);
            }
        }
    }
    assert!(stalled, "the answer was probed by a shadow");
    let draft = g.draft_steps().unwrap();
    assert!(draft <= 2.5, "a draft costs at most a round: {draft}");
    g.begin_request(96);
    assert_eq!(g.plan(), Plan::Shadow);
    let winning = Machine {
        ar_ms: 1.0,
        round_ms: 2.5,
        committed: 15,
    };
    let trace = drive(&mut g, &winning, 8);
    assert!(trace.starts_with('s') && trace.ends_with("ddd"), "{trace}");
}

#[test]
fn a_plain_step_is_learned_only_where_it_ran_as_plain_decoding_runs_it() {
    // (index in the batch, next step queued behind it, token chosen on the host)
    assert!(
        !Gate::learns_plain_step(0, true, false),
        "a batch's first step: its whole launch"
    );
    assert!(Gate::learns_plain_step(1, true, false));
    assert!(Gate::learns_plain_step(7, true, false));
    assert!(
        !Gate::learns_plain_step(7, false, false),
        "the last: nothing queued behind"
    );
    assert!(!Gate::learns_plain_step(0, false, false), "a batch of one");
    for (index, queued) in [(0, false), (0, true), (3, false)] {
        assert!(
            Gate::learns_plain_step(index, queued, true),
            "host steps are timed whole"
        );
    }
}

/// Plain batches as `decoding::plain_steps` runs them on a GPU: the first
/// step of a batch waits for its whole launch (`first_ms`), the others
/// are queued behind it (`queued_ms`), and the gate learns a step only
/// where [`Gate::learns_plain_step`] says so.
fn run_device_batch(gate: &mut Gate, n: usize, first_ms: f64, queued_ms: f64) {
    for i in 0..n {
        let ms = if i == 0 { first_ms } else { queued_ms };
        if Gate::learns_plain_step(i, i + 1 < n, false) {
            gate.observe_ar(ms);
        }
    }
}

#[test]
fn on_a_gpu_the_gate_learns_the_queued_step_time_and_still_calibrates() {
    // A fast H100 host (2026-12-07): a batch's first step 1.05 ms, queued
    // steps 0.47. Learned with the first steps, the plain step read 1.1 ms
    // and prose rounds committing 1-2 tokens in 1.3-1.5 ms looked like
    // 0.8-1.7x wins while plain decoding ran them at 0.57x.
    let mut g = gate();
    let mut batches = 0;
    while let Plan::Plain(n) = g.plan() {
        run_device_batch(&mut g, n, 1.05, 0.47);
        batches += 1;
        assert!(batches < 4, "calibration never ends: {:?}", g.state());
    }
    assert_eq!(g.plan(), Plan::Dflash);
    assert!(
        (g.ar_step_ms().unwrap() - 0.47).abs() < 1e-9,
        "{:?}",
        g.ar_step_ms()
    );
    // A prose round: 1.6 tokens in 1.4 ms is a loss at 0.47 ms a token.
    let ratio = g.observe_round(2, 1.4).unwrap();
    assert!(ratio < 0.7, "{ratio}");
}
