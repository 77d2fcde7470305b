//! Per-layer hidden states and logits of a prefill and forced decode steps,
//! to compare with mlx-lm layer by layer (docs/cpu.md, "Parity with mlx-lm").
//!
//!     dump_layers MODEL OUT.safetensors PROMPT_IDS [STEP_IDS]
//!
//! Ids are comma-separated; each step feeds the next of STEP_IDS.

use flashbar_models::{Model, Outputs};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use std::collections::HashMap;
use std::path::Path;

fn ids(arg: Option<&String>) -> Vec<i32> {
    arg.map(|s| {
        s.split(',')
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().unwrap())
            .collect()
    })
    .unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::load(Path::new(&args[1])).unwrap();
    let prompt = ids(args.get(3));
    let steps = ids(args.get(4));
    let layers = model.config().text.num_hidden_layers;
    let taps: Vec<usize> = (0..layers).collect();
    let mut cache = model.new_cache();
    let mut out: HashMap<String, Array> = HashMap::new();
    let mut run = |name: &str, tokens: &[i32], cache: &mut _| {
        let x = Array::from_slice(tokens, &[1, tokens.len() as i32]);
        let f = model
            .forward(&x, cache, Outputs::ALL.tapping(&taps))
            .unwrap();
        let t = f.taps.unwrap();
        let hidden = t.shape()[2] / layers as i32;
        for i in 0..layers as i32 {
            let h = t
                .index((0, .., i * hidden..(i + 1) * hidden))
                .as_dtype(Dtype::Float32)
                .unwrap();
            out.insert(format!("{name}_layer{i}"), h);
        }
        out.insert(
            format!("{name}_logits"),
            f.logits.index(0).as_dtype(Dtype::Float32).unwrap(),
        );
    };
    run("prefill", &prompt, &mut cache);
    for (s, &t) in steps.iter().enumerate() {
        run(&format!("step{s}"), &[t], &mut cache);
    }
    Array::save_safetensors(out, None, &args[2]).unwrap();
}
