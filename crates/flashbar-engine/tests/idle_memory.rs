//! When a generation returns, none of its work is left on the device: a
//! plain run queues the next step before it reads the current token, and a
//! run stopped there (a cancel, a client hanging up) drops that step while
//! it still computes, holding its buffers. The engine waits for it, so MLX's
//! active memory is back at the idle floor the moment `generate` returns
//! (docs/reliability.md, "Load"). Its own test binary: MLX's memory
//! counters are per process, and no other test may run beside this one.

use flashbar_engine::*;
use mlx_rs::memory::active_memory;
use std::path::PathBuf;

/// Stops the run at its second token: the first plain step's, read
/// after the step that follows it was queued.
struct StopAtSecondToken(usize);

impl Sink for StopAtSecondToken {
    fn commit(&mut self, commit: &Commit) -> bool {
        self.0 += usize::from(commit.token.is_some());
        self.0 < 2
    }
}

fn cancelled_run(engine: &Engine, prompt: &str) -> Generation {
    let mut request = GenerateRequest::new(Prompt::Text(prompt.into()));
    request.max_tokens = 32;
    request.speculation = Speculation::Off;
    engine
        .generate(&request, &mut StopAtSecondToken(0))
        .unwrap()
}

#[test]
fn a_cancelled_generation_leaves_nothing_in_flight() {
    // The embedded target: a step takes milliseconds on the CPU, so a step
    // still running would be read long before it ends.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    let engine = Engine::load(&root.join("target"), None).unwrap();
    let prompts = ["def fib(n):", "import os", "class Point:"];
    for prompt in prompts {
        cancelled_run(&engine, prompt); // one-time allocations
    }
    let floor = active_memory().unwrap();
    for round in 0..3 {
        for prompt in prompts {
            let run = cancelled_run(&engine, prompt);
            // Prefill's token and the first step's; the third was queued.
            assert_eq!(run.finish_reason, FinishReason::Cancelled);
            assert_eq!(run.token_ids.len(), 2, "{:?}", run.token_ids);
            assert_eq!(
                active_memory().unwrap(),
                floor,
                "round {round}, {prompt:?}: MLX still holds buffers after generate returned"
            );
        }
    }
}
