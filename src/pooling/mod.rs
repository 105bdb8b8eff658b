//! What happens after the backbone: the task a request asks for, the pooling method that turns
//! token states into one vector (or keeps them all), the task heads built from the model's
//! files, and [`head_runner::HeadRunner`], which runs them over a batch's hidden states into one
//! [`PoolingOutput`] per sequence; BGE-M3's sparse and ColBERT heads (`m3`); a causal LM's next-token
//! label probabilities (`next_token`, vLLM's `/generative_scoring`).

pub mod classifier;
pub mod config;
pub mod embedding_head;
pub mod head_runner;
pub mod instruction;
pub mod m3;
pub mod method;
pub mod next_token;
pub mod output;
pub mod sparse;
pub mod task;

pub use method::PoolingType;
pub use output::{PoolingOutput, TaskOutput};
pub use task::Task;

/// What the pooling layer refuses or fails at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolingError {
    /// A `--pooler-config` that vLLM refuses, or whose fields contradict each other.
    #[error("{0}")]
    Config(String),
    /// A task the model has no head (or no pooling) for.
    #[error("{0}")]
    MissingHead(String),
    /// A head's computation failed (candle's message, first line).
    #[error("{0}")]
    Compute(String),
}

impl From<candle_core::Error> for PoolingError {
    fn from(e: candle_core::Error) -> Self {
        PoolingError::Compute(crate::models::describe(&e))
    }
}
