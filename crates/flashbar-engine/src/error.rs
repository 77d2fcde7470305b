//! Errors of the engine, each readable as one line.

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] flashbar_models::ModelError),
    #[error("drafter: {0}")]
    Drafter(flashbar_models::ModelError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The pair does not fit in memory (needed vs available).
    #[error("{0}")]
    Memory(String),
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
