//! What happens after the backbone: the task a request asks for, the pooling method that turns
//! token states into one vector (or keeps them all), the task heads built from the model's
//! files, and [`heads::Heads`], which runs them over a batch's hidden states into one
//! [`PoolingOutput`] per sequence; BGE-M3's sparse and ColBERT heads (`m3`).

pub mod classifier;
pub mod config;
pub mod head;
pub mod heads;
pub mod m3;
pub mod method;
pub mod output;
pub mod sparse;
pub mod task;

pub use method::PoolingType;
pub use output::{PoolingOutput, TaskOutput};
pub use task::Task;
