//! What can go wrong in the engine, for a request (an input, its parameters, the model's run,
//! the server's limits) or at start (options, the model's files, threads). The API layer maps
//! each to its HTTP status, in one place.

use super::params::ParamsError;
use crate::input::InputError;
use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// An input that cannot be used (the input layer's reasons).
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error("The server is at its limit of {0} concurrent requests; retry later")]
    Overloaded(usize),
    #[error("model execution failed: {0}")]
    Model(String),
    #[error("the engine has stopped")]
    Stopped,
    #[error("the engine cannot serve: {0}")]
    Dead(&'static str),
    #[error("This request's output would be {floats} floats ({tokens} tokens × {width}), over the server's limit of {max} (--max-output-floats). Please send fewer or shorter inputs.")]
    OutputTooLarge { floats: usize, tokens: usize, width: usize, max: usize },
    /// At start: engine options that cannot work (a zero where a count must be positive).
    #[error("{0}")]
    Options(String),
    /// At start: the model could not be loaded.
    #[error(transparent)]
    Load(Arc<crate::loader::LoadError>),
    /// At start: the engine's threads could not be started.
    #[error("cannot start the engine's threads: {0}")]
    Threads(Arc<std::io::Error>),
    /// At start: the model's files cannot serve one of its inputs (a framing token missing
    /// from the vocabulary, a page prompt that does not tokenize as its processor writes it).
    #[error("{0}")]
    Setup(String),
}
