//! Building blocks of the hybrid models, each a small module over mlx-rs ops.

pub mod attention;
pub mod attention_host;
pub mod fused;
pub mod gated_delta;
pub mod gated_delta_checks;
pub mod gated_delta_chunked;
pub mod gated_delta_head;
pub mod gated_delta_host;
pub mod host;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod rope;
#[cfg(test)]
mod test_values;
