//! What happens after the backbone: the task a request asks for, its validated parameters,
//! the pooling method that turns token states into one vector (or keeps them all), and the
//! task heads built from the model's files.

pub mod classifier;
pub mod config;
pub mod head;
pub mod method;
pub mod sparse;
pub mod task;

pub use method::PoolingType;
pub use task::Task;
