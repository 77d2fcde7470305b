//! The engine: a loaded model and tokenizer, and the decoding loop.

use crate::chat_template;
use crate::decoding::{Control, Decoding};
use crate::error::{mlx_error, EngineError, Result};
use crate::policy::gate::{Gate, GateConfig};
use crate::policy::thermal::{system_source, ThermalSource};
use crate::proposer::{DflashProposer, Proposer};
use crate::reasoning;
use crate::request::{GenerateRequest, Prompt, Speculation};
use crate::sink::{Generation, Sink};
use crate::tokenizer::TextTokenizer;
use flashbar_mlx::memory_guard;
use flashbar_models::{Drafter, Model};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub struct Engine {
    model: Model,
    drafter: Option<Drafter>,
    tokenizer: TextTokenizer,
    gate: Mutex<Gate>,
    thermal: Mutex<Box<dyn ThermalSource>>,
    /// DFlash rounds draft and verify whole blocks near the end of an
    /// answer too (`decoding::Decoding::whole_blocks`): on where decode and
    /// verify run on the row-invariant GPU kernels.
    whole_blocks: AtomicBool,
    /// The adaptive block starts at half the drafter's block
    /// (`decoding::Decoding::half_first_block`): on where a verify costs in
    /// proportion to its rows (the CPU).
    half_first_block: AtomicBool,
}

impl Engine {
    /// Loads a target checkpoint folder and optionally its DFlash drafter
    /// (both validated before allocating; a drafter that does not fit the
    /// target is refused with the reason), on this thread's device, which it
    /// activates first (`flashbar_mlx::device::activate`: Metal, CUDA or the
    /// CPU, or `FLASHBAR_DEVICE`). A pair that does not fit in this machine's
    /// memory budget is refused before any weight is read, and MLX's memory
    /// limit is set to that budget.
    pub fn load(target_dir: &Path, drafter_dir: Option<&Path>) -> Result<Self> {
        let started = std::time::Instant::now();
        let loaded = Self::load_pair(target_dir, drafter_dir);
        match &loaded {
            Ok(_) => tracing::info!(
                target = %target_dir.display(),
                drafter = %drafter_dir.map_or("none".into(), |d| d.display().to_string()),
                ms = started.elapsed().as_millis() as u64,
                "model loaded"
            ),
            // The caller reports the error (the CLI's one line): info here.
            Err(error) => {
                tracing::info!(target = %target_dir.display(), %error, "model not loaded")
            }
        }
        loaded
    }

    fn load_pair(target_dir: &Path, drafter_dir: Option<&Path>) -> Result<Self> {
        flashbar_mlx::device::activate().map_err(|e| EngineError::Device(e.to_string()))?;
        let budget = flashbar_mlx::memory::budget();
        memory_guard::admit(target_dir, drafter_dir, &budget).map_err(EngineError::Memory)?;
        memory_guard::apply_limit(&budget).map_err(EngineError::Memory)?;
        let model = Model::load(target_dir)?;
        let drafter = match drafter_dir {
            Some(dir) => Some(Drafter::load(dir, &model).map_err(EngineError::Drafter)?),
            None => None,
        };
        let tokenizer = TextTokenizer::load(target_dir)?;
        let vocab = model.config().text.vocab_size;
        if tokenizer.vocab_size() > vocab {
            return Err(EngineError::Tokenizer(format!(
                "the tokenizer has {} tokens but the model only {vocab}",
                tokenizer.vocab_size()
            )));
        }
        Ok(Engine {
            model,
            drafter,
            tokenizer,
            gate: Mutex::new(Gate::new(GateConfig::default())),
            thermal: Mutex::new(system_source()),
            whole_blocks: AtomicBool::new(flashbar_models::nn::linear::row_kernels()),
            half_first_block: AtomicBool::new(!flashbar_mlx::device::current().is_gpu()),
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn drafter(&self) -> Option<&Drafter> {
        self.drafter.as_ref()
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// Longest sequence (prompt + completion) the model takes.
    pub fn context_length(&self) -> usize {
        self.model.config().text.max_position_embeddings
    }

    /// Token ids of a prompt, through the chat template for messages.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        self.prompt_ids_with(prompt, &chat_template::TemplateArgs::default())
    }

    /// Token ids of a prompt, with tools and keyword arguments for the template.
    pub fn prompt_ids_with(
        &self,
        prompt: &Prompt,
        args: &chat_template::TemplateArgs,
    ) -> Result<Vec<u32>> {
        self.tokenizer.encode(&self.prompt_text(prompt, args)?)
    }

    /// A prompt's text: as given, or the chat template's rendering.
    pub fn prompt_text(
        &self,
        prompt: &Prompt,
        args: &chat_template::TemplateArgs,
    ) -> Result<String> {
        Ok(match prompt {
            Prompt::Text(text) => text.clone(),
            Prompt::Messages(messages) => {
                let template = self.tokenizer.chat_template().ok_or_else(|| {
                    EngineError::InvalidRequest("this model has no chat template".into())
                })?;
                let mut args = args.clone();
                for (key, value) in self.tokenizer.template_defaults() {
                    args.kwargs
                        .entry(key.clone())
                        .or_insert_with(|| value.clone());
                }
                chat_template::render_chat(template, &args.input(messages, true))?
            }
        })
    }

    /// Generates `request` into `sink`, which may stop it at any token.
    pub fn generate(&self, request: &GenerateRequest, sink: &mut dyn Sink) -> Result<Generation> {
        match (request.speculation, &self.drafter) {
            (Speculation::Off, _) | (Speculation::Auto, None) => {
                self.generate_with(request, None, sink)
            }
            (_, Some(drafter)) => {
                self.generate_with(request, Some(&mut DflashProposer::new(drafter)), sink)
            }
            (Speculation::Dflash, None) => Err(EngineError::param(
                "speculation",
                "speculation \"dflash\" needs a drafter, and none is loaded",
            )),
        }
    }

    /// The decoding loop with any [`Proposer`] (the DFlash drafter, or a
    /// test's proposer with known drafts): plain steps only for speculation
    /// "off" (or no proposer), DFlash every round for "dflash", and as the
    /// speedup gate decides for "auto".
    pub fn generate_with(
        &self,
        request: &GenerateRequest,
        proposer: Option<&mut dyn Proposer>,
        sink: &mut dyn Sink,
    ) -> Result<Generation> {
        let (prompt, max_tokens, thinking) = self.prepare(request)?;
        // One generation at a time per engine: the gate's measurements
        // belong to this model on this machine.
        let mut gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        let mut thermal = self.thermal.lock().unwrap_or_else(|e| e.into_inner());
        let control = match request.speculation {
            Speculation::Off => Control::Plain,
            Speculation::Dflash => Control::Forced(&mut gate),
            Speculation::Auto => Control::Gated(&mut gate),
        };
        let generation = Decoding {
            model: &self.model,
            tokenizer: &self.tokenizer,
            proposer,
            control,
            thermal: thermal.as_mut(),
            block_size: request.block_size,
            whole_blocks: self.whole_blocks.load(Ordering::Relaxed),
            half_first_block: self.half_first_block.load(Ordering::Relaxed),
            thinking,
        }
        .generate(&prompt, max_tokens, request, sink);
        // A step queued ahead and then dropped (a stop or a cancel) still
        // runs on the device; wait for it, so the engine is idle for real
        // when this returns.
        flashbar_mlx::synchronize().map_err(mlx_error)?;
        log_generation(request, &generation);
        if let Ok(generation) = &generation {
            sink.finish(generation);
        }
        generation
    }

    /// Whether DFlash rounds keep one width (the block size) to the end of
    /// an answer, committing only the tokens the budget allows, rather than
    /// cutting the last block to what is left. On by default on the GPU,
    /// where a new width costs a one-time build (docs/gpu.md, "One verify
    /// width") and a wide verify costs what a narrow one does; off on the
    /// CPU, where each verified token costs time. Lossless either way.
    pub fn set_whole_blocks(&self, on: bool) {
        self.whole_blocks.store(on, Ordering::Relaxed);
    }

    /// Whether an answer's adaptive block starts at half the drafter's block
    /// rather than a whole one. On by default on the CPU, where a verify
    /// costs in proportion to its rows and an answer's first rounds often
    /// accept little (docs/acceptance.md, "Fixed blocks of 16 against the
    /// adapted block size, on the CPU"); off on a GPU, where a wide verify
    /// costs what a narrow one does. Lossless either way.
    pub fn set_half_first_block(&self, on: bool) {
        self.half_first_block.store(on, Ordering::Relaxed);
    }

    /// Replaces where the thermal state is read from (tests script it).
    pub fn set_thermal_source(&self, source: Box<dyn ThermalSource>) {
        *self.thermal.lock().unwrap_or_else(|e| e.into_inner()) = source;
    }

    /// The speedup gate's view: state, thermal state, warm plain step time
    /// and the averaged realized speedup.
    pub fn gate_snapshot(&self) -> Gate {
        self.gate.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the speedup gate, measurements and all (tests put it in a
    /// chosen state through its own observations).
    pub fn set_gate(&self, gate: Gate) {
        *self.gate.lock().unwrap_or_else(|e| e.into_inner()) = gate;
    }

    /// Checks a request, templating and tokenizing its prompt (the one
    /// place this happens): its prompt ids, the tokens it may generate, and
    /// for a chat whether its output starts inside a think block (read off
    /// the rendered prompt: `reasoning::starts_inside`).
    fn prepare(&self, request: &GenerateRequest) -> Result<(Vec<u32>, usize, Option<bool>)> {
        request.sampling.validate()?;
        if request.block_size == Some(0) {
            return Err(EngineError::param(
                "block_size",
                "block_size must be at least 1",
            ));
        }
        if request.max_tokens == 0 {
            return Err(EngineError::param(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        let text = self.prompt_text(&request.prompt, &request.template)?;
        let thinking = match request.prompt {
            Prompt::Text(_) => None,
            Prompt::Messages(_) => Some(reasoning::starts_inside(&text)),
        };
        let prompt = self.tokenizer.encode(&text)?;
        let field = match request.prompt {
            Prompt::Text(_) => "prompt",
            Prompt::Messages(_) => "messages",
        };
        let context = self.context_length();
        if prompt.is_empty() {
            return Err(EngineError::param(field, "the prompt is empty"));
        }
        if prompt.len() >= context {
            return Err(EngineError::param(
                field,
                format!(
                    "the prompt has {} tokens; the model's context is {context}",
                    prompt.len()
                ),
            ));
        }
        let max_tokens = request.max_tokens.min(context - prompt.len());
        Ok((prompt, max_tokens, thinking))
    }
}

/// A generation's summary in the log: counts and speeds, never its text.
fn log_generation(request: &GenerateRequest, generation: &Result<Generation>) {
    match generation {
        Ok(g) => tracing::debug!(
            speculation = ?request.speculation,
            mode = ?g.stats.mode,
            prompt_tokens = g.stats.prompt_tokens,
            completion_tokens = g.stats.completion_tokens,
            accepted = g.stats.accepted_tokens,
            tokens_per_second = g.stats.tokens_per_second,
            finish = ?g.finish_reason,
            "generation done"
        ),
        Err(error) => tracing::debug!(%error, "generation failed"),
    }
}
