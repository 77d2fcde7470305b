//! Qwen3.5 dense and Qwen3.5/3.6 MoE hybrid targets on mlx-rs.
//!
//! - [`config`]: `config.json` (HF or MLX, with quantization overrides);
//! - [`checkpoint`]: safetensors headers, checked before loading, and names;
//! - [`spec`]: the tensors a config requires, with shapes and dtypes;
//! - [`nn`]: layers (Gated DeltaNet, gated attention, MLP, MoE, linear maps);
//! - [`qwen3_5`], [`qwen3_5_moe`]: the architectures, with their caches; two
//!   entry points, [`Model::forward`] (the [`Outputs`] asked for: logits at
//!   every position or the last, taps for a drafter) and [`Model::verify`]
//!   (with the tape that [`Model::rollback`] replays); checkpoint quirks are
//!   fixed by one `sanitize` for headers and arrays alike (`sanitize.rs`);
//! - [`dflash`], [`dflash_config`]: the DFlash drafter and its fit to a target.

pub mod checkpoint;
pub mod config;
pub mod dflash;
pub mod dflash_config;
pub mod error;
pub mod nn;
pub mod qwen3_5;
pub mod qwen3_5_moe;
mod sanitize;
pub mod spec;

pub use dflash::{DraftCache, Drafter};
pub use dflash_config::DrafterConfig;
pub use error::{ModelError, Result};
pub use qwen3_5::{Forward, LayerCache, Model, Outputs, Tape, Verified};
