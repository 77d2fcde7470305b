//! Errors of loading and running a model, each readable as one line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Not `#[source]`: the message already ends with the OS error, and a
    /// printer that walks the source chain (anyhow's `{:#}`) would say it
    /// twice.
    #[error("cannot read {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: invalid config: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("unsupported model_type {0:?} (supported: qwen3_5, qwen3_5_moe)")]
    UnknownModelType(String),
    #[error("{path}: not a valid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("{dir}: no weights (expected model.safetensors or model.safetensors.index.json)")]
    NoWeights { dir: PathBuf },
    #[error("checkpoint is missing tensor {0}")]
    MissingTensor(String),
    #[error("checkpoint has unexpected tensor {0}")]
    UnexpectedTensor(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor {name} has dtype {found}, expected {expected}")]
    Dtype {
        name: String,
        found: String,
        expected: &'static str,
    },
    #[error("{dir}: this drafter does not fit the target: {reason}")]
    Incompatible { dir: PathBuf, reason: String },
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

impl From<mlx_rs::error::IoError> for ModelError {
    fn from(error: mlx_rs::error::IoError) -> Self {
        ModelError::Mlx(mlx_rs::error::Exception::custom(error.to_string()))
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
