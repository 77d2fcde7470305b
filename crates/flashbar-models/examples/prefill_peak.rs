//! Memory a prefill takes beyond the weights, by prompt length
//! (docs/gpu.md, "Left to do": the peak that grows with the prompt).
//!
//!     prefill_peak MODEL [--stepwise] LEN [LEN ...]
//!
//! For each length: one forward over that many tokens, evaluated, then MLX's
//! peak memory above what the loaded model held. `--stepwise` evaluates the
//! cache's arrays one at a time first, printing the peak after each, so the
//! layer whose graph holds the memory shows where the peak jumps.
//! First it prints the load's own peak: the checkpoint's arrays read alone,
//! then the whole load (maps stacked, pairs made) over what it keeps.

use flashbar_models::{qwen3_5::cache_arrays, Model, Outputs};
use mlx_rs::memory::{active_memory, peak_memory, reset_peak_memory};
use mlx_rs::Array;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: prefill_peak MODEL [--stepwise] LEN [LEN ...]");
        std::process::exit(2);
    };
    let fail = |e: flashbar_models::ModelError| -> ! {
        eprintln!("prefill_peak: {e}");
        std::process::exit(1);
    };
    let mb = |bytes: usize| bytes as f64 / 1e6;
    let (_, checkpoint) = Model::check(Path::new(dir)).unwrap_or_else(|e| fail(e));
    let read = checkpoint.load().unwrap_or_else(|e| fail(e));
    println!(
        "checkpoint read: {:.1} MB held, peak {:.1} MB",
        mb(active_memory().unwrap()),
        mb(peak_memory().unwrap())
    );
    drop(read);
    mlx_rs::memory::clear_cache().unwrap();
    reset_peak_memory().unwrap();
    let model = Model::load(Path::new(dir)).unwrap_or_else(|e| fail(e));
    println!(
        "model loaded: {:.1} MB held, peak {:.1} MB",
        mb(active_memory().unwrap()),
        mb(peak_memory().unwrap())
    );
    let stepwise = args.iter().any(|a| a == "--stepwise");
    let base = active_memory().unwrap();
    for len in args[1..].iter().filter_map(|a| a.parse::<i32>().ok()) {
        let ids: Vec<i32> = (0..len).map(|i| 5 + (i * 7919) % 3000).collect();
        let mut cache = model.new_cache();
        reset_peak_memory().unwrap();
        let out = model
            .forward(
                &Array::from_slice(&ids, &[1, len]),
                &mut cache,
                Outputs::LAST,
            )
            .unwrap();
        let arrays = cache_arrays(&cache);
        if stepwise {
            for (i, a) in arrays.iter().enumerate() {
                mlx_rs::transforms::eval([*a]).unwrap();
                let peak = mb(peak_memory().unwrap() - base);
                println!("  cache array {i} {:?}: peak {peak:.1} MB", a.shape());
            }
        }
        mlx_rs::transforms::eval(arrays.into_iter().chain([&out.logits])).unwrap();
        let (peak, after) = (
            peak_memory().unwrap() - base,
            active_memory().unwrap() - base,
        );
        println!(
            "{len} tokens: peak {:.1} MB over the model's {:.1} MB, {:.1} MB held after",
            mb(peak),
            mb(base),
            mb(after)
        );
    }
}
