//! Errors of the engine, each readable as one line. The server maps them
//! to OpenAI error objects (a bad request 400, a full queue 429, the rest
//! 500); the app and the CLI show the line.

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
    /// A bad value in one field of the request, named as the OpenAI API
    /// names it (`messages`, `prompt`, `speculation`, ...).
    #[error("invalid request: {message}")]
    InvalidParam {
        param: &'static str,
        message: String,
    },
    /// No usable compute device (`FLASHBAR_DEVICE` names one this build lacks).
    #[error("{0}")]
    Device(String),
    /// The pair does not fit in memory (needed vs available).
    #[error("{0}")]
    Memory(String),
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// The worker's queue holds `capacity` requests already.
    #[error("the engine is busy ({capacity} requests queued); retry later")]
    QueueFull { capacity: usize },
    /// The worker's thread has ended (its model was replaced or freed).
    #[error("the engine has stopped")]
    Stopped,
    /// A generation panicked on the engine thread; the worker goes on.
    #[error("the engine panicked on this request")]
    Panicked,
    /// Loading the model again after an idle unload failed.
    #[error("reloading the model failed: {0}")]
    Reload(String),
}

impl EngineError {
    pub(crate) fn param(param: &'static str, message: impl Into<String>) -> Self {
        EngineError::InvalidParam {
            param,
            message: message.into(),
        }
    }
}

/// Any failure reported by MLX outside an `Exception` (a synchronize, a
/// host read) as the engine's error.
pub(crate) fn mlx_error(error: impl std::fmt::Display) -> EngineError {
    EngineError::Mlx(mlx_rs::error::Exception::custom(error.to_string()))
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
