//! Qwen3.5 / Qwen3.6 MoE (mlx-lm `models/qwen3_5_moe.py`): the hybrid
//! decoder of `qwen3_5.rs` with sparse MoE blocks. HF checkpoints fuse the
//! experts' gate and up projections (`experts.gate_up_proj [E, 2I, H]`);
//! MLX keeps them apart under `switch_mlp`.

use crate::error::Result;
use crate::spec::Header;
use mlx_rs::ops::split_equal;
use mlx_rs::Array;
use std::collections::{BTreeMap, HashMap};

const GATE_UP: &str = ".experts.gate_up_proj";
const DOWN: &str = ".experts.down_proj";

fn fused_prefixes<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    names
        .filter_map(|name| name.strip_suffix(GATE_UP).map(str::to_owned))
        .collect()
}

pub(crate) fn split_fused_expert_headers(headers: &mut BTreeMap<String, Header>) {
    for prefix in fused_prefixes(headers.keys()) {
        let fused = headers
            .remove(&format!("{prefix}{GATE_UP}"))
            .expect("listed above");
        let mut half = fused.clone();
        if let Some(rows) = half.shape.iter_mut().rev().nth(1) {
            *rows /= 2;
        }
        headers.insert(
            format!("{prefix}.switch_mlp.gate_proj.weight"),
            half.clone(),
        );
        headers.insert(format!("{prefix}.switch_mlp.up_proj.weight"), half);
        if let Some(down) = headers.remove(&format!("{prefix}{DOWN}")) {
            headers.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
        }
    }
}

pub(crate) fn split_fused_experts(arrays: &mut HashMap<String, Array>) -> Result<()> {
    for prefix in fused_prefixes(arrays.keys()) {
        let fused = arrays
            .remove(&format!("{prefix}{GATE_UP}"))
            .expect("listed above");
        let halves = split_equal(&fused, 2, -2)?;
        arrays.insert(
            format!("{prefix}.switch_mlp.gate_proj.weight"),
            halves[0].clone(),
        );
        arrays.insert(
            format!("{prefix}.switch_mlp.up_proj.weight"),
            halves[1].clone(),
        );
        if let Some(down) = arrays.remove(&format!("{prefix}{DOWN}")) {
            arrays.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
        }
    }
    Ok(())
}
