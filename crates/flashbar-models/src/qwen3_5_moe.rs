//! Qwen3.5 / Qwen3.6 MoE (mlx-lm `models/qwen3_5_moe.py`): the hybrid
//! decoder of `qwen3_5.rs` with sparse MoE blocks. HF checkpoints fuse the
//! experts' gate and up projections (`experts.gate_up_proj [E, 2I, H]`);
//! MLX keeps them apart under `switch_mlp`. This file names the split;
//! `sanitize.rs` applies it to headers and arrays alike.

const GATE_UP: &str = ".experts.gate_up_proj";
const DOWN: &str = ".experts.down_proj";

/// An HF expert tensor and the MLX names it becomes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Experts {
    /// The fused projection: split in halves along its rows, gate first.
    GateUp { gate: String, up: String },
    /// The down projection, renamed.
    Down(String),
}

/// What an HF expert tensor becomes; None for every other name.
pub(crate) fn experts(name: &str) -> Option<Experts> {
    if let Some(prefix) = name.strip_suffix(GATE_UP) {
        return Some(Experts::GateUp {
            gate: format!("{prefix}.switch_mlp.gate_proj.weight"),
            up: format!("{prefix}.switch_mlp.up_proj.weight"),
        });
    }
    name.strip_suffix(DOWN)
        .map(|prefix| Experts::Down(format!("{prefix}.switch_mlp.down_proj.weight")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_expert_names_map_to_mlx_ones() {
        assert_eq!(
            experts("model.layers.3.mlp.experts.gate_up_proj"),
            Some(Experts::GateUp {
                gate: "model.layers.3.mlp.switch_mlp.gate_proj.weight".into(),
                up: "model.layers.3.mlp.switch_mlp.up_proj.weight".into(),
            })
        );
        assert_eq!(
            experts("model.layers.3.mlp.experts.down_proj"),
            Some(Experts::Down(
                "model.layers.3.mlp.switch_mlp.down_proj.weight".into()
            ))
        );
        assert_eq!(experts("model.layers.3.mlp.gate.weight"), None);
    }
}
