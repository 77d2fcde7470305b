//! The realized-speedup gate: speculate only while it measurably pays.
//!
//! It measures the warm plain-decoding step time (the first, cold step is
//! discarded) and, per DFlash round, the realized speedup
//! `committed x t_ar / round_time`, averaged over rounds. Within a request
//! it floors once the probe's recent rounds (a decayed sum of their gain in
//! plain steps, `gain_decay`) lost more than `probe_budget` of the
//! request's max_tokens, or, while they are losing, all its rounds since
//! the probe or the request began did (a steady mild loser: the decayed
//! sum alone never reaches a long request's budget); so the few short
//! rounds that open many answers do not decide and a useless drafter's
//! probe costs about that budget. Outside a request it floors when the
//! average falls below 1 (a round below 0.5 at once). Floored, it runs
//! plain decoding for a backoff (16 steps, doubling to 1024 while probes
//! keep failing; where probes are cheap, each new request starts it over),
//! then re-probes. Where one losing round costs more than the request's
//! budget (a CPU: a round is 4-13 plain steps), the backoff is also never
//! shorter than what keeps a failed probe's loss to `probe_budget` of the
//! plain steps around it. Warm-up rounds (unjudged) run on the first entry
//! per calibration only: later probes find caches and kernels warm. A new
//! request (new text, so perhaps another regime) is judged on its own
//! rounds, and probed at its start where the shadow credit allows. Once a
//! round's cost is known, a probe is first a shadow: one draft, compared
//! with the plain tokens that follow, which says exactly what a round there
//! would have committed, for the draft's cost alone; only a shadow that
//! would have paid starts real rounds. Shadows spend a credit of
//! `probe_budget` of the tokens committed, and a failed one's backoff keeps
//! its draft to `probe_budget` of the plain steps around it (docs/dflash.md,
//! "Shadow probes", "Backoffs, answer by answer"). Calibration
//! (a plain step's time, a round's and a shadow's draft's cost in plain
//! steps) is kept per thermal state: a state change switches to (or
//! starts) that state's calibration. Measured throughput decides; the thermal state only
//! says when old measurements stop holding. Forced DFlash rounds are only
//! measured ([`Gate::realized`]), never judged: they must not leave the gate
//! floored for the next "auto" request.

use crate::policy::thermal::ThermalState;
use serde::Serialize;
use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct GateConfig {
    /// Plain steps to time before the first DFlash round (first one discarded).
    pub calibration_steps: usize,
    /// Rounds after (re)entering DFlash that are not judged (caches, kernels warm up).
    pub warmup_rounds: usize,
    /// Judged rounds before the gate may floor (a clearly losing round, see
    /// `floor_at_once_below`, floors at once).
    pub judge_after: usize,
    /// A judged round whose realized speedup is below this floors at once:
    /// a probe of a useless drafter then costs one judged round, not two.
    pub floor_at_once_below: f64,
    pub first_backoff: usize,
    pub max_backoff: usize,
    /// A failed probe lost this many plain steps' worth of time: the backoff
    /// after it is at least loss / probe_budget steps, so probes that keep
    /// failing cost about this share of plain decoding (where a verify costs
    /// many plain steps, as on a CPU, a probe is expensive and rare).
    pub probe_budget: f64,
    /// Speculate while the averaged realized speedup is at least this
    /// (outside a request; within one, `gain_decay` decides).
    pub keep_above: f64,
    /// Within a request, a probe goes on while its rounds' gain over plain
    /// decoding, in plain steps and summed with this decay per round, stays
    /// above minus `probe_budget` of the request's max_tokens: an answer's
    /// first rounds often accept 1-3 tokens before its long runs, so two
    /// rounds must not decide, yet a run of losing rounds soon does.
    pub gain_decay: f64,
    /// Probe with a shadow (one draft, compared with the plain steps that
    /// follow) once a round's cost is known; off, every probe is real rounds.
    pub shadow_probes: bool,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            calibration_steps: 4,
            warmup_rounds: 1,
            judge_after: 2,
            floor_at_once_below: 0.5,
            first_backoff: 16,
            max_backoff: 1024,
            probe_budget: 0.03,
            keep_above: 1.0,
            gain_decay: 0.8,
            shadow_probes: true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum GateState {
    /// Timing plain steps for this thermal state.
    Calibrating,
    /// Speculating, not judged yet.
    WarmingUp,
    Speculating,
    /// Plain decoding until the next probe.
    Floored,
}

/// What the loop should run next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Plain steps: this many before asking again.
    Plain(usize),
    Dflash,
    /// A shadow probe: draft as a round would, decode plainly, and report
    /// what the round would have committed ([`Gate::observe_shadow`]).
    Shadow,
}

#[derive(Clone, Debug, Default)]
struct Calibration {
    ar_ms: Option<f64>,
    steps_seen: usize,
    /// Speculation has run its warm-up rounds in this state.
    warmed: bool,
    /// A judged round's time in plain steps (averaged): what one losing
    /// round costs, and so what a new request's probe risks. A throttled
    /// machine's rounds and steps slow by different factors, so each
    /// thermal state learns its own.
    round_steps: Option<f64>,
    /// The last shadow probe's draft time in plain steps, at most a
    /// round's.
    draft_steps: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct Gate {
    config: GateConfig,
    calibrations: HashMap<ThermalState, Calibration>,
    thermal: ThermalState,
    state: GateState,
    speedup: Option<f64>,
    judged: usize,
    warmup_left: usize,
    floored_left: usize,
    backoff: usize,
    /// Plain steps' worth of time the judged rounds since entering
    /// speculation (or since it last paid) lost: round time / plain step
    /// time - committed, summed.
    probe_loss: f64,
    /// probe_loss of the last probe that failed.
    failed_probe_loss: f64,
    /// The probe's recent gain in plain steps: committed - round time /
    /// plain step time, summed with `gain_decay` per round.
    recent_gain: f64,
    /// The same gain summed without decay since the probe or the request
    /// began: a steady mild loser never takes the decayed sum below
    /// 1 / (1 - gain_decay) = 5 rounds' loss, so in a long request (a
    /// budget above that) only this floors it.
    request_gain: f64,
    /// `probe_budget` of the current request's max_tokens, in plain steps
    /// (0 outside a request).
    affordable_loss: f64,
    /// Floored, a shadow probe is the next plan.
    shadow_due: bool,
    /// What shadow probes may still spend, in plain steps: `probe_budget`
    /// of every token committed, less each shadow's draft (at most
    /// [`MAX_SHADOW_CREDIT`]).
    shadow_credit: f64,
    /// Shadow probes of this request that failed in a row (the next waits
    /// for credit for that many drafts, up to [`MAX_SHADOW_WAIT`]).
    shadow_failures: u32,
}

/// Within a request, a failing text's shadows wait for at most this many
/// drafts' credit.
const MAX_SHADOW_WAIT: u32 = 4;

/// Shadow credit saved at most, in plain steps: a long plain stretch buys
/// a few shadows, not an unbounded run of them.
const MAX_SHADOW_CREDIT: f64 = 20.0;

impl Gate {
    pub fn new(config: GateConfig) -> Self {
        let backoff = config.first_backoff;
        Gate {
            config,
            calibrations: HashMap::new(),
            thermal: ThermalState::Unknown,
            state: GateState::Calibrating,
            speedup: None,
            judged: 0,
            warmup_left: 0,
            floored_left: 0,
            backoff,
            probe_loss: 0.0,
            failed_probe_loss: 0.0,
            recent_gain: 0.0,
            request_gain: 0.0,
            affordable_loss: 0.0,
            shadow_due: false,
            shadow_credit: 0.0,
            shadow_failures: 0,
        }
    }

    /// A request of up to `max_tokens` tokens starts. Its text is new, so
    /// its rounds are judged on their own: the gain earlier answers banked
    /// does not carry over (it let a losing answer speculate for 16 rounds
    /// after a winning one, docs/acceptance.md). Where a probe is cheap
    /// against the request (one losing round, its time in plain steps less
    /// the one token it commits, costs at most `probe_budget` of it, so the
    /// in-request rule floors a failing probe after about that budget), its
    /// backoff starts over: doubled by earlier answers' failed probes, it
    /// kept an answer whose first rounds lost from being probed again
    /// before its long runs (docs/dflash.md, "Backoffs, answer by answer").
    /// A floored gate probes the new text at once: once a round's cost is
    /// known, with a shadow (where the credit is spent, after a first
    /// backoff if the probe is cheap, else when the old backoff ends);
    /// before that, where a probe is cheap, with real rounds.
    pub fn begin_request(&mut self, max_tokens: usize) {
        self.affordable_loss = self.config.probe_budget * max_tokens as f64;
        self.shadow_failures = 0;
        self.recent_gain = 0.0;
        self.request_gain = 0.0;
        // Earlier answers' shadows do not keep this one from its opening
        // shadow where one draft fits its own budget: its text is new, and
        // a debt of a few drafts once kept an answer the drafter got right
        // 15 tokens a round plain to its end (docs/dflash.md, "An answer's
        // opening shadow").
        if self
            .draft_steps()
            .is_some_and(|d| d <= self.affordable_loss)
        {
            self.shadow_credit = self.shadow_credit.max(0.0);
        }
        let cheap = self.probe_is_cheap();
        if cheap {
            // What earlier answers' backoffs left is not this answer's to
            // wait (where the shadow credit is spent, it waits at most this).
            self.backoff = self.config.first_backoff;
            self.floored_left = self.floored_left.min(self.backoff);
        }
        if self.state == GateState::Floored {
            if self.shadows_apply() {
                self.shadow_due = self.shadow_affordable();
            } else if cheap {
                self.enter_speculation();
            }
        }
    }

    /// A probe would be a shadow: shadows are on and a round's cost is
    /// known to judge one by.
    fn shadows_apply(&self) -> bool {
        self.config.shadow_probes && self.round_steps().is_some()
    }

    /// The shadow credit is not spent: it keeps shadows to `probe_budget`
    /// of the tokens committed however their drafts cost (a draft after a
    /// long prompt first reads up to the drafter's window of context, about
    /// twice a steady one here). Within a request, after failed shadows, a
    /// shadow waits for credit for as many drafts as failed (text that
    /// keeps failing is probed less often); a new request is new text.
    /// The wait never asks for more than the credit can hold: where a draft
    /// costs over a fourth of it, the fourth failed shadow would otherwise
    /// end the answer's probes.
    fn shadow_affordable(&self) -> bool {
        let wait = self.shadow_failures.min(MAX_SHADOW_WAIT) as f64;
        let needed = wait * self.draft_steps().unwrap_or(0.0);
        self.shadow_credit >= needed.min(MAX_SHADOW_CREDIT)
    }

    /// `committed` tokens were committed: shadow credit for each.
    fn earn_credit(&mut self, committed: usize) {
        self.shadow_credit = (self.shadow_credit + self.config.probe_budget * committed as f64)
            .min(MAX_SHADOW_CREDIT);
    }

    /// The tokens a round must commit to pay for itself (its time in plain
    /// steps, times `keep_above`): a shadow probe that matched one less in
    /// drafts has shown what it needs to. None before a round was timed.
    pub fn shadow_break_even(&self) -> Option<usize> {
        self.round_steps()
            .map(|steps| (steps * self.config.keep_above).ceil().max(1.0) as usize)
    }

    /// A shadow probe's outcome: a round at its position would have
    /// committed `committed` tokens; its draft took `draft_ms`. At the
    /// break-even or above, speculation starts (its rounds judged as any
    /// probe's); below it, plain decoding goes on for a backoff that keeps
    /// failed shadows to `probe_budget` of the time, doubling as probes
    /// keep failing.
    pub fn observe_shadow(&mut self, committed: usize, draft_ms: f64) {
        self.shadow_due = false;
        if let Some(ar) = self.ar_step_ms() {
            // A draft is part of a round: one timed above a whole round's
            // cost met a one-off stall (on a GPU, the first draft over a
            // context length not seen before builds its kernels' plans:
            // 4-12 ms where a draft takes 0.6-1 ms), and taken as the
            // draft's cost it held later answers plain to their end
            // (docs/dflash.md, "A shadow's stalled draft").
            let steps = match self.round_steps() {
                Some(round) => (draft_ms / ar.max(1e-9)).min(round),
                None => draft_ms / ar.max(1e-9),
            };
            self.shadow_credit -= steps;
            let calibration = self.calibration();
            calibration.draft_steps = Some(steps);
        }
        if self
            .shadow_break_even()
            .is_none_or(|needed| committed >= needed)
        {
            self.shadow_failures = 0;
            self.enter_speculation();
            return;
        }
        self.shadow_failures += 1;
        let budgeted =
            (self.draft_steps().unwrap_or(0.0) / self.config.probe_budget).ceil() as usize;
        let backoff = self.backoff.max(budgeted).min(self.config.max_backoff);
        self.state = GateState::Floored;
        self.floored_left = backoff;
        self.backoff = (backoff * 2).min(self.config.max_backoff);
    }

    /// Within a request, one losing round (its time in plain steps less the
    /// token it commits) costs at most the request's budget. Before a round
    /// was timed in this thermal state no probe has failed in it either, so
    /// the first is taken as cheap: the in-request rule bounds its loss.
    fn probe_is_cheap(&self) -> bool {
        let cost = self.round_steps().map_or(0.0, |steps| steps - 1.0);
        self.affordable_loss > 0.0 && cost <= self.affordable_loss
    }

    fn round_steps(&self) -> Option<f64> {
        self.calibrations
            .get(&self.thermal)
            .and_then(|c| c.round_steps)
    }

    fn draft_steps(&self) -> Option<f64> {
        self.calibrations
            .get(&self.thermal)
            .and_then(|c| c.draft_steps)
    }

    /// The current thermal state's calibration.
    fn calibration(&mut self) -> &mut Calibration {
        self.calibrations.entry(self.thermal).or_default()
    }

    pub fn state(&self) -> GateState {
        self.state
    }

    pub fn thermal(&self) -> ThermalState {
        self.thermal
    }

    /// The averaged realized speedup of recent judged rounds.
    pub fn speedup(&self) -> Option<f64> {
        self.speedup
    }

    /// The warm plain step time for the current thermal state.
    pub fn ar_step_ms(&self) -> Option<f64> {
        self.calibrations.get(&self.thermal).and_then(|c| c.ar_ms)
    }

    /// Whether the plain step `index` of a batch is what plain decoding
    /// costs a token, so the gate may learn its time (timed from the commit
    /// before it). A token chosen on the host was computed whole before it
    /// was read: every such step is. A device step is where the next one
    /// was queued behind it and it was itself queued behind the one before
    /// (not the batch's first): the first waits for its whole launch
    /// (1.0-1.1 ms against 0.47 queued on a fast H100 host, 2026-12-07;
    /// learned, they made DFlash look twice as good as it was on prose,
    /// docs/dflash.md, "A plain step as plain decoding runs it"), and the
    /// last, read back with nothing queued behind it, waited only for work
    /// queued in the interval before (~0.05 ms against ~2 ms steps on an
    /// H200; learned, one such step a request pulled the step time 30% low).
    pub fn learns_plain_step(index: usize, next_queued: bool, chosen_on_host: bool) -> bool {
        chosen_on_host || (index > 0 && next_queued)
    }

    pub fn plan(&self) -> Plan {
        match self.state {
            GateState::Calibrating => {
                let seen = self
                    .calibrations
                    .get(&self.thermal)
                    .map_or(0, |c| c.steps_seen);
                // Two more than it still needs: a device batch's first and
                // last steps are not learned (`learns_plain_step`).
                Plan::Plain(self.config.calibration_steps.saturating_sub(seen) + 2)
            }
            GateState::Floored if self.shadow_due => Plan::Shadow,
            GateState::Floored => Plan::Plain(self.floored_left.max(1)),
            GateState::WarmingUp | GateState::Speculating => Plan::Dflash,
        }
    }

    /// A thermal reading; a change recalibrates for the new state.
    pub fn set_thermal(&mut self, thermal: ThermalState) {
        if thermal == self.thermal {
            return;
        }
        self.thermal = thermal;
        self.shadow_due = false;
        self.speedup = None;
        self.judged = 0;
        self.backoff = self.config.first_backoff;
        if self.ar_step_ms().is_some() {
            self.enter_speculation();
        } else {
            self.state = GateState::Calibrating;
        }
    }

    /// One plain step took `ms`.
    pub fn observe_ar(&mut self, ms: f64) {
        self.earn_credit(1);
        let calibration = self.calibrations.entry(self.thermal).or_default();
        calibration.steps_seen += 1;
        if calibration.steps_seen > 1 {
            calibration.ar_ms = Some(match calibration.ar_ms {
                Some(old) => 0.7 * old + 0.3 * ms,
                None => ms,
            });
        }
        match self.state {
            GateState::Calibrating
                if calibration.steps_seen >= self.config.calibration_steps
                    && calibration.ar_ms.is_some() =>
            {
                self.enter_speculation()
            }
            GateState::Floored if !self.shadow_due => {
                self.floored_left = self.floored_left.saturating_sub(1);
                if self.floored_left == 0 {
                    // A probe goes first as a shadow, when the credit covers
                    // it (else another first backoff's wait).
                    if !self.shadows_apply() {
                        self.enter_speculation();
                    } else if self.shadow_affordable() {
                        self.shadow_due = true;
                    } else {
                        self.floored_left = self.config.first_backoff;
                    }
                }
            }
            _ => {}
        }
    }

    /// The realized speedup over plain decoding of a round that committed
    /// `committed` tokens in `ms`, when the plain step time is known; the
    /// gate's state does not change (forced rounds are only measured).
    pub fn realized(&self, committed: usize, ms: f64) -> Option<f64> {
        self.ar_step_ms()
            .map(|ar| committed as f64 * ar / ms.max(1e-9))
    }

    /// One DFlash round the gate chose committed `committed` tokens in `ms`.
    /// Returns the round's realized speedup over plain decoding, when it is
    /// known.
    pub fn observe_round(&mut self, committed: usize, ms: f64) -> Option<f64> {
        self.earn_credit(committed);
        let ratio = self.realized(committed, ms);
        match self.state {
            GateState::WarmingUp => {
                self.warmup_left = self.warmup_left.saturating_sub(1);
                if self.warmup_left == 0 {
                    self.state = GateState::Speculating;
                    if let Some(c) = self.calibrations.get_mut(&self.thermal) {
                        c.warmed = true;
                    }
                }
            }
            GateState::Speculating => {
                if let (Some(ratio), Some(ar)) = (ratio, self.ar_step_ms()) {
                    let steps = ms / ar.max(1e-9);
                    let calibration = self.calibration();
                    calibration.round_steps = Some(match calibration.round_steps {
                        Some(old) => 0.7 * old + 0.3 * steps,
                        None => steps,
                    });
                    let loss = steps - committed as f64;
                    self.probe_loss += loss;
                    self.recent_gain = self.config.gain_decay * self.recent_gain - loss;
                    self.request_gain -= loss;
                    self.judge(ratio);
                }
            }
            GateState::Calibrating | GateState::Floored => {}
        }
        ratio
    }

    fn judge(&mut self, ratio: f64) {
        let averaged = match self.speedup {
            Some(old) => 0.6 * old + 0.4 * ratio,
            None => ratio,
        };
        self.speedup = Some(averaged);
        self.judged += 1;
        let clearly_losing = ratio < self.config.floor_at_once_below;
        if self.judged < self.config.judge_after && !clearly_losing {
            return;
        }
        let failing = if self.affordable_loss > 0.0 {
            let budget = -self.affordable_loss;
            self.recent_gain < budget || (self.request_gain < budget && self.recent_gain < 0.0)
        } else {
            averaged < self.config.keep_above || clearly_losing
        };
        if failing {
            self.failed_probe_loss = self.probe_loss.max(0.0);
            // Where probes are cheap, the next request is probed at its
            // start (a first backoff later where the shadow credit is spent)
            // and the rules above bound each probe, so the doubling backoff alone
            // decides when this answer is probed again (its long runs often
            // come after losing first rounds). So too where the next probe
            // is a shadow: it costs one draft, which the shadow credit holds
            // to the budget, and real rounds come back only where a shadow
            // showed they would pay. Otherwise, where a round is dear, the
            // backoff also keeps the probes' share of the time to the budget:
            // a fresh process's first rounds (kernels still loading) made a
            // GPU's rounds look dear and kept an answer that then paid 3x
            // from any probe for the rest of its tokens (docs/dflash.md,
            // "A failed probe's backoff where the next probe is a shadow").
            let budgeted = if self.probe_is_cheap() || self.shadows_apply() {
                0
            } else {
                (self.failed_probe_loss / self.config.probe_budget).ceil() as usize
            };
            let backoff = self.backoff.max(budgeted).min(self.config.max_backoff);
            self.state = GateState::Floored;
            self.floored_left = backoff;
            self.backoff = (backoff * 2).min(self.config.max_backoff);
        } else if averaged >= self.config.keep_above {
            self.backoff = self.config.first_backoff; // the probe paid
            self.probe_loss = 0.0;
        }
    }

    fn enter_speculation(&mut self) {
        self.shadow_due = false;
        let warmed = self
            .calibrations
            .get(&self.thermal)
            .is_some_and(|c| c.warmed);
        self.state = GateState::WarmingUp;
        self.warmup_left = if warmed { 0 } else { self.config.warmup_rounds };
        self.speedup = None;
        self.judged = 0;
        self.probe_loss = 0.0;
        self.recent_gain = 0.0;
        self.request_gain = 0.0;
        if self.warmup_left == 0 {
            self.state = GateState::Speculating;
        }
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "gate_replay_tests.rs"]
mod replay_tests;
