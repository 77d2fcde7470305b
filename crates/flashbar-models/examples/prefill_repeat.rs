//! Whether a prefill gives the same bits twice, and where it first does not
//! (docs/gpu.md, "Same prompt, same answer").
//!
//!     prefill_repeat MODEL LEN [RUNS]
//!
//! Runs the forward over the same LEN-token prompt RUNS times (default 3),
//! each from a fresh cache, tapping every layer's output, and prints for
//! each later run the first layer whose output differs from the first
//! run's (with how many of its positions differ), or that every layer and
//! the logits are the same bits; and on stderr, each run's time (every
//! layer tapped, so a little over a plain prefill's).

use flashbar_models::{Model, Outputs};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use std::path::Path;

fn main() {
    if let Err(message) = run() {
        eprintln!("prefill_repeat: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(len)) = (
        args.first(),
        args.get(1).and_then(|a| a.parse::<i32>().ok()),
    ) else {
        return Err("usage: prefill_repeat MODEL LEN [RUNS]".into());
    };
    let runs = args
        .get(2)
        .and_then(|a| a.parse::<usize>().ok())
        .unwrap_or(3);
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let model = Model::load(Path::new(dir)).map_err(|e| text(&e))?;
    let layers = model.config().text.num_hidden_layers;
    let hidden = model.config().text.hidden_size as i32;
    let taps: Vec<usize> = (0..layers).collect();
    let vocab = (model.config().text.vocab_size as i32 - 5).clamp(1, 3000);
    let ids: Vec<i32> = (0..len).map(|i| 5 + (i * 7919) % vocab).collect();
    let prompt = Array::from_slice(&ids, &[1, len]);
    let once = || -> Result<(Array, Array), String> {
        let mut cache = model.new_cache();
        let out = model
            .forward(&prompt, &mut cache, Outputs::LAST.tapping(&taps))
            .map_err(|e| text(&e))?;
        let tapped = out.taps.ok_or("no taps came back")?;
        mlx_rs::transforms::eval([&tapped, &out.logits]).map_err(|e| text(&e))?;
        Ok((tapped, out.logits))
    };
    let timed = || -> Result<(Array, Array), String> {
        let started = std::time::Instant::now();
        let out = once()?;
        eprintln!(
            "prefill of {len} tokens: {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(out)
    };
    let (first_taps, first_logits) = timed()?;
    for run in 1..runs {
        let (taps_now, logits_now) = timed()?;
        let mut report = None;
        for layer in 0..layers as i32 {
            let cols = layer * hidden..(layer + 1) * hidden;
            let (a, b) = (
                first_taps.index((.., .., cols.clone())),
                taps_now.index((.., .., cols)),
            );
            let differing = a
                .ne(&b)
                .and_then(|d| d.any_axes(&[0, 2], false))
                .and_then(|d| d.as_dtype(mlx_rs::Dtype::Int32))
                .and_then(|d| d.sum(None))
                .map_err(|e| text(&e))?
                .item_exact::<i32>();
            if differing > 0 {
                report = Some(format!(
                    "layer {layer} differs first ({differing} of {len} positions)"
                ));
                break;
            }
        }
        let logits_same = first_logits.eq_values(&logits_now).map_err(|e| text(&e))?;
        match report {
            Some(line) => println!("run {}: {line}; logits the same: {logits_same}", run + 1),
            None => println!(
                "run {}: every layer's output the same bits; logits the same: {logits_same}",
                run + 1
            ),
        }
    }
    Ok(())
}
