//! poolserve: an inference server for pooling models (embeddings first; classification,
//! scoring and token tasks plug into the same engine).
//!
//! Layers, in the order a request travels: [`api`] (HTTP) → [`pooling::params`] (validation)
//! → [`engine`] (tokenization, batching, the model thread) → [`models`] (backbones) →
//! [`pooling`] (methods and heads). [`loader`] builds everything model-specific at startup.
//! [`pooler::Pooler`] is the in-process library API over the same engine.

pub mod api;
pub mod batch;
pub mod config;
pub mod engine;
pub mod loader;
pub mod metrics;
pub mod models;
pub mod pooler;
pub mod pooling;
pub mod server;
