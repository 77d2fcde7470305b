//! The decoding loop: plain steps and DFlash draft-verify rounds ("the
//! draft-verify loop" in docs/dflash.md), mixed as the speedup gate decides. Lossless: every
//! committed token is the target's own choice at its position (argmax, or
//! the position-keyed sample), so the output equals plain decoding's.

use crate::choose::{choose_all, choose_last, host_u32, Pending};
use crate::emit::Emitter;
use crate::error::Result;
use crate::policy::block_size::BlockSizePolicy;
use crate::policy::gate::{Gate, GateState, Plan};
use crate::policy::thermal::ThermalSource;
use crate::proposer::Proposer;
use crate::reasoning::ReasoningSplitter;
use crate::request::GenerateRequest;
use crate::sampling::SamplingParams;
use crate::sink::{per_second, Begin, FinishReason, Generation, Mode, RoundStats, Sink, Totals};
use crate::tokenizer::TextTokenizer;
use flashbar_models::nn::host;
use flashbar_models::qwen3_5::{cache_arrays, pipeline_layers};
use flashbar_models::{LayerCache, Model, Outputs};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::async_eval;
use mlx_rs::Array;
use std::time::Instant;

/// `1` waits for each round's drafts before the verify is built, as rounds
/// did before they queued them (`draft_ms` then times the drafter alone);
/// benchmarks compare the two.
pub const DRAFT_SYNC_ENV: &str = "FLASHBAR_DRAFT_SYNC";

fn draft_sync() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(DRAFT_SYNC_ENV).as_deref() == Ok("1"))
}

/// Who decides between plain steps and DFlash rounds.
pub(crate) enum Control<'a> {
    /// Plain decoding only.
    Plain,
    /// DFlash every round (the gate still measures, for the stats).
    Forced(&'a mut Gate),
    /// The gate decides.
    Gated(&'a mut Gate),
}

pub(crate) struct Decoding<'a, 'p> {
    pub model: &'a Model,
    pub tokenizer: &'a TextTokenizer,
    pub proposer: Option<&'a mut (dyn Proposer + 'p)>,
    pub control: Control<'a>,
    pub thermal: &'a mut dyn ThermalSource,
    /// A fixed block size (the request's), else adaptive.
    pub block_size: Option<usize>,
    /// Draft and verify whole blocks even when fewer tokens are left to
    /// generate, committing only those: on a GPU a verify of 16 tokens costs
    /// what one of 3 does, but each new width costs a plan or a kernel build
    /// the first time (docs/gpu.md, "One verify width"). Lossless because
    /// the verify is causal and row-invariant: its first positions do not
    /// depend on the ones after them.
    pub whole_blocks: bool,
    /// The adaptive block starts at half the drafter's block instead of a
    /// whole one (`Engine::set_half_first_block`).
    pub half_first_block: bool,
    /// Chat prompts: whether the output starts inside a think block
    /// (`reasoning::starts_inside`); None for a text prompt, whose output
    /// is all answer.
    pub thinking: Option<bool>,
}

/// One generation's state between rounds.
struct Run<'t> {
    cache: Vec<LayerCache>,
    emitter: Emitter<'t>,
    /// The newest committed token, not yet fed to the target.
    last: u32,
    generated: usize,
    finish: Option<FinishReason>,
    /// Tap rows of committed positions the proposer has not seen yet.
    context: Vec<Array>,
    rounds: usize,
    dflash_rounds: usize,
    accepted: usize,
    rejected: usize,
    prompt_len: usize,
    max_tokens: usize,
    /// When the last timed step or round was measured. Each one's time runs
    /// from there, so what happens between two of them (emitting tokens, the
    /// sink, the loop) is charged to the next, as the user's clock charges
    /// it: plain steps, pipelined and each followed by its own emit, looked
    /// a third faster to the gate than plain decoding ran when that was
    /// left out (docs/acceptance.md, "The gate, live").
    mark: Instant,
}

impl Decoding<'_, '_> {
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Generation> {
        let started = Instant::now();
        let mut run = Run {
            cache: self.model.new_cache(),
            emitter: Emitter::new(
                self.tokenizer,
                request.stop.clone(),
                self.thinking.map(ReasoningSplitter::new),
            ),
            last: 0,
            generated: 0,
            finish: None,
            context: Vec::new(),
            rounds: 0,
            dflash_rounds: 0,
            accepted: 0,
            rejected: 0,
            prompt_len: prompt.len(),
            max_tokens,
            mark: started,
        };
        if let Control::Gated(gate) = &mut self.control {
            gate.begin_request(max_tokens);
        }
        let mut blocks = self.proposer.as_ref().map(|p| match self.half_first_block {
            true => BlockSizePolicy::starting_at(p.max_block_size(), p.max_block_size() / 2),
            false => BlockSizePolicy::new(p.max_block_size()),
        });
        let go_on = sink.begin(&Begin {
            prompt_tokens: prompt.len(),
        });
        if !go_on {
            return Ok(Generation {
                text: String::new(),
                reasoning: String::new(),
                token_ids: Vec::new(),
                finish_reason: FinishReason::Cancelled,
                stats: Totals {
                    prompt_tokens: prompt.len(),
                    ..Totals::default()
                },
            });
        }
        // Prefill (with taps); its token is the first plain step.
        let input = Array::from_slice(prompt, &[1, prompt.len() as i32]);
        let first = self.step(&mut run, &input, &request.sampling, prompt.len())?;
        // Not a decode step: its time is the prefill's, which the gate must not learn.
        self.commit_plain(&mut run, first.resolve()?, Some(started), false, sink)?;
        let first_token_at = Instant::now();
        run.mark = first_token_at;

        while run.finish.is_none() && run.generated < max_tokens {
            match self.plan() {
                Plan::Plain(steps) => self.plain_steps(&mut run, steps, request, sink)?,
                Plan::Dflash => {
                    let block = match (&self.block_size, &blocks) {
                        (Some(fixed), _) => *fixed,
                        (None, Some(policy)) => policy.next(),
                        (None, None) => 2,
                    };
                    let (accepted, drafted) =
                        self.round(&mut run, block, &request.sampling, sink)?;
                    if let Some(policy) = &mut blocks {
                        policy.observe(accepted, drafted);
                    }
                }
                Plan::Shadow => {
                    // As wide as a round may be (the adaptive block may have
                    // shrunk below the break-even in a losing stretch).
                    let block = self.block_size.unwrap_or(usize::MAX);
                    if let Some((matched, drafted)) = self.shadow(&mut run, block, request, sink)? {
                        if let Some(policy) = &mut blocks {
                            policy.observe(matched, drafted);
                        }
                    }
                }
            }
        }
        let finish = run.finish.unwrap_or(FinishReason::Length);
        if finish != FinishReason::Stop {
            run.emitter.flush(sink)?;
        }
        let decode_seconds = first_token_at.elapsed().as_secs_f64();
        let completion = run.emitter.ids.len();
        Ok(Generation {
            stats: Totals {
                mode: Some(if run.dflash_rounds > 0 {
                    Mode::Dflash
                } else {
                    Mode::Plain
                }),
                prompt_tokens: prompt.len(),
                completion_tokens: completion,
                reasoning_tokens: run.emitter.reasoning_tokens,
                rounds: run.rounds,
                accepted_tokens: run.accepted,
                rejected_tokens: run.rejected,
                mean_accept_len: run.generated as f64 / run.rounds.max(1) as f64,
                prompt_seconds: (first_token_at - started).as_secs_f64(),
                decode_seconds,
                tokens_per_second: if completion > 1 && decode_seconds > 0.0 {
                    (completion - 1) as f64 / decode_seconds
                } else {
                    0.0
                },
            },
            text: run.emitter.text,
            reasoning: run.emitter.reasoning,
            token_ids: run.emitter.ids,
            finish_reason: finish,
        })
    }

    fn plan(&mut self) -> Plan {
        let thermal = self.thermal.state();
        match (&mut self.control, &self.proposer) {
            (Control::Plain, _) | (_, None) => Plan::Plain(usize::MAX),
            (Control::Forced(gate), Some(_)) => {
                gate.set_thermal(thermal);
                Plan::Dflash
            }
            (Control::Gated(gate), Some(_)) => {
                gate.set_thermal(thermal);
                gate.plan()
            }
        }
    }

    fn gate(&mut self) -> Option<&mut Gate> {
        match &mut self.control {
            Control::Plain => None,
            Control::Forced(gate) | Control::Gated(gate) => Some(gate),
        }
    }

    fn taps(&self) -> Vec<usize> {
        self.proposer
            .as_ref()
            .map_or_else(Vec::new, |p| p.tap_layers().to_vec())
    }

    /// Feeds `input` to the target (keeping its taps for the proposer) and
    /// chooses the token after it, at absolute `position`.
    fn step(
        &self,
        run: &mut Run,
        input: &Array,
        sampling: &SamplingParams,
        position: usize,
    ) -> Result<Pending> {
        let taps = self.taps();
        let out = self
            .model
            .forward(input, &mut run.cache, Outputs::LAST.tapping(&taps))?;
        if let Some(tapped) = out.taps {
            run.context.push(tapped);
        }
        choose_last(&out.logits, sampling, position as u64)
    }

    /// Up to `steps` plain steps, the next one queued on the device before
    /// the current token is read back (greedy), as plain decoding does.
    fn plain_steps(
        &mut self,
        run: &mut Run,
        steps: usize,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<()> {
        let sampling = &request.sampling;
        // The token chosen after feeding generated token i sits at
        // position prompt_len + i + 1.
        let position = |run: &Run| run.prompt_len + run.generated;
        let last = Array::from_slice(&[run.last], &[1, 1]);
        let mut pending = self.step(run, &last, sampling, position(run))?;
        let calibrating = self.gate().map(|g| g.state()) == Some(GateState::Calibrating);
        for i in 0..steps {
            let more = i + 1 < steps && run.generated + 1 < run.max_tokens;
            let queued = match (&pending, more) {
                (Pending::Device(token), true) => {
                    let next = position(run) + 1; // `token` is not committed yet
                    Some(self.step(run, &token.reshape(&[1, 1])?, sampling, next)?)
                }
                _ => None,
            };
            let host = matches!(pending, Pending::Host(_));
            let token = pending.resolve()?;
            let representative = Gate::learns_plain_step(i, queued.is_some(), host);
            self.commit_plain(run, token, None, representative, sink)?;
            if run.finish.is_some() || run.generated >= run.max_tokens {
                break;
            }
            // Calibration asks for two steps more than it needs (a device
            // batch's first and last are not learned); where it is done and
            // nothing is queued, the rest of the batch is the gate's again.
            let calibrated = self.gate().map(|g| g.state()) != Some(GateState::Calibrating);
            if calibrating && calibrated && queued.is_none() {
                break;
            }
            pending = match queued {
                Some(next) => next,
                None if i + 1 < steps => {
                    let input = Array::from_slice(&[token], &[1, 1]);
                    self.step(run, &input, sampling, position(run))?
                }
                None => break,
            };
        }
        Ok(())
    }

    /// A shadow probe (docs/dflash.md, "Shadow probes"): the drafts a round
    /// here would verify, compared with the plain steps that follow; the gate
    /// learns what the round would have committed and what the draft cost.
    /// It drafts up to the gate's break-even (a round committing that many
    /// pays for itself; a longer run need not be seen), and the plain steps
    /// that cover those drafts are steps plain decoding takes anyway, so a
    /// shadow costs its draft alone. Its drafts can differ from a whole
    /// block's (the drafter reads its block both ways), which only makes
    /// the estimate rougher: output tokens are plain decoding's either way.
    /// Returns (drafts matched, drafts compared), or None where no draft
    /// fits (one plain step instead).
    fn shadow(
        &mut self,
        run: &mut Run,
        block: usize,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Option<(usize, usize)>> {
        let model = self.model;
        let left = run.max_tokens - run.generated;
        let break_even = self.gate().and_then(|g| g.shadow_break_even());
        let Some(proposer) = self.proposer.as_mut() else {
            return Ok(None);
        };
        // Drafts up to the break-even (a round committing that many paid
        // for itself; a longer run need not be seen), so the draft is no
        // wider than it must be; where rounds keep one width (GPUs, where a
        // new width costs a build), the round's whole block, compared only
        // that far.
        let needed = break_even.map_or(usize::MAX, |n| n.saturating_sub(1).max(1));
        let block = block.clamp(1, proposer.max_block_size());
        let drafts_wanted = match self.whole_blocks {
            true if left > 1 => block - 1,
            _ => (block.min(left) - 1).min(needed),
        };
        if drafts_wanted == 0 || run.context.is_empty() {
            // No room for a draft before the answer ends: plain steps, the
            // shadow still due for when there is.
            self.plain_steps(run, 1, request, sink)?;
            return Ok(None);
        }
        let clock = Instant::now();
        let context = join_positions(&run.context.iter().collect::<Vec<_>>())?;
        run.context.clear();
        let d = proposer.propose(model, run.last, &context, drafts_wanted, run.generated)?;
        let drafts = host_u32(&d)?;
        let draft_ms = ms_since(clock);
        // The next plain step is timed from here: the draft is not its cost.
        run.mark = Instant::now();
        let compare = drafts.len().min(needed).min(left - 1);
        let from = run.emitter.ids.len();
        self.plain_steps(run, compare, request, sink)?;
        let matched = drafts
            .iter()
            .zip(&run.emitter.ids[from..])
            .take_while(|(d, t)| d == t)
            .count();
        if let Some(gate) = self.gate() {
            gate.observe_shadow(matched + 1, draft_ms);
        }
        tracing::debug!(matched, drafted = drafts.len(), draft_ms, "shadow probe");
        Ok(Some((matched, compare)))
    }

    /// Commits a plain step's token. A decode step (`untimed_since` None)
    /// is timed from `run.mark`, and the gate learns from it when
    /// `representative`; the prefill's token is timed from `untimed_since`
    /// (its time is the prefill's, which the gate must not learn).
    fn commit_plain(
        &mut self,
        run: &mut Run,
        token: u32,
        untimed_since: Option<Instant>,
        representative: bool,
        sink: &mut dyn Sink,
    ) -> Result<()> {
        let now = Instant::now();
        let ms = (now - untimed_since.unwrap_or(run.mark)).as_secs_f64() * 1e3;
        let timed_step = untimed_since.is_none() && representative;
        if untimed_since.is_none() {
            run.mark = now;
        }
        run.finish = run.emitter.commit(token, false, sink)?;
        run.generated += 1;
        run.rounds += 1;
        run.last = token;
        let thermal = self.thermal.state();
        let gate = self.gate().map(|gate| {
            if timed_step {
                gate.observe_ar(ms);
            }
            gate.state()
        });
        let go_on = sink.round(&RoundStats {
            mode: Mode::Plain,
            block_size: 1,
            accepted: 0,
            committed: 1,
            draft_ms: 0.0,
            verify_ms: ms,
            rollback_ms: 0.0,
            round_ms: ms,
            tokens_per_second: per_second(1, ms),
            speedup: None,
            gate,
            thermal,
        });
        stop_unless(run, go_on);
        Ok(())
    }

    /// One DFlash round with a block of up to `block` tokens (last + drafts).
    /// Returns (accepted, drafted).
    fn round(
        &mut self,
        run: &mut Run,
        block: usize,
        sampling: &SamplingParams,
        sink: &mut dyn Sink,
    ) -> Result<(usize, usize)> {
        let model = self.model;
        let taps = self.taps();
        let proposer = self.proposer.as_mut().expect("a round needs a proposer");
        let block = block.clamp(1, proposer.max_block_size());
        let round_start = Instant::now();
        // 1. Draft from [last, mask...] with the context not seen yet.
        let left = run.max_tokens - run.generated;
        let drafts_wanted = if self.whole_blocks {
            block
        } else {
            block.min(left)
        } - 1;
        let drafts = if drafts_wanted > 0 && !run.context.is_empty() {
            let context = join_positions(&run.context.iter().collect::<Vec<_>>())?;
            run.context.clear();
            let d = proposer.propose(model, run.last, &context, drafts_wanted, run.generated)?;
            // Queued, not waited for: the device drafts while the host builds
            // the verify, which reads the drafts on the device (docs/dflash.md,
            // "One wait a round"). `draft_ms` is then the time to queue it.
            if draft_sync() {
                d.eval()?;
            } else {
                async_eval([&d])?;
            }
            Some(d)
        } else {
            None
        };
        let draft_ms = ms_since(round_start);

        // 2. Verify [last, drafts] in one forward, recording the tape.
        let clock = Instant::now();
        let last = Array::from_slice(&[run.last], &[1, 1]);
        let input = match &drafts {
            Some(d) => join_positions(&[&last, d])?,
            None => last,
        };
        let verified = model.verify(&input, &mut run.cache, &taps)?;
        let chosen = choose_all(&verified.logits, sampling, run.prompt_len + run.generated)?;
        let mut drafted = match &drafts {
            Some(d) => host_u32(d)?,
            None => Vec::new(),
        };
        // Drafts past the budget (whole_blocks) are never committed: the
        // round counts only those that could be.
        drafted.truncate(left - 1);
        let verify_ms = ms_since(clock);

        // 3. The longest agreeing prefix, plus the target's own next token;
        // 4. committed one by one, so EOS / stop / max_tokens cut the block.
        let accepted = drafted
            .iter()
            .zip(&chosen)
            .take_while(|(d, c)| d == c)
            .count();
        let mut committed = 0;
        for (i, &token) in chosen[..=accepted].iter().enumerate() {
            run.finish = run.emitter.commit(token, i < accepted, sink)?;
            committed += 1;
            run.generated += 1;
            if run.finish.is_some() || run.generated >= run.max_tokens {
                break;
            }
        }
        run.last = chosen[accepted];

        // 5. Keep [last, accepted drafts]; the proposer sees only their taps.
        let clock = Instant::now();
        model.rollback(&mut run.cache, &verified.tape, accepted + 1)?;
        if pipeline_layers() > 0 {
            async_eval(cache_arrays(&run.cache))?;
        }
        if let Some(tapped) = &verified.taps {
            let kept = accepted + 1;
            run.context.push(match host::prefix_ready(tapped, kept) {
                Some(prefix) => prefix,
                None => tapped.index((.., ..kept as i32)),
            });
        }
        let rollback_ms = ms_since(clock);

        run.rounds += 1;
        run.dflash_rounds += 1;
        run.accepted += accepted;
        run.rejected += drafted.len() - accepted;
        let now = Instant::now();
        let round_ms = (now - run.mark).as_secs_f64() * 1e3;
        run.mark = now;
        let thermal = self.thermal.state();
        // Forced rounds are measured, not judged: judging them could floor
        // the gate with no plain steps to count its backoff down, so a later
        // "auto" request would start floored for what forced ones lost.
        let (speedup, gate) = match &mut self.control {
            Control::Gated(gate) => (gate.observe_round(committed, round_ms), Some(gate.state())),
            Control::Forced(gate) => (gate.realized(committed, round_ms), None),
            Control::Plain => (None, None),
        };
        let go_on = sink.round(&RoundStats {
            mode: Mode::Dflash,
            block_size: drafted.len() + 1,
            accepted,
            committed,
            draft_ms,
            verify_ms,
            rollback_ms,
            round_ms,
            tokens_per_second: per_second(committed, round_ms),
            speedup,
            gate,
            thermal,
        });
        stop_unless(run, go_on);
        Ok((accepted, drafted.len()))
    }
}

/// A sink that wants no more ends the run (unless it ended already).
fn stop_unless(run: &mut Run, go_on: bool) {
    if !go_on && run.finish.is_none() {
        run.finish = Some(FinishReason::Cancelled);
    }
}

fn ms_since(clock: Instant) -> f64 {
    clock.elapsed().as_secs_f64() * 1e3
}

/// `arrays` (`[1, n_i, ...]`) joined along the positions: on the host where
/// their values already are (`host::concatenate_ready`: no hand-over to
/// MLX's thread on the CPU), else by MLX.
fn join_positions(arrays: &[&Array]) -> Result<Array> {
    match host::concatenate_ready(arrays, 1) {
        Some(joined) => Ok(joined),
        None => Ok(concatenate(arrays, 1)?),
    }
}
